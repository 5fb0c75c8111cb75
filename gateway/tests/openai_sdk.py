"""Drives the official OpenAI Python SDK, unchanged, against a waycast gateway.

Usage: python openai_sdk.py BASE_URL KEY
Prints one line per check and exits non-zero on the first failure.
"""
import sys

import openai

base_url, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)

chat = client.chat.completions.create(
    model="llama3", messages=[{"role": "user", "content": "Hello"}]
)
assert chat.choices[0].message.content.startswith("token0"), chat
assert chat.usage.completion_tokens == 5, chat.usage
print("chat completion ok")

chunks = list(
    client.chat.completions.create(
        model="mistral-7b",
        messages=[{"role": "user", "content": "Hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
)
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert text.startswith("token0") and "token4" in text, text
assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5, chunks[-1]
print("streamed chat completion with usage ok")

ids = sorted(model.id for model in client.models.list())
assert ids == sorted(["llama-3.1-8b", "llama3", "mistral-7b", "embed-small"]), ids
print("models.list ok")

try:
    openai.OpenAI(base_url=base_url, api_key="wc_wrong", max_retries=0).models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError as error:
    assert error.status_code == 401 and error.code == "invalid_api_key", error
print("authentication error ok")

try:
    client.chat.completions.create(model="gpt-9", messages=[])
    raise AssertionError("an unknown model was accepted")
except openai.NotFoundError as error:
    assert error.code == "model_not_found", error
print("unknown model error ok")

transcript = client.audio.transcriptions.create(model="llama3", file=("hello.wav", b"RIFF\x00\x00\x00\x00WAVEfmt "))
assert transcript.text == "mock transcript", transcript
translation = client.audio.translations.create(model="llama3", file=("hello.wav", b"RIFF\x00\x00WAVE"))
assert translation.text == "mock transcript", translation
print("audio transcription and translation ok")

speech = client.audio.speech.create(model="llama3", voice="alloy", input="hello")
assert speech.read().startswith(b"ID3"), speech
image = client.images.generate(model="llama3", prompt="a cat", size="256x256")
assert image.data[0].b64_json, image
print("speech and images ok")
