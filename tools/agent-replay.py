#!/usr/bin/env python3
"""Replay a coding agent's multi-turn conversation with tool calls through
`/v1/responses` and `/v1/messages` and report the prompt cache's hit rate
(issue 48's target: the hit rate of a recorded agent conversation).

The conversation is recorded here in a neutral form: project instructions
(the first words of this repository's README, as an agent sends its AGENTS.md
or CLAUDE.md), four tools (read_file, search, run, and apply_patch: a function
each, and on the Responses route apply_patch is a `custom` tool with a Lark
grammar, as Codex CLI's), and seven assistant turns: tool calls whose results
are files of this repository, then a patch, then an answer. Each API gets it
in its own form (Responses `input` items: messages, function_call,
function_call_output, custom_tool_call, custom_tool_call_output; Messages
blocks: text, tool_use, tool_result). Every time the assistant speaks, the
history so far is sent (greedy, a short answer) and the recorded turn, not the
model's, goes into the history, as a replay of a recorded session does: so
what a request can reuse is the previous request's prompt.

Starts one `cqlm serve` (or uses --url), prints per request the prompt
tokens, the tokens the cache covered and the time to the answer, then per
route the hit rate (cached / prompt tokens, summed) and the prefill avoided.
Standard library only.

    tools/agent-replay.py [--bin target/release/cqlm] [--backend cpu] [--url http://...]
        [--answer 16] [extra serve args...]
"""
import argparse, http.client, json, os, re, subprocess, sys, time, urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PATCH_GRAMMAR = r'''
start: "*** Begin Patch\n" hunk+ "*** End Patch"
hunk: "*** Update File: " PATH "\n" line+
line: SIGN TEXT "\n"
SIGN: /[+ -]/
PATH: /[a-z_\/]{1,40}\.rs/
TEXT: /[^\n]{0,100}/
'''

def read(path, lines=80):
    with open(os.path.join(ROOT, path)) as f:
        return "".join(f.readlines()[:lines])

def conversation():
    """(instructions, user text, [(call, result)] then the closing answer)."""
    words = read("README.md", 400).split()
    instructions = "You are a coding agent working in the cqlm repository. Project notes:\n" + " ".join(words[:1200])
    user = "The prompt cache never evicts anything when --cache-mb is small. Find out why and fix it."
    steps = [
        (("search", {"pattern": "fn insert", "path": "src/session"}),
         "src/session/prompt_cache.rs:71: pub fn insert(&mut self, tokens: Vec<u32>, saved: SavedSlot) {"),
        (("read_file", {"path": "src/session/prompt_cache.rs"}), read("src/session/prompt_cache.rs", 136)),
        (("read_file", {"path": "src/serve/batcher.rs"}), read("src/serve/batcher.rs", 120)),
        (("run", {"command": "cargo test --release --test lib prompt_cache"}),
         "running 4 tests\ntest prompt_cache::an_lru_cache_evicts_the_oldest ... ok\n"
         "test prompt_cache::the_longest_prefix_wins ... ok\ntest result: ok. 4 passed; 0 failed"),
        (("read_file", {"path": "src/engine/batch.rs"}), read("src/engine/batch.rs", 100)),
        (("apply_patch", "*** Begin Patch\n*** Update File: src/session/prompt_cache.rs\n"
                         "-        self.bytes += size;\n+        self.bytes += size;\n+        self.evict_to_budget();\n"
                         "*** End Patch"),
         "Done. 1 file changed."),
    ]
    answer = "The cache now evicts down to its budget after every insert; the tests pass."
    return instructions, user, steps, answer

FUNCTIONS = [
    ("read_file", "Read a file of the repository.",
     {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": False}),
    ("search", "Search the repository for a pattern.",
     {"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
      "required": ["pattern", "path"], "additionalProperties": False}),
    ("run", "Run a shell command in the repository.",
     {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"], "additionalProperties": False}),
]

def responses_requests(answer_tokens):
    instructions, user, steps, _ = conversation()
    tools = [{"type": "function", "name": n, "description": d, "parameters": p} for n, d, p in FUNCTIONS]
    tools.append({"type": "custom", "name": "apply_patch", "description": "Apply a patch to the repository.",
                  "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR}})
    items = [{"role": "user", "content": [{"type": "input_text", "text": user}]}]
    for i, ((name, args), result) in enumerate(steps + [((None, None), None)]):
        yield {"model": "cqlm-small", "instructions": instructions, "input": list(items), "tools": tools,
               "tool_choice": "auto", "max_output_tokens": answer_tokens, "temperature": 0, "stream": True}
        if name is None:
            break
        cid = f"call_{i}"
        if name == "apply_patch":
            items.append({"type": "custom_tool_call", "call_id": cid, "name": name, "input": args})
            items.append({"type": "custom_tool_call_output", "call_id": cid, "output": result})
        else:
            items.append({"type": "function_call", "call_id": cid, "name": name, "arguments": json.dumps(args)})
            items.append({"type": "function_call_output", "call_id": cid, "output": result})

def messages_requests(answer_tokens):
    instructions, user, steps, _ = conversation()
    tools = [{"name": n, "description": d, "input_schema": p} for n, d, p in FUNCTIONS]
    tools.append({"name": "apply_patch", "description": "Apply a patch to the repository.",
                  "input_schema": {"type": "object", "properties": {"patch": {"type": "string"}},
                                   "required": ["patch"], "additionalProperties": False}})
    messages = [{"role": "user", "content": [{"type": "text", "text": user}]}]
    for i, ((name, args), result) in enumerate(steps + [((None, None), None)]):
        yield {"model": "cqlm-small", "system": instructions, "messages": list(messages), "tools": tools,
               "max_tokens": answer_tokens, "temperature": 0, "stream": True}
        if name is None:
            break
        tid = f"toolu_{i}"
        inp = {"patch": args} if name == "apply_patch" else args
        messages.append({"role": "assistant", "content": [{"type": "tool_use", "id": tid, "name": name, "input": inp}]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid, "content": result}]})

def send(addr, path, body, key):
    c = http.client.HTTPConnection(*addr, timeout=900)
    t0 = time.perf_counter()
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json", "Authorization": f"Bearer {key}",
                                               "anthropic-version": "2023-06-01"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"{path}: {r.status} {r.read()[:400]!r}")
    usage, first = None, None
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        if first is None:
            first = time.perf_counter() - t0
        ev = json.loads(line[6:])
        if ev.get("type") in ("response.completed", "response.incomplete"):
            u = ev["response"]["usage"]
            usage = (u["input_tokens"], u["input_tokens_details"]["cached_tokens"])
        elif ev.get("type") == "message_start":
            u = ev["message"]["usage"]
            # Anthropic counts input_tokens as the tokens prefilled: the prompt is their sum.
            usage = (u["input_tokens"] + u["cache_read_input_tokens"], u["cache_read_input_tokens"])
    return usage, time.perf_counter() - t0

def start(bin_, backend, extra):
    p = subprocess.Popen([bin_, "serve", "--backend", backend, "--port", "0", "--api-key", "replay", *extra],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                         env={**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")})
    for line in p.stderr:
        m = re.search(r"http://([0-9.]+):(\d+)", line)
        if m:
            return p, (m.group(1), int(m.group(2)))
    raise SystemExit("the server did not start")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/cqlm"))
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--url", help="a running server instead (its key: --key)")
    ap.add_argument("--key", default="replay")
    ap.add_argument("--answer", type=int, default=16)
    a, extra = ap.parse_known_args()
    for route, path, reqs in (("responses", "/v1/responses", responses_requests(a.answer)),
                              ("messages", "/v1/messages", messages_requests(a.answer))):
        # Each route on a fresh server (unless --url), so neither reuses the other's prompts.
        proc = None
        if a.url:
            u = urllib.parse.urlparse(a.url)
            addr = (u.hostname, u.port or 80)
        else:
            proc, addr = start(a.bin, a.backend, extra)
        try:
            total = cached = 0
            seconds = 0.0
            print(f"{route}: request  prompt  cached  seconds")
            for i, body in enumerate(reqs):
                (n, c), s = send(addr, path, body, a.key)
                total, cached, seconds = total + n, cached + c, seconds + s
                print(f"{route}: {i + 1:7d}  {n:6d}  {c:6d}  {s:7.3f}")
            print(f"{route}: hit rate {cached / total:.3f} ({cached} of {total} prompt tokens from the cache; "
                  f"{total - cached} prefilled), {seconds:.2f} s in all")
        finally:
            if proc:
                proc.kill()

if __name__ == "__main__":
    main()
