#!/usr/bin/env python3
"""Throughput of a running `cqlm serve`: N concurrent streams of greedy chat
completions, each `--tokens` long; per-stream and aggregate tok/s, time to first
token, p50/p99 latency between content chunks (a chunk at most every
`--stream-interval-ms` of the server, 1 ms by default, holding the tokens made
meanwhile; a chunk a token with 0), and the
decode rate of a stream from its first token to its last (what `cqlm bench`'s
decode measures; at CPU speeds the inter-token gaps are below the HTTP
stack's delivery granularity, so the rate is the comparable figure).

    tools/serve-bench.py --url http://127.0.0.1:8080 --streams 1 4 8 --tokens 64
Standard library only."""
import argparse, http.client, json, statistics, threading, time, urllib.parse

def stream(url, tokens, prompt, out):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    stamps, used, prompt = [], None, None
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        d = json.loads(line[6:])
        if d.get("usage"):
            used = d["usage"]["completion_tokens"]
            prompt = d["usage"]["prompt_tokens"]
        if d.get("choices") and d["choices"][0]["delta"].get("content"):
            stamps.append(time.perf_counter())
    out.append((t0, stamps, used, prompt))

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=48)
    a = ap.parse_args()
    prompt = " ".join(["the king"] * (a.prompt_words // 2))
    for n in a.streams:
        out = []
        th = [threading.Thread(target=stream, args=(a.url, a.tokens, prompt, out)) for _ in range(n)]
        t0 = time.perf_counter()
        for t in th: t.start()
        for t in th: t.join()
        wall = time.perf_counter() - t0
        # Tokens from the usage chunk (a chunk may carry several tokens when
        # the client falls behind); content chunks where there is none.
        count = lambda s, u: u if u else len(s)
        total = sum(count(s, u) for _, s, u, _ in out)
        gaps = [b - a_ for _, s, _, _ in out for a_, b in zip(s, s[1:])]
        ttft = [s[0] - t for t, s, _, _ in out if s]
        per = [count(s, u) / (s[-1] - t) for t, s, u, _ in out if len(s) > 1]
        decode = [(count(s, u) - 1) / (s[-1] - s[0]) for _, s, u, _ in out if len(s) > 1 and s[-1] > s[0]]
        prompts = sorted({p for *_, p in out if p})
        q = statistics.quantiles(gaps, n=100) if len(gaps) > 1 else [0] * 99
        print(f"{n} streams: aggregate {total / wall:.0f} tok/s, per stream {statistics.mean(per):.0f} tok/s, "
              f"TTFT p50 {statistics.median(ttft) * 1e3:.1f} ms, inter-token p50 {q[49] * 1e3:.2f} ms p99 {q[98] * 1e3:.2f} ms, "
              f"decode {statistics.median(decode):.0f} tok/s a stream, prompt {'/'.join(map(str, prompts))} tokens")

main()
