#!/usr/bin/env python3
"""CPU decode and prefill on a busy machine (issue 47's targets): for each load
(idle; one busy loop; one busy loop per core; a parallel Rust build), started
before the load's measurements and stopped after them, every variant is
measured once per round, the variants interleaved, the loads interleaved round
by round. A variant is a `cqlm bench --backend cpu --json` run with its own
binary and environment, or llama.cpp's llama-bench on the anchor model
(../shared/bench/llamacpp-anchor.sh builds it; tg64 and pp128 on all cores).

    tools/cpu-under-load.py --rounds 5 --model "--preset default" \\
        --variant cqlm=target/release/cqlm \\
        --variant "1 thread=CQLM_THREADS=1 target/release/cqlm" --llama

Prints each measurement as it comes, then per load the median decode and
prefill of each variant, its ratio to its idle median and to the variant
named by --one-thread under the same load. Standard library only."""
import argparse, json, os, shlex, signal, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ANCHOR = os.path.join(HERE, "..", "..", "shared", "bench", "llamacpp-anchor.sh")
CORES = os.cpu_count() or 2


def start_load(kind):
    """Processes of one load (each in its own process group)."""
    spin = ["sh", "-c", "while :; do :; done"]
    if kind == "idle":
        return []
    if kind == "busy1":
        return [subprocess.Popen(spin, start_new_session=True)]
    if kind == "busy-per-core":
        return [subprocess.Popen(spin, start_new_session=True) for _ in range(CORES)]
    if kind == "build":
        # A parallel release build of this repository into a scratch target
        # directory, started again from clean whenever it ends.
        root = os.path.join(HERE, "..")
        target = tempfile.mkdtemp(prefix="cqlm-load-build-")
        cmd = (f"while :; do rm -rf {target}/*; CARGO_TARGET_DIR={target} cargo build -q --release "
               f"-j {CORES} --manifest-path {root}/Cargo.toml >/dev/null 2>&1; done")
        p = subprocess.Popen(["sh", "-c", cmd], start_new_session=True)
        time.sleep(20)  # past the dependency download and into the compile
        return [p]
    raise SystemExit(f"unknown load {kind}")


def stop_load(procs):
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def cqlm(spec, model, reps):
    env = dict(os.environ)
    words = shlex.split(spec)
    while words and "=" in words[0] and not words[0].startswith("/"):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    cmd = words + ["bench", "--backend", "cpu", *shlex.split(model), "--precision", "fast",
                   "--prompt-len", "128", "--tokens", "64", "--reps", str(reps), "--json"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    d = json.loads(out)
    pool = d.get("cpu_pool") or {}
    return d["decode_tok_s"], d["prefill_tok_s"], pool.get("split_share")


def llama(reps):
    """llama-bench's tg64 and pp128 on the anchor model (built by the anchor
    script, which runs first once); a figure whose run fails is NaN."""
    d = os.environ.get("CQLM_ANCHOR_DIR", os.path.expanduser("~/.cache/cqlm-anchor"))
    bench = os.path.join(d, "llama_cpp_python-0.3.36/vendor/llama.cpp/build-cpu/bin/llama-bench")
    model = os.path.join(d, "rand-llama-512x16-Q4_0.gguf")
    if not os.path.exists(bench):
        subprocess.run(["bash", ANCHOR, "--reps", "1"], capture_output=True)

    def run(args):
        r = subprocess.run([bench, "-m", model, *args, "-t", str(CORES), "-r", "1", "-o", "jsonl"],
                           capture_output=True, text=True)
        lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
        return json.loads(lines[-1])["avg_ts"] if r.returncode == 0 and lines else float("nan")

    return run(["-n", "64", "-p", "0"]), run(["-p", "128", "-n", "0"]), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--model", default="--preset default")
    ap.add_argument("--loads", default="idle,busy1,busy-per-core,build")
    ap.add_argument("--variant", action="append", default=[], help="NAME=[ENV=V ...] BINARY")
    ap.add_argument("--llama", action="store_true", help="add llama.cpp (anchor, 2 threads)")
    ap.add_argument("--one-thread", default="1 thread", help="the variant to compare with")
    a = ap.parse_args()
    variants = [tuple(v.split("=", 1)) for v in a.variant]
    if a.llama:
        variants.append(("llama.cpp", None))
    loads = a.loads.split(",")
    res = {}  # (load, variant) -> [(decode, prefill)]
    print(f"# {CORES} cores, {a.rounds} rounds, model: {a.model}", flush=True)
    for r in range(1, a.rounds + 1):
        for load in loads:
            procs = start_load(load)
            try:
                for name, spec in variants:
                    d, p, share = llama(a.reps) if spec is None else cqlm(spec, a.model, a.reps)
                    res.setdefault((load, name), []).append((d, p))
                    extra = "" if share is None else f", {share * 100:.0f}% of pool jobs split"
                    print(f"round {r} {load:14} {name:14} decode {d:8.1f}  prefill {p:8.1f}{extra}",
                          flush=True)
            finally:
                stop_load(procs)
    print("\n| load | variant | decode tok/s (median, range) | ÷ idle | ÷ 1 thread | prefill tok/s | ÷ idle |")
    print("|---|---|---|---|---|---|---|")
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in res.items()}
    for load in loads:
        for name, _ in variants:
            v = res[(load, name)]
            d, p = med[(load, name)]
            idle = med.get(("idle", name))
            one = med.get((load, a.one_thread))
            lo, hi = min(x[0] for x in v), max(x[0] for x in v)
            fmt = lambda x: "" if x is None else f"{x:.2f}"
            print(f"| {load} | {name} | {d:.0f} ({lo:.0f}–{hi:.0f}) | {fmt(idle and d / idle[0])} | "
                  f"{fmt(one and name != 'llama.cpp' and d / one[0] or None)} | {p:.0f} | {fmt(idle and p / idle[1])} |")


if __name__ == "__main__":
    sys.exit(main())
