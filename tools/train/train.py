"""Train the built-in cqlm model: float, dense weights, CPU, fixed seed.

    python3 tools/train/train.py --compile        # reads tools/train/data/{train,val}.u16

Every `--eval-every` steps it logs validation loss and bits per byte, and exports the float
checkpoint in the `cqlm pack` input format (SPEC §3 names, dense matrices, `cqlm.config`
and `cqlm.tokenizer` in the metadata) to `<data>/float.safetensors`. The log is
`<data>/train_log.csv`. Sequences are `[BOS] + 255` corpus tokens from random offsets, so
the context (256) never exceeds the model's window and training sees exactly the attended
set of SPEC §4.3; engram rows are hashed per sequence as SPEC §4.2 defines.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, CqlmFloat, engram_indices  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def batch(data: np.ndarray, offsets: np.ndarray, seq: int, bos: int):
    """Inputs `[BOS] + data[o : o+seq-1]` and targets `data[o : o+seq]` for every offset."""
    idx = offsets[:, None] + np.arange(seq)[None, :]
    y = data[idx].astype(np.int64)
    x = np.concatenate([np.full((len(offsets), 1), bos, dtype=np.int64), y[:, :-1]], 1)
    return x, y


def export(model: CqlmFloat, cfg: Config, tokenizer_json: str, path: str, extra: dict) -> None:
    tensors = model.named_spec_tensors()
    meta = {"cqlm.config": json.dumps(cfg.json()), "cqlm.tokenizer": tokenizer_json,
            "cqlm.train": json.dumps(extra)}
    tmp = path + ".tmp"
    save_file(tensors, tmp, metadata=meta)
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.05)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--compile", action="store_true", help="torch.compile the training step (~1.3x faster here, ~5 min to compile)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    cfg = Config()
    if args.seq > cfg.window:
        sys.exit(f"--seq {args.seq} exceeds the window {cfg.window}")
    train = np.fromfile(os.path.join(args.data, "train.u16"), dtype=np.uint16)
    val = np.fromfile(os.path.join(args.data, "val.u16"), dtype=np.uint16)
    with open(os.path.join(args.data, "tokenizer.json"), encoding="utf-8") as f:
        tokenizer_json = f.read()
    val_bytes = os.path.getsize(os.path.join(args.data, "val.txt"))
    bytes_per_token = val_bytes / len(val)
    print(f"train {len(train)} tokens, val {len(val)} tokens ({bytes_per_token:.3f} bytes/token)", flush=True)

    model = CqlmFloat(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.2f}M parameters; config {json.dumps(cfg.json())}", flush=True)
    decay = [p for n, p in model.params.items() if p.dim() == 2 and not n.startswith("mhc.b")]
    no_decay = [p for n, p in model.params.items() if not (p.dim() == 2 and not n.startswith("mhc.b"))]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    val_rng = np.random.default_rng(7)
    val_offsets = val_rng.integers(0, len(val) - args.seq, size=(args.eval_batches, args.batch))

    def evaluate() -> float:
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for offs in val_offsets:
                x, y = batch(val, offs, args.seq, cfg.bos)
                rows = engram_indices(cfg, x.astype(np.uint32))
                logits = model(torch.from_numpy(x), rows)
                total += F.cross_entropy(logits.reshape(-1, cfg.vocab), torch.from_numpy(y).reshape(-1), reduction="sum").item()
                count += y.size
        model.train()
        return total / count

    # Evaluation runs the plain module (SPEC's exact log-space Sinkhorn); only the training
    # step is compiled.
    step_model = torch.compile(model) if args.compile else model
    log_path = os.path.join(args.data, "train_log.csv")
    log = open(log_path, "w", newline="")
    writer = csv.writer(log)
    writer.writerow(["step", "tokens", "seconds", "lr", "train_loss", "val_loss", "val_bpb"])
    start = time.time()
    running = None
    tokens = 0
    model.train()
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            vl = evaluate()
            bpb = vl / math.log(2) / bytes_per_token
            elapsed = time.time() - start
            writer.writerow([step, tokens, f"{elapsed:.1f}", f"{lr_at(step):.3e}",
                             f"{running:.4f}" if running else "", f"{vl:.4f}", f"{bpb:.4f}"])
            log.flush()
            print(f"step {step:5d}  tokens {tokens / 1e6:7.2f}M  {elapsed / 60:6.1f} min  "
                  f"train {running or float('nan'):.4f}  val {vl:.4f}  bpb {bpb:.4f}", flush=True)
            export(model, cfg, tokenizer_json, os.path.join(args.data, "float.safetensors"),
                   {"step": step, "tokens": tokens, "seconds": round(elapsed, 1), "val_loss": vl,
                    "val_bpb_sampled": bpb, "seed": args.seed, "args": vars(args)})
        if step == args.steps:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        offs = rng.integers(0, len(train) - args.seq, size=args.batch)
        x, y = batch(train, offs, args.seq, cfg.bos)
        rows = engram_indices(cfg, x.astype(np.uint32))
        logits = step_model(torch.from_numpy(x), rows)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), torch.from_numpy(y).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens += y.size
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % 50 == 0:
            print(f"  step {step:5d} loss {loss.item():.4f} ({(time.time() - start) / (step + 1):.2f} s/step)", flush=True)
    log.close()


if __name__ == "__main__":
    main()
