"""The official `openai` client against a running `cqlm serve` (base URL and key
from argv): chat, completion, streaming with usage, structured output through
`chat.completions.parse`, tools (required, named, auto), and the errors it must
raise (`n=2`, a wrong key, a schema that can't compile). Exits non-zero on the
first failed check."""
import json
import sys

import openai
from openai import OpenAI
from pydantic import BaseModel, Field

base, key = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
MODEL = client.models.list().data[0].id
assert MODEL == "cqlm-small", MODEL

# Chat, greedy: streamed text equals the non-streamed text; usage when asked.
msgs = [{"role": "user", "content": "Tell me about the king."}]
full = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0)
assert full.choices[0].finish_reason in ("stop", "length"), full
assert full.usage.completion_tokens >= 1 and full.usage.prompt_tokens > 0
text = full.choices[0].message.content
parts, usage = [], None
for chunk in client.chat.completions.create(
    model=MODEL, messages=msgs, max_tokens=16, temperature=0, stream=True,
    stream_options={"include_usage": True},
):
    if chunk.choices:
        parts.append(chunk.choices[0].delta.content or "")
    if chunk.usage:
        usage = chunk.usage
assert "".join(parts) == text, ("".join(parts), text)
assert usage is not None and usage.completion_tokens == full.usage.completion_tokens

# Logprobs through the client's types: one entry per token, its text the
# answer's, top lists of the asked length, sorted, the greedy token first.
lp = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0,
                                    logprobs=True, top_logprobs=3)
entries = lp.choices[0].logprobs.content
assert lp.choices[0].message.content == text
assert "".join(e.token for e in entries) == text, entries
assert len(entries) == lp.usage.completion_tokens
for e in entries:
    tops = [t.logprob for t in e.top_logprobs]
    assert len(tops) == 3 and tops == sorted(tops, reverse=True), e
    assert e.top_logprobs[0].token == e.token and e.logprob <= 0, e
c = client.completions.create(model=MODEL, prompt="The king said", max_tokens=4, temperature=0, logprobs=2)
assert "".join(c.choices[0].logprobs.tokens) == c.choices[0].text, c

# Completions, streamed and not.
c = client.completions.create(model=MODEL, prompt="The king said", max_tokens=8, temperature=0)
s = "".join(ch.choices[0].text for ch in client.completions.create(
    model=MODEL, prompt="The king said", max_tokens=8, temperature=0, stream=True) if ch.choices)
assert c.choices[0].text == s, (c.choices[0].text, s)

# Structured output: a bounded schema through parse().
class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=99)

r = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "A person:"}],
                                  response_format=Person, max_tokens=60, temperature=0)
p = r.choices[0].message.parsed
assert isinstance(p, Person) and 0 <= p.age <= 99 and len(p.name) <= 12, r

# Tools: required, named, auto.
class Weather(BaseModel):
    city: str = Field(max_length=16)

tools = [openai.pydantic_function_tool(Weather, name="get_weather")]
for choice in ["required", {"type": "function", "function": {"name": "get_weather"}}]:
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather in Oslo?"}],
                                       tools=tools, tool_choice=choice, max_tokens=40, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    call = ch.message.tool_calls[0]
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert isinstance(args["city"], str) and len(args["city"]) <= 16, args
# Streamed tool call: deltas keyed by index.
names, args = {}, {}
for chunk in client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather?"}],
                                            tools=tools, tool_choice="required", max_tokens=40,
                                            temperature=0, stream=True):
    for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
        if tc.function.name:
            names[tc.index] = tc.function.name
        args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
assert names == {0: "get_weather"}, names
json.loads(args[0])
r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}],
                                   tools=tools, tool_choice="auto", max_tokens=12, temperature=0)
assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
# Streamed auto: the same output, text or call, as the non-streamed one.
text, calls = "", []
for chunk in client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}],
                                            tools=tools, tool_choice="auto", max_tokens=12,
                                            temperature=0, stream=True):
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
        calls += chunk.choices[0].delta.tool_calls or []
if r.choices[0].finish_reason == "tool_calls":
    assert calls and calls[0].function.name == r.choices[0].message.tool_calls[0].function.name
else:
    assert text == r.choices[0].message.content, (text, r.choices[0].message.content)

# Errors the client must raise.
try:
    client.chat.completions.create(model=MODEL, messages=msgs, n=2, max_tokens=2)
    raise SystemExit("n=2 was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400
try:
    client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2,
                                   response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}})
    raise SystemExit("a bad schema was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400
try:
    OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    raise SystemExit("a wrong key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401
print("openai client checks passed")
