"""Drives the official Anthropic and OpenAI Python SDKs, unchanged, through
the gateway's translation: the Anthropic SDK on a chat-only backend
(`chat-only`), the OpenAI SDK on an Anthropic-format one (`claude`).

Usage: python dialect_sdks.py GATEWAY_URL KEY
Prints one line per check and exits non-zero on the first failure.
"""
import json
import sys

import anthropic
import openai

base_url, key = sys.argv[1], sys.argv[2]
claude = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0)
gpt = openai.OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0)
bash = {
    "name": "Bash",
    "description": "runs a command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}
ask = [{"role": "user", "content": "list the files"}]

message = claude.messages.create(model="chat-only", max_tokens=64, system="be brief", messages=ask)
assert message.content[0].type == "text" and message.content[0].text.startswith("token0"), message
assert message.stop_reason == "end_turn" and message.usage.output_tokens == 5, message
print("anthropic messages.create ok")

with claude.messages.stream(model="chat-only", max_tokens=64, messages=ask) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
assert text.startswith("token0") and "token4" in text, text
assert final.usage.output_tokens == 5 and final.stop_reason == "end_turn", final
print("anthropic messages.stream ok")

message = claude.messages.create(model="chat-only", max_tokens=64, messages=ask, tools=[bash])
call = message.content[0]
assert message.stop_reason == "tool_use" and call.type == "tool_use", message
assert call.name == "Bash" and call.input == {"command": "mock"}, call
with claude.messages.stream(model="chat-only", max_tokens=64, messages=ask, tools=[bash]) as stream:
    final = stream.get_final_message()
assert final.stop_reason == "tool_use" and final.content[0].input == {"command": "mock"}, final
turn = ask + [
    {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": "Bash", "input": call.input}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a.txt"}]},
]
answer = claude.messages.create(model="chat-only", max_tokens=64, messages=turn, tools=[bash])
assert answer.content[0].type == "text", answer
print("anthropic tool round trip ok")

count = claude.messages.count_tokens(model="chat-only", messages=ask)
assert count.input_tokens > 0, count
print("anthropic count_tokens ok")

try:
    claude.messages.create(model="chat-only", max_tokens=8, messages=ask,
                           tools=[{"type": "web_search_20250305", "name": "web_search"}])
    raise AssertionError("an untranslatable field was accepted")
except anthropic.BadRequestError as error:
    assert "tools[0]" in error.message, error
print("anthropic untranslatable error ok")

chat = gpt.chat.completions.create(model="claude", messages=ask)
assert chat.choices[0].message.content.startswith("token0"), chat
assert chat.usage.completion_tokens == 5, chat.usage
print("openai chat on messages ok")

chunks = list(gpt.chat.completions.create(model="claude", messages=ask, stream=True,
                                          stream_options={"include_usage": True}))
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert text.startswith("token0") and "token4" in text, text
assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5, chunks[-1]
print("openai streamed chat on messages ok")

lookup = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
chat = gpt.chat.completions.create(model="claude", messages=ask, tools=[lookup])
calls = chat.choices[0].message.tool_calls
assert chat.choices[0].finish_reason == "tool_calls" and calls[0].function.name == "lookup", chat
assert json.loads(calls[0].function.arguments) == {"q": "mock"}, calls
arguments = ""
with gpt.chat.completions.stream(model="claude", messages=ask, tools=[lookup]) as stream:
    for event in stream:
        pass
    final = stream.get_final_completion()
call = final.choices[0].message.tool_calls[0]
assert json.loads(call.function.arguments) == {"q": "mock"}, final
print("openai tool calls on messages ok")
