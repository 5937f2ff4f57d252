"""The official `anthropic` client against a running `cqlm serve` (base URL and
key from argv): messages.create, messages.stream (text and a tool call),
count_tokens against the request's usage, stop sequences, a tool_use /
tool_result round trip, `thinking` accepted without thinking blocks, and the
errors it must raise (a wrong key, a model the server does not run, a field the
server does not implement). Exits non-zero on the first failed check."""
import sys

import anthropic
from anthropic import Anthropic

base, key = sys.argv[1], sys.argv[2]
client = Anthropic(base_url=base, api_key=key, max_retries=0, timeout=120)
MODEL = "cqlm-small"
# This client's `create` has no sampling parameters; the API still takes them.
T0 = {"temperature": 0}
msgs = [{"role": "user", "content": "Tell me about the king."}]
SYSTEM = "You are a storyteller."

# Greedy: the stream's text equals the whole message's; count_tokens equals usage.
m = client.messages.create(model=MODEL, max_tokens=16, extra_body=T0, system=SYSTEM, messages=msgs)
assert m.type == "message" and m.role == "assistant", m
assert m.stop_reason in ("end_turn", "max_tokens"), m
assert m.content[0].type == "text" and m.usage.output_tokens >= 1, m
count = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=msgs)
assert count.input_tokens == m.usage.input_tokens, (count, m.usage)
with client.messages.stream(model=MODEL, max_tokens=16, extra_body=T0, system=SYSTEM, messages=msgs) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
assert streamed == m.content[0].text, (streamed, m.content[0].text)
assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens, final

# A stop sequence from the middle of the greedy text ends the text before it.
long = client.messages.create(model=MODEL, max_tokens=32, extra_body=T0, messages=msgs)
text = long.content[0].text
stop = text[len(text) // 2 :][:3]
cut = client.messages.create(model=MODEL, max_tokens=32, extra_body=T0, messages=msgs, stop_sequences=[stop])
assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop, cut
assert cut.content[0].text == text[: text.index(stop)], (cut.content[0].text, text, stop)

# Tools: `any` forces a call whose input holds to the schema; streamed, the
# input comes as input_json_delta and the client assembles it.
tools = [{
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                     "required": ["city", "unit"]},
}]
t = client.messages.create(model=MODEL, max_tokens=64, extra_body=T0, messages=msgs, tools=tools,
                           tool_choice={"type": "any"})
assert t.stop_reason == "tool_use", t
call = next(b for b in t.content if b.type == "tool_use")
assert call.name == "get_weather" and isinstance(call.input["city"], str) and call.input["unit"] in ("C", "F"), call
with client.messages.stream(model=MODEL, max_tokens=64, extra_body=T0, messages=msgs, tools=tools,
                            tool_choice={"type": "tool", "name": "get_weather"}) as s:
    events = [e.type for e in s]
    streamed_call = s.get_final_message()
assert "input_json" in events, events
sc = streamed_call.content[0]
assert sc.type == "tool_use" and sc.input == call.input, (sc, call)
# The round trip: the call and its result in the history.
answer = client.messages.create(model=MODEL, max_tokens=16, extra_body=T0, tools=tools, messages=msgs + [
    {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C."}]},
])
assert answer.usage.input_tokens > t.usage.input_tokens, (answer.usage, t.usage)
assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use"), answer

# Structured output: output_config.format's schema holds.
import json
js = client.messages.create(model=MODEL, max_tokens=96, extra_body=T0, messages=msgs, output_config={
    "effort": "low",
    "format": {"type": "json_schema", "schema": {"type": "object", "properties": {"name": {"type": "string"},
               "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": False}}})
doc = json.loads(js.content[0].text)
assert set(doc) == {"name", "age"} and isinstance(doc["name"], str) and isinstance(doc["age"], int), doc

# `thinking` is accepted; the model has no thinking, so no thinking blocks come back.
th = client.messages.create(model=MODEL, max_tokens=16, extra_body={"temperature": 1}, messages=msgs,
                            thinking={"type": "enabled", "budget_tokens": 1024})
assert all(b.type != "thinking" for b in th.content), th

# Errors.
for call_, exc in [
    (lambda: Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(
        model=MODEL, max_tokens=4, messages=msgs), anthropic.AuthenticationError),
    (lambda: client.messages.create(model="claude-opus-9", max_tokens=4, messages=msgs), anthropic.NotFoundError),
    (lambda: client.messages.create(model=MODEL, max_tokens=4, messages=msgs, extra_body={"frequency_penalty": 1}),
     anthropic.BadRequestError),
]:
    try:
        call_()
    except exc as e:
        assert e.body["type"] == "error" and e.body["error"]["message"], e.body
    else:
        raise AssertionError(f"expected {exc.__name__}")
print("ok")
