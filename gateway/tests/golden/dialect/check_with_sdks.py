#!/usr/bin/env python3
"""Reads every translated golden output with the official SDKs' own types.

An independent check of the dialect translation: each case's outputs
(`request.out.json`, `response.out.json`, `stream.out.sse`) are parsed with
the `anthropic` and `openai` packages' types, and each stream is assembled
with the SDK's own stream accumulator, the code a real client runs. A case
named `anthropic-*` is a Messages client on a chat backend (its request out
is OpenAI's, its answers Anthropic's); `openai-*` the reverse.

Skips (exit 0, saying so) when either package is missing; exits 1 on the
first case that does not parse. Run it with any Python that has both:

    python gateway/tests/golden/dialect/check_with_sdks.py
"""

import inspect
import json
import pathlib
import sys

try:
    import anthropic
    import openai
    import pydantic
except ImportError as missing:
    print(f"skipped: {missing.name} is not importable")
    sys.exit(0)

from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, MessageCreateParams, RawMessageStreamEvent
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.completion_create_params import CompletionCreateParams

ROOT = pathlib.Path(__file__).resolve().parent


def events(text):
    """(event name or None, data) of each SSE event."""
    for block in text.split("\n\n"):
        name, data = None, []
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[len("event:"):].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:"):].lstrip(" "))
        if data:
            yield name, "\n".join(data)


def check_anthropic_stream(text):
    adapter = pydantic.TypeAdapter(RawMessageStreamEvent)
    snapshot = None
    open_block = None
    names = []
    # Newer SDKs keep each tool input's raw JSON beside the snapshot.
    extra = {"json_bufs": {}} if "json_bufs" in inspect.signature(accumulate_event).parameters else {}
    for name, data in events(text):
        event = adapter.validate_python(json.loads(data))
        assert name == event.type, f"event line {name!r} names a {event.type} payload"
        names.append(event.type)
        if event.type == "error":
            raise AssertionError(f"an error event: {data}")
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, **extra)
        open_block = check_block_order(event, open_block, len(snapshot.content))
    assert open_block is None, "a block left open"
    assert names[0] == "message_start" and names[-1] == "message_stop", names
    message = Message.model_validate(snapshot.model_dump())
    for block in message.content:
        if block.type == "tool_use":
            assert isinstance(block.input, dict), block
    return message


def check_block_order(event, open_block, started):
    """The order Claude Code needs (the SDK's accumulator does not check
    it): each block started at the next index, stopped before the next
    starts, its deltas in between. Returns the index now open."""
    if event.type == "content_block_start":
        assert open_block is None, f"block {event.index} started while {open_block} is open"
        assert event.index == started - 1, f"block {event.index} started out of turn"
        return event.index
    if event.type == "content_block_delta":
        assert event.index == open_block, f"a delta for block {event.index} while {open_block} is open"
    if event.type == "content_block_stop":
        assert event.index == open_block, f"block {event.index} stopped while {open_block} is open"
        return None
    if event.type in ("message_delta", "message_stop"):
        assert open_block is None, f"{event.type} while block {open_block} is open"
    return open_block


def check_openai_stream(text):
    state = ChatCompletionStreamState()
    done = False
    for _, data in events(text):
        assert not done, "a chunk after [DONE]"
        if data == "[DONE]":
            done = True
            continue
        payload = json.loads(data)
        assert "error" not in payload, payload
        state.handle_chunk(ChatCompletionChunk.model_validate(payload))
    assert done, "no [DONE]"
    try:
        completion = state.get_final_completion()
    except openai.LengthFinishReasonError as stopped:
        # The SDK's parse helper refuses a cut answer, having read it whole.
        completion = stopped.completion
    for call in completion.choices[0].message.tool_calls or []:
        assert isinstance(json.loads(call.function.arguments), dict), call
    return completion


def block_facts(block):
    """What a content block says, whatever extra fields an SDK adds."""
    keys = ("type", "text", "thinking", "id", "name", "input")
    return {key: block[key] for key in keys if block.get(key) is not None}


def check_case(case):
    messages_client = case.name.startswith("anthropic-")
    request = json.loads((case / "request.out.json").read_text())
    # TypedDicts: the request keys and shapes the SDKs would send.
    params = CompletionCreateParams if messages_client else MessageCreateParams
    pydantic.TypeAdapter(params).validate_python(request)
    response = case / "response.out.json"
    if response.exists():
        (Message if messages_client else ChatCompletion).model_validate(json.loads(response.read_text()))
    stream = case / "stream.out.sse"
    if stream.exists():
        text = stream.read_text()
        final = check_anthropic_stream(text) if messages_client else check_openai_stream(text)
        if response.exists():
            # The stream and the whole answer of a case say the same.
            whole = json.loads(response.read_text())
            if messages_client:
                streamed = [block_facts(block.model_dump()) for block in final.content]
                assert streamed == [block_facts(block) for block in whole["content"]], case.name
                assert final.stop_reason == whole["stop_reason"], case.name
            else:
                assert final.choices[0].finish_reason == whole["choices"][0]["finish_reason"], case.name
                streamed, said = final.choices[0].message, whole["choices"][0]["message"]
                assert (streamed.content or None) == said["content"], case.name
                calls = [(c.id, c.function.name, json.loads(c.function.arguments)) for c in streamed.tool_calls or []]
                expected = [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                            for c in said.get("tool_calls", [])]
                assert calls == expected, case.name


def main():
    cases = sorted(path for path in ROOT.iterdir() if path.is_dir())
    failed = 0
    for case in cases:
        try:
            check_case(case)
            print(f"ok    {case.name}")
        except Exception as error:  # noqa: BLE001 - every failure is reported the same way
            failed += 1
            print(f"FAIL  {case.name}: {type(error).__name__}: {error}")
    print(f"anthropic {anthropic.__version__}, openai {openai.__version__}: {len(cases) - failed}/{len(cases)} cases")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
