"""The Python side of the chat-template check: conversations rendered and tokenized here.

    python3 tools/train/chat_fixtures.py                # -> tests/fixtures/chat/rendered.json
    python3 tools/train/chat_fixtures.py --stdout       # the same JSON on stdout (the live check)

For each case: the messages, the tools offered (names from `tools.json`, or null), the prompt
text that jinja2 renders from the archive's `cqlm.chat_template` with `add_generation_prompt`
(what `cqlm serve` sends to the engine) and its token ids by the archive's tokenizer (Python
`tokenizers`), and the ids of the whole conversation as training rendered it (no generation
prompt; for the held-out cases, cut before an assistant turn), of which the prompt must be a
prefix. `tests/e2e/chat_template.rs` renders the same
cases with minijinja and the Rust tokenizer and compares. Needs jinja2 and tokenizers only.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_format  # noqa: E402
import demo_tools  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def archive_metadata(path: str) -> dict:
    """A safetensors file's `__metadata__` (read from its header: no tensor library needed)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})


def cases() -> list[dict]:
    held = chat_format.load_jsonl(os.path.join(HERE, "chat_heldout.jsonl"))
    names = [t["function"]["name"] for t in demo_tools.tools()]
    out = []
    # Held-out conversations cut before each assistant turn.
    for c in held[:24]:
        msgs = c["messages"]
        for j, m in enumerate(msgs):
            if m["role"] == "assistant":
                out.append({"messages": msgs[:j], "tools": c["tools"], "full": msgs})
    call = {"id": "call_9", "type": "function", "function": {"name": "calculate", "arguments": "{\"expression\":\"2 + 2\"}"}}
    call2 = {"id": "call_10", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Zürich\"}"}}
    extra = [
        [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi"}],
        [{"role": "developer", "content": "Be kind."}, {"role": "user", "content": "  spaces  and\nnew lines\n"}],
        [{"role": "user", "content": "Ünïcödé — “quotes” and emoji 🎉"}],
        [{"role": "user", "content": "two calls"}, {"role": "assistant", "content": None, "tool_calls": [call, call2]},
         {"role": "tool", "tool_call_id": "call_9", "content": "{\"result\":4}"},
         {"role": "tool", "tool_call_id": "call_10", "content": "{\"temperature\":3}"}],
        [{"role": "user", "content": "text with <tool_call> markers </tool_call> inside"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": ""}],
    ]
    for msgs in extra:
        out.append({"messages": msgs, "tools": names, "full": None})
        out.append({"messages": msgs, "tools": None, "full": None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archive", default=os.path.join(ROOT, "models", "cqlm-small.safetensors"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "chat", "rendered.json"))
    ap.add_argument("--stdout", action="store_true")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    meta = archive_metadata(args.archive)
    tok = Tokenizer.from_str(meta["cqlm.tokenizer"])
    cfg = json.loads(meta["cqlm.config"])
    bos, eos = tok.id_to_token(cfg["bos"]), tok.id_to_token(cfg["eos"])
    if meta.get("cqlm.chat_template") != chat_format.template_text():
        sys.exit(f"{args.archive}: its cqlm.chat_template is not {chat_format.TEMPLATE_PATH}")
    all_tools = demo_tools.tools()
    rows = []
    for c in cases():
        tools = chat_format.tool_defs(c["tools"], all_tools)
        text = chat_format.render(c["messages"], tools, True, bos, eos)
        full = c["full"] and chat_format.render(c["full"], tools, False, bos, eos)
        rows.append({"messages": c["messages"], "tools": c["tools"], "prompt": text,
                     "prompt_ids": tok.encode(text, add_special_tokens=False).ids,
                     "full_ids": full and tok.encode(full, add_special_tokens=False).ids})
    out = json.dumps({"bos": bos, "eos": eos, "cases": rows}, ensure_ascii=False, indent=0)
    if args.stdout:
        print(out)
        return
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(out + "\n")
    print(f"wrote {args.out}: {len(rows)} cases")


if __name__ == "__main__":
    main()
