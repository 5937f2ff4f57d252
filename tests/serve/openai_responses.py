"""The official `openai` client's Responses API against a running `cqlm serve`
(base URL and key from argv): a response and its stream (events in order,
sequence numbers from 0, deltas joined equal to the whole text), a function
tool round trip, a custom tool whose Lark grammar every sampled input parses
under (an independent validator, many seeds at temperature 1), named by
tool_choice or offered under required, auto and allowed_tools, text.format
json_schema, hosted tools left out and named, and the errors it must raise.
Exits non-zero on the first failed check."""
import json
import re
import sys

import openai
from openai import OpenAI

base, key = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
MODEL = "cqlm-small"

r = client.responses.create(model=MODEL, input="Tell me about the king.", max_output_tokens=16, temperature=0,
                            instructions="You are a storyteller.")
assert r.object == "response" and r.status in ("completed", "incomplete"), r
assert r.output[0].type == "message" and r.output_text, r
assert r.usage.input_tokens > 0 and r.usage.output_tokens >= 1, r.usage
if r.status == "incomplete":
    assert r.incomplete_details.reason == "max_output_tokens", r

events = list(client.responses.create(model=MODEL, input="Tell me about the king.", max_output_tokens=16,
                                      temperature=0, instructions="You are a storyteller.", stream=True))
kinds = [e.type for e in events]
assert [e.sequence_number for e in events] == list(range(len(events))), kinds
want = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
assert kinds[:4] == want, kinds
assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"], kinds
assert kinds[-1] == ("response.completed" if r.status == "completed" else "response.incomplete"), kinds
text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
assert text == r.output_text, (text, r.output_text)
assert events[-1].response.output_text == r.output_text

# A function tool: a call whose arguments hold to the schema, then its output.
tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                         "required": ["city", "days"], "additionalProperties": False}},
         {"type": "web_search"}]
msgs = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]}]
c = client.responses.create(model=MODEL, input=msgs, tools=tools, tool_choice="required", max_output_tokens=64,
                            temperature=0)
call = c.output[0]
assert call.type == "function_call" and call.name == "get_weather", c.output
args = json.loads(call.arguments)
assert set(args) == {"city", "days"} and isinstance(args["city"], str) and isinstance(args["days"], int), args
assert c.metadata.get("cqlm_skipped_tools") == "web_search", c.metadata
streamed = [e for e in client.responses.create(model=MODEL, input=msgs, tools=tools, tool_choice="required",
                                               max_output_tokens=64, temperature=0, stream=True)]
done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
assert len(done) == 1 and json.loads(done[0].arguments) == args, [e.type for e in streamed]
back = client.responses.create(model=MODEL, max_output_tokens=16, temperature=0, tools=tools, input=msgs + [
    {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
    {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C."},
])
assert back.usage.input_tokens > c.usage.input_tokens, (back.usage, c.usage)

# A custom tool with a Lark grammar: every input parses, at temperature 1.
GRAMMAR = r'''
start: "*** Begin Patch\n" hunk hunk? "*** End Patch"
hunk: "*** Update File: " PATH "\n" line line?
line: SIGN TEXT "\n"
SIGN: /[+ -]/
PATH: /[a-z]{1,10}\.py/
TEXT: /[a-z ]{0,16}/
'''
VALID = re.compile(r"\*\*\* Begin Patch\n(\*\*\* Update File: [a-z]{1,10}\.py\n([+ -][a-z ]{0,16}\n){1,2}){1,2}\*\*\* End Patch")
patch_tool = {"type": "custom", "name": "apply_patch", "description": "Apply a patch.",
              "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR}}
inputs = set()
for seed in range(8):
    p = client.responses.create(model=MODEL, input="Fix the bug in main.py.", tools=[patch_tool],
                                tool_choice={"type": "custom", "name": "apply_patch"}, temperature=1,
                                max_output_tokens=400, extra_body={"seed": seed})
    item = p.output[0]
    assert item.type == "custom_tool_call" and item.name == "apply_patch", p.output
    # The grammar is bounded: every input ends well within the limit, and parses.
    assert p.status == "completed", p
    inputs.add(item.input)
    assert VALID.fullmatch(item.input), repr(item.input)
assert len(inputs) > 1, "the seeds drew different patches"
streamed = list(client.responses.create(model=MODEL, input="Fix the bug in main.py.", tools=[patch_tool],
                                        tool_choice={"type": "custom", "name": "apply_patch"}, temperature=0,
                                        max_output_tokens=400, stream=True))
deltas = "".join(e.delta for e in streamed if e.type == "response.custom_tool_call_input.delta")
final = [e for e in streamed if e.type == "response.custom_tool_call_input.done"][0].input
assert deltas == final and VALID.fullmatch(final), repr(final)
# Offered under required and auto (beside a function tool): whichever tool is
# called, a patch call's input parses, at temperature 1 over many seeds.
note_tool = {"type": "custom", "name": "note", "description": "Write a note."}
weather = tools[0]
calls = {}
for choice in ["required", "auto"]:
    for seed in range(10):
        p = client.responses.create(model=MODEL, input="Fix the bug in main.py.", temperature=1,
                                    tools=[patch_tool, note_tool, weather], tool_choice=choice,
                                    max_output_tokens=200, extra_body={"seed": seed})
        if p.status != "completed":
            continue
        for item in p.output:
            if item.type == "custom_tool_call":
                calls[item.name] = calls.get(item.name, 0) + 1
                assert item.name in ("apply_patch", "note"), item
                if item.name == "apply_patch":
                    assert VALID.fullmatch(item.input), repr(item.input)
            elif item.type == "function_call":
                calls[item.name] = calls.get(item.name, 0) + 1
                assert set(json.loads(item.arguments)) <= {"city", "days"}, item
            else:
                assert choice == "auto" and item.type == "message", p.output
only_patch = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "custom", "name": "apply_patch"}]}
for seed in range(6):
    p = client.responses.create(model=MODEL, input="Fix the bug in main.py.", temperature=1,
                                tools=[patch_tool, note_tool, weather], tool_choice=only_patch,
                                max_output_tokens=200, extra_body={"seed": seed})
    assert p.status == "completed" and p.output[0].type == "custom_tool_call", p.output
    assert p.output[0].name == "apply_patch" and VALID.fullmatch(p.output[0].input), p.output
    calls["apply_patch"] = calls.get("apply_patch", 0) + 1
assert calls.get("apply_patch", 0) >= 6, calls
streamed = list(client.responses.create(model=MODEL, input="Fix the bug in main.py.", tools=[patch_tool, note_tool],
                                        tool_choice=only_patch, temperature=0, max_output_tokens=200, stream=True))
kinds = [e.type for e in streamed]
assert "response.custom_tool_call_input.done" in kinds, kinds
done = [e for e in streamed if e.type == "response.output_item.done"][0].item
assert done.type == "custom_tool_call" and VALID.fullmatch(done.input), done

# Its round trip: the call and its output in the input.
client.responses.create(model=MODEL, max_output_tokens=8, temperature=0, input=[
    {"role": "user", "content": "Fix the bug in main.py."},
    {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch", "input": final},
    {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done."},
])

# Logprobs of the output text, included on request.
lr = client.responses.create(model=MODEL, input="Tell me about the king.", max_output_tokens=8,
                             temperature=0, include=["message.output_text.logprobs"], top_logprobs=2)
part = lr.output[0].content[0]
assert "".join(l.token for l in part.logprobs) == part.text, part
assert all(len(l.top_logprobs) == 2 and l.top_logprobs[0].logprob >= l.top_logprobs[1].logprob
           for l in part.logprobs), part

# text.format json_schema: the text is JSON valid against the schema.
schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
j = client.responses.create(model=MODEL, input="A person, as JSON.", max_output_tokens=96, temperature=0,
                            text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
doc = json.loads(j.output_text)
assert set(doc) == {"name", "age"} and isinstance(doc["name"], str) and isinstance(doc["age"], int), doc

# Errors: stateful features, unknown fields, a wrong key.
for f, exc in [
    (lambda: client.responses.create(model=MODEL, input="x", previous_response_id="resp_1"), openai.BadRequestError),
    (lambda: client.responses.create(model=MODEL, input="x", extra_body={"frequency_penalty": 1}), openai.BadRequestError),
    (lambda: client.responses.create(model="gpt-9", input="x"), openai.NotFoundError),
    (lambda: OpenAI(base_url=base, api_key="wrong", max_retries=0).responses.create(model=MODEL, input="x"),
     openai.AuthenticationError),
]:
    try:
        f()
    except exc:
        pass
    else:
        raise AssertionError(f"expected {exc.__name__}")
print("ok")
