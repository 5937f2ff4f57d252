#!/usr/bin/env bash
# gpu-bench.sh: the GPU figures of BENCHMARKS.md on whatever GPU this machine has,
# unattended, in under 8 minutes, with nothing but this repository and a release
# binary built elsewhere (no registry access needed).
#
#   tools/gpu-bench.sh [CQLM_BINARY] [OUT_DIR]
#
# CQLM_BINARY defaults to target/release/cqlm, OUT_DIR to $OUT or gpu-bench-out.
# It writes, per run, the JSON or text the command prints, and summary.txt:
#   - devices.txt                       the adapters wgpu sees;
#   - bench-{builtin,default,large}.json  `cqlm bench --backend gpu` (decode with
#     logits, greedy on the device, prefill; dispatches and host µs per token),
#     and bench-cpu-{builtin,default}.json for the CPU on the same machine;
#   - batch-{builtin,default}.json      `cqlm bench --sequences 1,4,8,16`: decode
#     of 1-16 sequences a pass through GpuBatch (what `cqlm serve` runs);
#   - profile-{builtin,default}.json    `cqlm profile` per kernel (timestamps);
#   - parity-tiny.txt                   the parity ladder on `tiny`.
#
# Environment:
#   PEAK_GBS         the adapter's memory bandwidth in GB/s, for the "share of
#                    peak" column (default: from a table of known adapter names);
#   GPU_BENCH_DEBS   a folder of .deb files (the Vulkan loader: libvulkan1 ...)
#                    unpacked into / when no libvulkan is installed (default .gl,
#                    see the device notes);
#   CQLM_GPU_PROGRAM lean|standard, passed through (default: lean on a hardware GPU).
# Every command has its own time limit; one that fails or times out is reported
# in summary.txt and the rest still run.
set -uo pipefail

bin=${1:-target/release/cqlm}
out=${2:-${OUT:-gpu-bench-out}}
mkdir -p "$out"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
summary="$out/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

# The Vulkan loader, when the machine has the driver but not the loader.
if ! ldconfig -p 2>/dev/null | grep -q libvulkan; then
  debs=${GPU_BENCH_DEBS:-.gl}
  if compgen -G "$debs/*.deb" >/dev/null; then
    for f in "$debs"/*.deb; do dpkg -x "$f" /; done
    ldconfig
    say "unpacked the Vulkan loader from $debs"
  else
    say "warning: no libvulkan and no .deb files in $debs"
  fi
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -e "$icd" ]; then
  export VK_DRIVER_FILES=$icd
fi

say "cqlm gpu-bench, $(date -u +%Y-%m-%dT%H:%MZ), binary $bin"
timeout 60 "$bin" devices >"$out/devices.txt" 2>&1
say "$(cat "$out/devices.txt")"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv \
    >"$out/nvidia-smi.csv" 2>&1 && say "$(cat "$out/nvidia-smi.csv")"
fi

# Peak memory bandwidth (GB/s) of known adapters, by a substring of the name.
peak=${PEAK_GBS:-}
if [ -z "$peak" ]; then
  name=$(tr '[:upper:]' '[:lower:]' <"$out/devices.txt")
  for pair in "h200:4800" "h100:3350" "a100:2039" "l40s:864" "l4:300" "4090:1008" \
    "3090:936" "4080:717" "a10:600" "t4:320" "v100:900" "mi300:5300" "m2 ultra:800" \
    "m3 max:400" "m1 max:400"; do
    if [[ "$name" == *"${pair%%:*}"* ]]; then peak=${pair##*:}; break; fi
  done
fi
say "peak memory bandwidth: ${peak:-unknown} GB/s"

run() { # run NAME LIMIT_S ARGS... : stdout to $out/NAME, status to the summary
  local name=$1 limit=$2; shift 2
  if timeout "$limit" "$bin" "$@" >"$out/$name" 2>"$out/$name.err"; then
    say "ok      $name ($*)"
  else
    say "FAILED  $name (exit $?; $*): $(tail -n 3 "$out/$name.err" | tr '\n' ' ')"
  fi
}

# ~5 minutes in all on an H200; each limit is what the slowest sane GPU needs.
run bench-builtin.json 60 bench --backend gpu --prompt-len 32 --tokens 512 --reps 5 --json
run bench-default.json 60 bench --backend gpu --preset default --prompt-len 32 --tokens 512 --reps 5 --json
run bench-large.json 90 bench --backend gpu --preset large --prompt-len 32 --tokens 256 --reps 5 --json
run batch-builtin.json 60 bench --backend gpu --sequences 1,4,8,16 --prompt-len 32 --tokens 128 --reps 3 --json
run batch-default.json 60 bench --backend gpu --preset default --sequences 1,4,8,16 --prompt-len 32 --tokens 128 --reps 3 --json
run profile-builtin.json 45 profile --backend gpu --tokens 32 --json
run profile-default.json 45 profile --backend gpu --preset default --tokens 32 --json
run parity-tiny.txt 60 parity --preset tiny --ids 1,2,3,4,5,6,7,8,9,10,11,12
run bench-cpu-builtin.json 45 bench --backend cpu --prompt-len 32 --tokens 256 --reps 3 --json
run bench-cpu-default.json 60 bench --backend cpu --preset default --prompt-len 32 --tokens 128 --reps 3 --json

# The table, with python3 where there is one (the JSON files hold it all anyway).
if command -v python3 >/dev/null 2>&1; then
  PEAK="${peak:-0}" OUTDIR="$out" python3 - <<'EOF' | tee -a "$summary"
import json, os
out, peak = os.environ["OUTDIR"], float(os.environ["PEAK"] or 0)
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except Exception:
        return None
print("\nmodel     backend  decode tok/s  greedy tok/s  prefill tok/s  dispatches  host us/token  weights GB/s")
for m in ["builtin", "default", "large"]:
    for kind, name in [("gpu", f"bench-{m}.json"), ("cpu", f"bench-cpu-{m}.json")]:
        b = load(name)
        if not b:
            continue
        gbs = b["weight_bytes_per_step"] * b["decode_tok_s"] / 1e9
        host = b.get("host_us_per_token")
        print(f"{m:9} {kind:7} {b['decode_tok_s']:13.1f} {b['decode_greedy_tok_s']:13.1f} "
              f"{b['prefill_tok_s']:14.1f} {str(b['dispatches_per_token']):>11} "
              f"{(f'{host:.1f}' if host is not None else '-'):>14} {gbs:13.1f}")
for m in ["builtin", "default"]:
    b = load(f"batch-{m}.json")
    if b:
        print(f"\nbatched {m}: " + ", ".join(
            f"{r['sequences']} seq {r['aggregate_tok_s']:.0f} tok/s ({r['vs_one'] or 0:.2f}x)"
            for r in b["batched"]))
for m in ["builtin", "default"]:
    p = load(f"profile-{m}.json")
    if not p:
        continue
    print(f"\nprofile {m}: {p['backend']}, {p['method']}")
    print(f"step {p['step_us']:.1f} us, kernels {p['kernel_sum_us']:.1f} us, "
          f"{p['dispatches_per_token']} dispatches, host {p.get('host_us_per_token')} us")
    print("kernel           calls   us/token   share      GB/s   of peak")
    for r in p["rows"]:
        frac = f"{100 * r['gb_per_s'] / peak:7.2f}%" if peak else "      -"
        print(f"{r['kernel']:15} {r['calls_per_token']:6} {r['us_per_token']:10.2f} "
              f"{100 * r['share']:6.1f}% {r['gb_per_s']:9.1f} {frac}")
EOF
fi
say "done: $out"
