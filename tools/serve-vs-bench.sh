#!/usr/bin/env bash
# One greedy stream through `cqlm serve` against `cqlm bench`'s decode on the same
# backend and model, interleaved round by round (issue 46's target: the server's
# stream >= 95% of the bench). Each round: a fresh `cqlm serve --parallel 8` and
# tools/serve-bench.py --streams 1 (the stream's decode rate from its first token
# to its last), the server stopped, then `cqlm bench --reps 3` at the stream's
# own positions (its prompt length and its token count: attention over a longer
# cache costs more a token, so a bench at other positions is not the same work),
# decode with logits every token and greedy decode picked by the engine.
# TOKENS (default 256) is the stream's max_tokens.
#
#   tools/serve-vs-bench.sh [BINARY] [BACKEND] [ROUNDS] [extra model args, e.g. --preset default]
set -euo pipefail
bin=${1:-target/release/cqlm}; backend=${2:-cpu}; rounds=${3:-5}; shift $(( $# < 3 ? $# : 3 ))
tokens=${TOKENS:-256}
here=$(cd "$(dirname "$0")" && pwd)
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
printf "round  bench_decode  bench_greedy  server_stream  stream/decode  stream/greedy\n"
for r in $(seq 1 "$rounds"); do
  log=$(mktemp)
  "$bin" serve --backend "$backend" "$@" --port 0 --parallel 8 2>"$log" &
  pid=$!
  for _ in $(seq 1 600); do grep -q listening "$log" && break; sleep 0.1; done
  url=$(grep -o 'http://[0-9.:]*' "$log" | head -1)
  out=$(python3 "$here/serve-bench.py" --url "$url" --streams 1 --tokens "$tokens")
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -f "$log"
  rate=$(echo "$out" | sed -n 's/.*decode \([0-9.]*\) tok\/s a stream.*/\1/p')
  prompt=$(echo "$out" | sed -n 's/.*prompt \([0-9]*\) tokens.*/\1/p')
  # The bench at the stream's own positions: its prompt length, its tokens.
  j=$("$bin" bench --backend "$backend" "$@" --tokens "$tokens" --prompt-len "$prompt" --reps 3 --json 2>/dev/null)
  dec=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["decode_tok_s"])' "$j")
  gre=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["decode_greedy_tok_s"])' "$j")
  python3 - "$r" "$dec" "$gre" "$rate" <<'PY'
import sys
r, dec, gre, s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
print(f"{r:>5}  {dec:12.1f}  {gre:12.1f}  {s:13.1f}  {s / dec:13.3f}  {s / gre:13.3f}")
PY
done
