"""The PyTorch side of cqlm's cross-implementation checks.

    # bits per byte of a text under the float checkpoint, or under a packed archive's weights
    # dequantized to dense floats with SPEC's int8 K/V rounding emulated:
    python3 tools/train/evaluate.py bpb --model data/float.safetensors --text heldout.txt
    python3 tools/train/evaluate.py bpb --model models/cqlm-small.safetensors --kv-int8 --text heldout.txt

    # logits at every position of a prompt, as a float32 .npy [P, vocab] (SPEC §7's layout):
    python3 tools/train/evaluate.py logits --model M --ids 1,2,3 [--kv-int8] --out X.npy

    # the fixtures of tests/trained_model.rs and tests/eval.rs (see `fixtures --help`):
    python3 tools/train/evaluate.py fixtures --archive models/cqlm-small.safetensors \
        --float tools/train/data/chat_float.safetensors --out tests/fixtures/trained

    # the held-out chat and tool-call accuracy through the engine (`chat --help`, chat_eval.py;
    # needs only jinja2, and openai for --server):
    python3 tools/train/evaluate.py chat --cqlm target/release/cqlm --backend cpu

A model file is either a float checkpoint (dense matrices) or a `cqlm` archive (CQ matrices
`P.codebook`/`P.norms`/`P.packed`); the latter is dequantized here from SPEC §2 directly,
independently of the Rust reader. Everything runs in float64 unless `--f32`.
Texts are scored as the engine streams them: `[BOS] + tokens`, every token predicted from
what precedes it, attention over the sinks and the sliding window (SPEC §4.3).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

if __name__ == "__main__" and sys.argv[1:2] == ["chat"]:  # before PyTorch is imported: chat needs none
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import chat_eval
    sys.exit(chat_eval.main(sys.argv[2:]))

import numpy as np
import torch
from safetensors.numpy import load_file
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as model_module  # noqa: E402
from model import Config, CqlmFloat, engram_indices, hadamard  # noqa: E402


def dequantize(codebook: np.ndarray, norms: np.ndarray, packed: np.ndarray, cols: int) -> np.ndarray:
    """SPEC §2: W[r, k·group ..] = norms[r, k] · nfwht(codebook[idx]), columns ≥ cols dropped (f64)."""
    bits = int(round(math.log2(len(codebook))))
    rows, groups = norms.shape
    group = packed.shape[1] * 8 // (bits * groups)
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    idx = ((packed[:, :, None] >> shifts[None, None, :]) & ((1 << bits) - 1)).reshape(rows, groups, group)
    q = codebook.astype(np.float64)[idx]
    h = hadamard(group, torch.float64).numpy() / math.sqrt(group)
    w = (q @ h) * norms.astype(np.float64)[:, :, None]
    return w.reshape(rows, groups * group)[:, :cols]


def load(path: str, dtype=torch.float64) -> tuple[CqlmFloat, Config, str | None]:
    with safe_open(path, "np") as f:
        meta = f.metadata() or {}
    tensors = load_file(path)
    cfg_json = json.loads(meta["cqlm.config"])
    table_rows = 1
    if cfg_json.get("engram"):
        e = cfg_json["engram"]
        key = f"engram.table.{e['orders'][0]}.0"
        table_rows = (tensors[key] if key in tensors else tensors[key + ".norms"]).shape[0]
    cfg = Config.from_json(cfg_json, table_rows)
    model = CqlmFloat(cfg).to(dtype)
    dense = {}
    for name, param in model.params.items():
        if name in tensors:
            dense[name] = torch.from_numpy(tensors[name].astype(np.float64))
        else:
            w = dequantize(tensors[name + ".codebook"], tensors[name + ".norms"], tensors[name + ".packed"], param.shape[1])
            dense[name] = torch.from_numpy(w)
    model.load_spec_tensors(dense)
    model.eval()
    return model, cfg, meta.get("cqlm.tokenizer")


@torch.no_grad()
def run(model: CqlmFloat, cfg: Config, ids: list[int], kv_int8: bool) -> torch.Tensor:
    """Logits `[len(ids), vocab]` for one stream of ids (row t predicts id t+1)."""
    toks = np.asarray(ids, dtype=np.uint32)[None, :]
    rows = engram_indices(cfg, toks) if cfg.engram else None
    return model(torch.from_numpy(toks.astype(np.int64)), rows, kv_int8=kv_int8, block=256)[0]


def code_margins(model: CqlmFloat, cfg: Config, ids: list[int]) -> list[float]:
    """Per position, the smallest distance (in code units) from a K or V value `x / scale`
    to a rounding boundary `k + 0.5`, over every layer and KV head: where it is below float
    rounding noise (~1e-5 here), two correct f32 implementations may store different codes,
    the flip SPEC §6 allows for."""
    seen = []
    model_module.INT8_OBSERVERS.append(lambda r: seen.append((r - torch.floor(r) - 0.5).abs()))
    try:
        run(model, cfg, ids, True)
    finally:
        model_module.INT8_OBSERVERS.clear()
    # each r: [1, kv_heads, S, head_dim] -> min over heads and dims, then over layers and K/V
    per = torch.stack([r[0].amin(dim=(0, 2)) for r in seen]).amin(0)
    return [float(v) for v in per]


def bpb(model, cfg, tokenizer_json: str, text_path: str, kv_int8: bool, max_tokens: int | None) -> dict:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    with open(text_path, "rb") as f:
        raw = f.read()
    ids = tok.encode(raw.decode("utf-8")).ids
    if not ids or ids[0] != cfg.bos:
        ids = [cfg.bos] + ids
    nbytes = len(raw)
    if max_tokens is not None and len(ids) - 1 > max_tokens:
        ids = ids[: max_tokens + 1]
        nbytes = len(tok.decode(ids[1:], skip_special_tokens=True).encode("utf-8"))
    # Every layer runs over the whole stream at once (memory grows with the text: about
    # 100 KB per token in f64, so a 60k-token file needs ~6 GB).
    logits = run(model, cfg, ids, kv_int8)
    logp = torch.log_softmax(logits.double(), -1)
    target = torch.tensor(ids[1:])
    nll = -logp[:-1].gather(1, target[:, None]).sum().item()
    n = len(ids) - 1
    return {"tokens": n, "bytes": nbytes, "nll_nats": nll, "ppl": math.exp(nll / n), "bits_per_byte": nll / math.log(2) / nbytes}


# Chosen so that no stored K/V value of the shipped model lies within NEAR_TIE of an int8
# rounding boundary for a while (tests/e2e/trained_model.rs tests positions before the first
# such one strictly): it has none in its 42 positions (`evaluate.py find-prompt` over 300
# held-out sentences of 30-45 tokens, most of which have one within the first few; each
# retrained model needs a new search). The shipped model's `<bos>` row itself stores a value within NEAR_TIE of a
# boundary, so every prompt run from `<bos>` has one at position 0: the fixtures then run the
# prompt from its first text token (`run_from`), which the engine takes as well as any ids.
PROMPT = ("But Yahweh of Armies, who tests the righteous, who sees the heart and the mind, let me see your "
          "vengeance on them, for I have revealed my cause to you.")
NEAR_TIE = 3e-5
PREFIX_TOKENS = 512


def find_prompt(args) -> None:
    """Print the held-out sentences of 30-45 tokens (the first 300) whose first stored
    K/V value within NEAR_TIE of an int8 rounding boundary comes latest, best first."""
    import re
    from tokenizers import Tokenizer

    packed, cfg, tok_json = load(args.archive)
    tok = Tokenizer.from_str(tok_json)
    with open(args.heldout, encoding="utf-8") as f:
        sentences = [s.strip().replace("\n", " ") for s in re.split(r"(?<=[.!?])\s+", f.read())]
    found = []
    bos_tie = code_margins(packed, cfg, [cfg.bos])[0] < NEAR_TIE
    for s in sentences:
        ids = tok.encode(s).ids
        if ids and ids[0] != cfg.bos:
            ids = [cfg.bos] + ids
        if not 30 <= len(ids) <= 45:
            continue
        run_ids = ids[1:] if bos_tie else ids
        m = code_margins(packed, cfg, run_ids)
        first = next((i for i, v in enumerate(m) if v < NEAR_TIE), len(m))
        found.append((first, len(run_ids), s))
        if len(found) == 300:
            break
    for first, n, s in sorted(found, reverse=True)[:8]:
        print(f"first near tie at {first} of {n}: {s}")


def fixtures(args) -> None:
    """Everything the Rust tests compare against, computed here, independently of the engine:

    - `prompt.json`: the prompt text and its ids from the Python `tokenizers` package (from
      `<bos>`), `run_from` (where the logits below start: 1 when the `<bos>` row is itself a
      near tie), and per position run the smallest distance of a stored K/V value to an int8
      rounding boundary;
    - `dequant_logits.npy` `[P, vocab]` (of `ids[run_from:]`): the archive's weights dequantized (SPEC §2) and run
      in f64 with the int8 K/V rounding emulated: the engine's model, another implementation;
    - `float_logits.npy` `[P, vocab]`: the float checkpoint the archive was packed from;
    - `reference.json`: bits per byte of `heldout.txt` (whole, and its first 512 tokens)
      under the dequantized archive, and under the float model.
    """
    from tokenizers import Tokenizer

    os.makedirs(args.out, exist_ok=True)
    packed, cfg, tok_json = load(args.archive)
    fl, fcfg, _ = load(args.float)
    tok = Tokenizer.from_str(tok_json)
    ids = tok.encode(PROMPT).ids
    if not ids or ids[0] != cfg.bos:
        ids = [cfg.bos] + ids
    run_from = 1 if code_margins(packed, cfg, ids[:1])[0] < NEAR_TIE else 0
    run_ids = ids[run_from:]
    with open(os.path.join(args.out, "prompt.json"), "w") as f:
        json.dump({"text": PROMPT, "ids": ids, "run_from": run_from,
                   "code_margins": code_margins(packed, cfg, run_ids)}, f)
    np.save(os.path.join(args.out, "dequant_logits.npy"), run(packed, cfg, run_ids, True).float().numpy())
    np.save(os.path.join(args.out, "float_logits.npy"), run(fl, fcfg, run_ids, False).float().numpy())
    if args.logits_only:
        return
    ref = {
        "archive": os.path.basename(args.archive),
        "heldout": bpb(packed, cfg, tok_json, args.heldout, True, None),
        "heldout_prefix": bpb(packed, cfg, tok_json, args.heldout, True, PREFIX_TOKENS),
        "heldout_float": bpb(fl, fcfg, tok_json, args.heldout, False, None),
    }
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(json.dumps(ref, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("bpb")
    a.add_argument("--model", required=True)
    a.add_argument("--text", required=True)
    a.add_argument("--kv-int8", action="store_true")
    a.add_argument("--max-tokens", type=int)
    a.add_argument("--f32", action="store_true")
    b = sub.add_parser("logits")
    b.add_argument("--model", required=True)
    b.add_argument("--ids", required=True)
    b.add_argument("--kv-int8", action="store_true")
    b.add_argument("--f32", action="store_true")
    b.add_argument("--out", required=True)
    c = sub.add_parser("fixtures")
    c.add_argument("--archive", required=True)
    c.add_argument("--float", required=True)
    c.add_argument("--heldout", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "heldout.txt"))
    c.add_argument("--out", required=True)
    c.add_argument("--logits-only", action="store_true", help="leave reference.json (the slow part) as it is")
    d = sub.add_parser("find-prompt", help="held-out sentences whose first near-tie code comes latest "
                       "for an archive (candidates for PROMPT after a retrain)")
    d.add_argument("--archive", required=True)
    d.add_argument("--heldout", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "heldout.txt"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.cmd == "fixtures":
        fixtures(args)
        return
    if args.cmd == "find-prompt":
        find_prompt(args)
        return
    model, cfg, tokenizer_json = load(args.model, torch.float32 if args.f32 else torch.float64)
    if args.cmd == "bpb":
        print(json.dumps(bpb(model, cfg, tokenizer_json, args.text, args.kv_int8, args.max_tokens)))
    else:
        ids = [int(x) for x in args.ids.split(",")]
        logits = run(model, cfg, ids, args.kv_int8).float().numpy()
        np.save(args.out, logits)
        print(f"wrote {args.out} {logits.shape}")


if __name__ == "__main__":
    main()
