"""A tool call through `cqlm serve` with the official `openai` client, end to end.

    cqlm serve &                                   # the built-in model on 127.0.0.1:8080
    python3 tools/train/tool_demo.py "What's the weather in Paris?"

Offers the four demo tools (`tools.json`), runs the call the model makes (`demo_tools.py`:
made-up weather, real conversions and arithmetic, a few real verses), sends the result back
and prints the model's answer. Needs only `openai` (and jinja2 is not needed here).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_tools  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("question")
    ap.add_argument("--server", default="http://127.0.0.1:8080/v1")
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.server, api_key=os.environ.get("CQLM_API_KEY", "none"))
    model = client.models.list().data[0].id
    tools = demo_tools.tools()
    messages = [{"role": "user", "content": args.question}]
    print(f"user: {args.question}")
    for _ in range(3):
        r = client.chat.completions.create(model=model, messages=messages, tools=tools, temperature=0, max_tokens=96)
        m = r.choices[0].message
        if not m.tool_calls:
            print(f"assistant: {m.content}")
            return
        messages.append({"role": "assistant", "content": m.content or "",
                         "tool_calls": [c.model_dump() for c in m.tool_calls]})
        for c in m.tool_calls:
            result = demo_tools.run(c.function.name, json.loads(c.function.arguments))
            print(f"assistant calls {c.function.name}({c.function.arguments})")
            print(f"tool: {demo_tools.result_json(result)}")
            messages.append({"role": "tool", "tool_call_id": c.id, "content": demo_tools.result_json(result)})
    print("(stopped after three rounds of tool calls)")


if __name__ == "__main__":
    main()
