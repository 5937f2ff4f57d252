#!/usr/bin/env python3
"""Time to first token of the last turn of a multi-turn chat, with the prompt
cache and without (issue 48's target: the sixth turn, about 1,500 tokens of
history, >= 5x lower with the cache). Starts two `cqlm serve` processes (the
default cache, and --cache-mb 0) on free ports and, round by round, plays the
same conversation (a fresh one per round: its first message names the round)
through each, alternating which goes first; each turn is a streamed greedy chat
completion, its time to first token taken at the first content chunk. Prints
per round the last turn's prompt tokens, cached tokens and both TTFTs, then the
median ratio. Standard library only.

    tools/prompt-cache-bench.py [--bin target/release/cqlm] [--backend cpu]
        [--turns 6] [--rounds 5] [--words 120] [--answer 48] [extra serve args...]
"""
import argparse, http.client, json, os, re, statistics, subprocess, sys, time

STORY = ("the old king walked through the gardens of his castle and spoke with the gardener about "
         "the roses and the long winter that had come over the land and the people who waited for spring ").split()

def start(bin_, backend, extra):
    p = subprocess.Popen([bin_, "serve", "--backend", backend, "--port", "0", *extra],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                         env={**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")})
    for line in p.stderr:
        m = re.search(r"http://([0-9.]+):(\d+)", line)
        if m:
            return p, (m.group(1), int(m.group(2)))
    raise SystemExit("the server did not start")

def turn(addr, messages, answer):
    c = http.client.HTTPConnection(*addr, timeout=600)
    body = json.dumps({"messages": messages, "max_tokens": answer, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    ttft, text, usage = None, [], None
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        d = json.loads(line[6:])
        if d.get("usage"):
            usage = d["usage"]
        if d.get("choices") and d["choices"][0]["delta"].get("content"):
            ttft = ttft or time.perf_counter() - t0
            text.append(d["choices"][0]["delta"]["content"])
    return ttft, "".join(text), usage

def conversation(addr, rnd, turns, words, answer):
    messages, last = [], None
    for t in range(turns):
        user = " ".join(STORY[(t * 7 + i) % len(STORY)] for i in range(words))
        messages.append({"role": "user", "content": f"Round {rnd}, part {t + 1}: {user}"})
        ttft, text, usage = turn(addr, messages, answer)
        messages.append({"role": "assistant", "content": text})
        last = (ttft, usage)
    return last

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/cqlm")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--words", type=int, default=120)
    ap.add_argument("--answer", type=int, default=48)
    a, extra = ap.parse_known_args()
    servers = {"cache": start(a.bin, a.backend, extra), "none": start(a.bin, a.backend, [*extra, "--cache-mb", "0"])}
    ratios = []
    try:
        print("round  prompt  cached  ttft_cache_ms  ttft_none_ms  ratio")
        for r in range(a.rounds):
            order = ["cache", "none"] if r % 2 == 0 else ["none", "cache"]
            got = {k: conversation(servers[k][1], r, a.turns, a.words, a.answer) for k in order}
            (tc, uc), (tn, _) = got["cache"], got["none"]
            cached = uc["prompt_tokens_details"]["cached_tokens"]
            ratios.append(tn / tc)
            print(f"{r + 1:>5}  {uc['prompt_tokens']:>6}  {cached:>6}  {tc * 1e3:13.1f}  {tn * 1e3:12.1f}  {tn / tc:5.2f}")
    finally:
        for p, _ in servers.values():
            p.terminate()
            p.wait()
    print(f"median ratio (no cache / cache) of the turn-{a.turns} TTFT: {statistics.median(ratios):.2f} "
          f"(range {min(ratios):.2f} .. {max(ratios):.2f})")

main()
