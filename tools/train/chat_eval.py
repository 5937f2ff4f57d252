"""Held-out chat evaluation of a cqlm chat model, through the engine (`evaluate.py chat`).

    python3 tools/train/evaluate.py chat --cqlm target/release/cqlm --backend cpu
    python3 tools/train/evaluate.py chat --cqlm target/release/cqlm --backend gpu --limit 40
    python3 tools/train/evaluate.py chat --server http://127.0.0.1:8080/v1 --limit 40   # openai client

Each held-out conversation (`chat_heldout.jsonl`) is cut before its last assistant turn and
the model answers it with the four tools offered and the tool-call constraint on (`auto`:
free text, or one call between `<tool_call>` markers), greedy. Then:

- a conversation that expects a tool scores **tool name** (the call names it) and **exact
  arguments** (the parsed arguments equal the expected object, numbers by value, strings
  exactly); then the expected call and its result are appended and the model answers again:
  **answer uses the result** when that answer contains the result's value (the temperature
  and condition, the converted value, the arithmetic result, the verse text);
- a conversation that needs no tool scores **no tool** when the answer has no call.

Drivers: `--cqlm` renders the prompt here (jinja2, `chat_template.jinja`) and runs
`cqlm generate --prompt ... --tools tools.json` (the built-in model unless `--model`), so the
Rust side tokenizes the Python-rendered text; `--server` sends the messages to `cqlm serve`
with the official `openai` client, so the server renders its archive's template, constrains
and parses the call. Needs only jinja2 (and openai for `--server`), not PyTorch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_format  # noqa: E402
import demo_tools  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def uses_result(name: str, result: dict, answer: str) -> bool:
    if name == "get_weather":
        return str(result["temperature"]) in answer and result["condition"] in answer.lower()
    if name == "convert_units":
        return str(result["value"]) in answer
    if name == "calculate":
        return str(result["result"]) in answer
    if name == "lookup_verse":
        return result["text"] in answer
    raise ValueError(name)


class Cli:
    """`cqlm generate` on a prompt rendered here."""

    def __init__(self, cqlm: str, backend: str, model: str | None):
        self.cmd = [cqlm, "generate", "--backend", backend, "--tools", demo_tools.TOOLS_PATH,
                    "--tool-choice", "auto", "--max-tokens", "96"] + (["--model", model] if model else [])

    def answer(self, messages: list[dict], tools: list) -> tuple[str, list[dict]]:
        prompt = chat_format.render(messages, tools, True)
        p = subprocess.run(self.cmd + ["--prompt", prompt], capture_output=True, text=True, timeout=600)
        if p.returncode not in (0, 3):
            raise SystemExit(f"cqlm generate failed ({p.returncode}): {p.stderr.strip()}")
        text = p.stdout[:-1] if p.stdout.endswith("\n") else p.stdout
        # With `auto` the whole output is free text or one call, as the engine parses it:
        # the end marker may also occur inside the call's strings, so no regex search.
        start, end = chat_format.MARKERS
        if text.startswith(start) and text.endswith(end):
            c = json.loads(text[len(start):-len(end)])
            return "", [{"name": c["name"], "arguments": c["arguments"]}]
        return text.strip(), []


class Server:
    """`cqlm serve` through the official client."""

    def __init__(self, url: str):
        import openai
        self.client = openai.OpenAI(base_url=url, api_key=os.environ.get("CQLM_API_KEY", "none"))
        self.model = self.client.models.list().data[0].id

    def answer(self, messages: list[dict], tools: list) -> tuple[str, list[dict]]:
        r = self.client.chat.completions.create(model=self.model, messages=messages, tools=tools, tool_choice="auto",
                                                temperature=0, max_tokens=96)
        m = r.choices[0].message
        calls = [{"name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in m.tool_calls or []]
        return (m.content or "").strip(), calls


def evaluate(driver, convs: list[dict], log) -> dict:
    tools_all = demo_tools.tools()
    n = {"tool": 0, "name": 0, "args": 0, "answer": 0, "none": 0, "no_call": 0}
    for i, c in enumerate(convs):
        msgs = c["messages"]
        exp = c["expect"]
        tools = chat_format.tool_defs(c["tools"], tools_all)
        cut = max(j for j, m in enumerate(msgs) if m["role"] == "user") + 1
        history = msgs[:cut]
        text, calls = driver.answer(history, tools)
        rec = {"i": i, "user": history[-1]["content"], "text": text, "calls": calls}
        # A call cut by the token limit is still a call (its text begins with the marker).
        started = bool(calls) or text.startswith("<tool_call>")
        if exp["tool"] is None:
            n["none"] += 1
            ok = not started
            n["no_call"] += ok
            rec["no_call"] = ok
        else:
            n["tool"] += 1
            got = calls[0] if calls else None
            name_ok = got is not None and got["name"] == exp["tool"]
            args_ok = name_ok and got["arguments"] == exp["arguments"]
            n["name"] += name_ok
            n["args"] += args_ok
            # The answer is judged after the expected call and result, whatever the model called.
            call = {"id": "call_1", "type": "function",
                    "function": {"name": exp["tool"], "arguments": json.dumps(exp["arguments"], separators=(",", ":"))}}
            follow = history + [{"role": "assistant", "content": "", "tool_calls": [call]},
                                {"role": "tool", "tool_call_id": "call_1", "content": demo_tools.result_json(exp["result"])}]
            answer, again = driver.answer(follow, tools)
            used = not again and not answer.startswith("<tool_call>") and uses_result(exp["tool"], exp["result"], answer)
            n["answer"] += used
            rec.update(expected=exp["arguments"], name_ok=name_ok, args_ok=args_ok, answer=answer, answer_ok=used)
        if log:
            log.write(json.dumps(rec, ensure_ascii=False) + "\n")
    pct = lambda a, b: round(100.0 * a / b, 1) if b else None  # noqa: E731
    return {"conversations": len(convs), "tool_conversations": n["tool"], "no_tool_conversations": n["none"],
            "tool_name_pct": pct(n["name"], n["tool"]), "exact_arguments_pct": pct(n["args"], n["tool"]),
            "no_tool_pct": pct(n["no_call"], n["none"]), "answer_uses_result_pct": pct(n["answer"], n["tool"]),
            "counts": n}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="evaluate.py chat", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heldout", default=os.path.join(HERE, "chat_heldout.jsonl"))
    ap.add_argument("--cqlm", help="the cqlm binary (drives `cqlm generate`)")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--model", help="archive (default: the built-in model)")
    ap.add_argument("--server", help="base URL of `cqlm serve` (drives the openai client)")
    ap.add_argument("--limit", type=int, help="the first N conversations only")
    ap.add_argument("--log", help="write one JSON line per conversation here")
    args = ap.parse_args(argv)
    if bool(args.cqlm) == bool(args.server):
        ap.error("give exactly one of --cqlm and --server")
    convs = chat_format.load_jsonl(args.heldout)[: args.limit]
    driver = Cli(args.cqlm, args.backend, args.model) if args.cqlm else Server(args.server)
    t = time.time()
    with open(args.log, "w", encoding="utf-8") if args.log else open(os.devnull, "w") as log:
        out = evaluate(driver, convs, log)
    out["driver"] = f"cqlm generate --backend {args.backend}" if args.cqlm else "cqlm serve + openai"
    out["seconds"] = round(time.time() - t, 1)
    print(json.dumps(out))
    return 0
