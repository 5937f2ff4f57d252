#!/usr/bin/env bash
# The CPU speed targets of issue 17, measured as BENCHMARKS.md reports them:
# llama.cpp's CPU backend (../shared/bench/llamacpp-anchor.sh: Q4_0 of a random
# LLaMA of `default`'s shape, tg64 and pp128 on 2 threads, 5 repetitions) and
# `cqlm bench --backend cpu --preset default` (fast and exact, 64 decode tokens
# with logits, a 128-token prompt, 5 repetitions), interleaved round by round,
# so both see the same machine. These VMs are noisy (±25% between sittings):
# only the ratios of one round mean much.
#
#   tools/cpu-vs-llamacpp.sh [ROUNDS] [CQLM_BINARY]     # defaults: 5, target/release/cqlm
#
# Prints one line per round and the median ratios at the end.
set -euo pipefail
rounds=${1:-5}
cqlm=${2:-target/release/cqlm}
here=$(cd "$(dirname "$0")" && pwd)
anchor="$here/../../shared/bench/llamacpp-anchor.sh"
[ -x "$anchor" ] || anchor="$here/../shared/bench/llamacpp-anchor.sh"
[ -x "$cqlm" ] || { echo "no cqlm binary at $cqlm (cargo build --release)" >&2; exit 1; }

bench() {
  "$cqlm" bench --backend cpu --preset default --precision "$1" --prompt-len 128 --tokens 64 --reps 5 --json 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["decode_tok_s"], d["prefill_tok_s"])'
}

rows=()
for r in $(seq "$rounds"); do
  read -r ld lp < <(bash "$anchor" --reps 5 2>/dev/null | tail -1 |
    sed -E 's/.*decode ([0-9.]+) tok\/s, prefill ([0-9.]+) tok\/s.*/\1 \2/')
  read -r fd fp < <(bench fast)
  read -r ed ep < <(bench exact)
  line=$(python3 -c "import sys; ld,lp,fd,fp,ed,ep=map(float,sys.argv[1:]); print(f'{ld:.0f} {lp:.0f} {fd:.0f} {fp:.0f} {ed:.0f} {ep:.0f} {fd/ld:.2f} {fp/lp:.2f} {ed/ld:.2f} {ep/lp:.2f}')" "$ld" "$lp" "$fd" "$fp" "$ed" "$ep")
  rows+=("$line")
  echo "round $r: llama.cpp decode/prefill $(cut -d' ' -f1,2 <<<"$line" | tr ' ' /), cqlm fast $(cut -d' ' -f3,4 <<<"$line" | tr ' ' /), exact $(cut -d' ' -f5,6 <<<"$line" | tr ' ' /); ratios fast $(cut -d' ' -f7,8 <<<"$line" | tr ' ' /), exact $(cut -d' ' -f9,10 <<<"$line" | tr ' ' /)"
done
printf '%s\n' "${rows[@]}" | python3 -c '
import sys, statistics as st
rows = [list(map(float, l.split())) for l in sys.stdin if l.strip()]
col = lambda i: [r[i] for r in rows]
print(f"median ratio to llama.cpp Q4_0: fast decode {st.median(col(6)):.2f}x (range {min(col(6)):.2f}-{max(col(6)):.2f}), "
      f"fast prefill {st.median(col(7)):.2f}x ({min(col(7)):.2f}-{max(col(7)):.2f}), "
      f"exact decode {st.median(col(8)):.2f}x, exact prefill {st.median(col(9)):.2f}x")
'
