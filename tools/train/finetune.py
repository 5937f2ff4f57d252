"""Fine-tune the built-in model into a chat model that calls the four demo tools.

    tools/train/finetune.sh          # the recipe of the shipped model (four runs of this script)

Starts from the shipped base archive (`--base`, dequantized as SPEC §2 says: the float
checkpoint it was packed from is not kept) or from a float checkpoint or archive of an earlier
run (`--resume`). `--split-names` switches the tokenizer to `chat_format.NAME_SPLIT` (same
vocabulary, the space before a capital or a digit a token of its own). From the base it appends the chat tokens of `chat_format.py` to the tokenizer
and new rows to the (tied) embedding, and makes `<|end|>` the EOS. Every step trains on

- chat rows: one conversation of `chat_train.jsonl` each (`<bos>` + the rendered template,
  padded to the longest of the batch), the loss on the assistant's turns only (every token
  after `<|assistant|>` up to and including its `<|end|>`);
- say-it-back rows (`--copy-batch`, `chat_copy.jsonl`), the same way;
- text rows: `<bos>` + a random crop of `train.txt`'s tokens, the loss on every token, so the
  model's English does not collapse.

Logged every `--eval-every` steps (and exported to `data/chat_float.safetensors`): the
held-out chat loss (`chat_heldout.jsonl`, assistant tokens) and the validation bits per byte
of the text (the same 8 × 16 crops as `train.py`). `--stop-at` ends a run early with the
learning-rate schedule of `--steps`. `--call-weight` weighs a tool call's tokens in the chat
loss, and `--decision-weight` (run 16) those of them where a value starts or ends;
`--insert-layers AT:N` (run 15) makes the loaded model deeper first (`deepen.py`), its new
layers training at `--new-lr-mult` times the learning rate. Seeded; like `train.py`, two
runs agree up to the order of PyTorch's threaded reductions.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import re
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_format  # noqa: E402
import demo_tools  # noqa: E402
from deepen import insert_layers  # noqa: E402
from evaluate import load  # noqa: E402
from model import Config, CqlmFloat, engram_indices  # noqa: E402
from tokenizer import encode_text  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


# A value in a call's compact JSON: a string (group 1) or a number, true, false or null (group 2).
CALL_VALUE = re.compile(r'":(?:"([^"]*)"|([^,{}\[\]"]+))')


def decision_chars(text: str) -> set[int]:
    """Character positions in `text` where a tool call's values are decided: the first
    character of each value and the one just after it (a string's closing quote; the comma
    or brace after a number), i.e. which value is chosen and where it ends."""
    pos: set[int] = set()
    calls = re.escape(chat_format.MARKERS[0]) + "(.*?)" + re.escape(chat_format.MARKERS[1])
    for call in re.finditer(calls, text, re.S):
        for v in CALL_VALUE.finditer(call.group(1)):
            g = 1 if v.group(1) is not None else 2
            pos.update((call.start(1) + v.start(g), call.start(1) + v.end(g)))
    return pos


def chat_rows(convs: list[dict], tok, tools: list, seq: int, bos: int, call_weight: float = 1.0,
              decision_weight: float = 0.0) -> tuple[np.ndarray, np.ndarray, int]:
    """Token rows `[n, seq]` (padded with 0) and loss weights (0 outside the assistant's
    turns; `call_weight` for the tokens of a tool call after its `<tool_call>` up to and
    including `</tool_call>`, and `decision_weight` instead, when not 0, for a call's tokens
    that cover a `decision_chars` position; 1 for the rest of the turn); conversations
    longer than `seq` are dropped (their count is returned)."""
    texts = [chat_format.render(c["messages"], chat_format.tool_defs(c["tools"], tools), False) for c in convs]
    enc = tok.encode_batch(texts, add_special_tokens=False)
    asst, end = tok.token_to_id(chat_format.ASSISTANT), tok.token_to_id(chat_format.END)
    call_start, call_end = (tok.token_to_id(t) for t in chat_format.MARKERS)
    rows, masks, dropped = [], [], 0
    for text, e in zip(texts, enc):
        ids = e.ids
        decide = decision_chars(text) if decision_weight else set()
        if ids[0] != bos:
            raise SystemExit("the template does not start with <bos>")
        if len(ids) > seq:
            dropped += 1
            continue
        m = np.zeros(seq, dtype=np.float32)
        inside = in_call = False
        for i, t in enumerate(ids):
            if inside:
                m[i] = call_weight if in_call else 1.0
                if in_call and decide and any(c in decide for c in range(*e.offsets[i])):
                    m[i] = decision_weight
                if t == call_start:
                    in_call = True
                elif t == call_end:
                    in_call = False
                elif t == end:
                    inside = in_call = False
            elif t == asst:
                inside = True
        r = np.zeros(seq, dtype=np.int64)
        r[: len(ids)] = ids
        rows.append(r)
        masks.append(m)
    return np.stack(rows), np.stack(masks), dropped


def export(model: CqlmFloat, cfg: Config, tokenizer_json: str, path: str, extra: dict) -> None:
    meta = {"cqlm.config": json.dumps(cfg.json()), "cqlm.tokenizer": tokenizer_json,
            "cqlm.chat_template": chat_format.template_text(),
            "cqlm.tool_call_markers": json.dumps(chat_format.MARKERS), "cqlm.train": json.dumps(extra)}
    tmp = path + ".tmp"
    save_file(model.named_spec_tensors(), tmp, metadata=meta)
    os.replace(tmp, path)


def at_n(text: str) -> tuple[int, int]:
    """`--insert-layers`' value: two integers `AT:N`."""
    try:
        at, n = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not AT:N (two integers)") from None
    return at, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--base", default=os.path.join(HERE, "data", "base.safetensors"),
                    help="the prose model to start from (finetune.sh takes it from the repository's history)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--chat-batch", type=int, default=20)
    ap.add_argument("--text-batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256, help="longest chat row (longer conversations are dropped)")
    ap.add_argument("--text-seq", type=int, default=160)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--wd", type=float, default=0.05)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--resume", help="continue from this float checkpoint (chat vocabulary already in place)")
    ap.add_argument("--copy-batch", type=int, default=0, help="say-it-back rows per step (data/chat_copy.jsonl)")
    ap.add_argument("--split-names", action="store_true", help="split the space before a capital or a digit "
                    "off in the tokenizer (chat_format.NAME_SPLIT; a checkpoint that has it keeps it)")
    ap.add_argument("--stop-at", type=int, default=-1, help="stop (and export) at this step, the schedule still "
                    "that of --steps (to replay a run that was stopped)")
    ap.add_argument("--max-minutes", type=float, default=0, help="stop (and export) after this long; 0: no limit")
    ap.add_argument("--call-weight", type=float, default=1.0, help="weight of a tool call's tokens in the chat "
                    "loss (the rest of an assistant turn weighs 1)")
    ap.add_argument("--decision-weight", type=float, default=0.0, help="weight of the tokens where a call's "
                    "value starts or ends (decision_chars) instead of --call-weight; 0: no such weight")
    ap.add_argument("--insert-layers", metavar="AT:N", type=at_n, help="after loading, insert N new layers (a "
                    "multiple of 4) before layer AT, each starting as the identity (deepen.py)")
    ap.add_argument("--new-lr-mult", type=float, default=1.0, help="the inserted layers' own tensors train at "
                    "this multiple of the learning rate")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    t0 = time.time()

    if args.resume:
        from tokenizers import Tokenizer
        model, cfg, tokenizer_json = load(args.resume, dtype=torch.float32)
        tok = Tokenizer.from_str(tokenizer_json)
        if args.split_names:
            tok = chat_format.split_names(tok)
            tokenizer_json = tok.to_str()
        print(f"resumed from {args.resume}: vocab {cfg.vocab}, eos {cfg.eos}", flush=True)
    else:
        base, base_cfg, base_tok = load(args.base, dtype=torch.float32)
        tok = chat_format.extend_tokenizer(base_tok)
        if args.split_names:
            tok = chat_format.split_names(tok)
        tokenizer_json = tok.to_str()
        added = len(chat_format.SPECIAL) + len(chat_format.MARKERS)
        cfg_json = base_cfg.json()
        cfg_json["vocab"] = base_cfg.vocab + added
        cfg_json["eos"] = tok.token_to_id(chat_format.END)
        cfg = Config.from_json(cfg_json, base_cfg.engram.table_rows if base_cfg.engram else 1)
        model = CqlmFloat(cfg)
        tensors = base.named_spec_tensors()
        emb = tensors["embed"]
        new_rows = emb.mean(0, keepdim=True) + torch.randn(
            added, emb.shape[1], generator=torch.Generator().manual_seed(args.seed)) * emb.std() * 0.5
        tensors["embed"] = torch.cat([emb, new_rows], 0)
        model.load_spec_tensors(tensors)
        del base
        print(f"base {args.base}: vocab {base_cfg.vocab} -> {cfg.vocab}, eos {cfg.eos}; "
              f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters", flush=True)

    new_names: set[str] = set()
    if args.insert_layers:
        at, n = args.insert_layers
        try:
            model, cfg, names = insert_layers(model, cfg, at, n)
        except ValueError as e:
            raise SystemExit(f"error: --insert-layers: {e}") from None
        new_names = set(names)
        print(f"inserted {n} layers at {at}: {cfg.layers} layers, engram sites "
              f"{cfg.engram.sites if cfg.engram else []}, "
              f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters", flush=True)

    tools = demo_tools.tools()
    train_convs = chat_format.load_jsonl(os.path.join(args.data, "chat_train.jsonl"))
    held_convs = chat_format.load_jsonl(os.path.join(HERE, "chat_heldout.jsonl"))
    cx, cm, dropped = chat_rows(train_convs, tok, tools, args.seq, cfg.bos, args.call_weight,
                                args.decision_weight)
    hx, hm, _ = chat_rows(held_convs, tok, tools, args.seq, cfg.bos, 2.0)  # 2: a call's tokens
    if args.copy_batch:
        kx, km, _ = chat_rows(chat_format.load_jsonl(os.path.join(args.data, "chat_copy.jsonl")), tok, tools,
                              args.seq, cfg.bos)
        klen = (kx != 0).sum(1)
        kord = np.argsort(klen, kind="stable")  # a batch is a run of similar lengths: little padding
        print(f"copy: {len(kx)} rows (mean {klen.mean():.0f} tokens)", flush=True)
    lengths = (cx != 0).sum(1)
    print(f"chat: {len(cx)} train rows ({dropped} longer than {args.seq} dropped; mean {lengths.mean():.0f} tokens, "
          f"{(cm > 0).sum() / len(cm):.0f} trained), {len(hx)} held out", flush=True)

    def encoded(name: str) -> tuple[np.ndarray, int]:
        """`name`.txt's tokens (cached beside it, by tokenizer: the chat tokens never occur in
        the text, but the pre-tokenizer changes its tokens)."""
        path = os.path.join(args.data, name + ".txt")
        digest = hashlib.sha256(tokenizer_json.encode()).hexdigest()[:12]
        cache = os.path.join(args.data, f"{name}.chat.{digest}.u16")
        if not os.path.exists(cache) or os.path.getmtime(cache) < os.path.getmtime(path):
            with open(path, encoding="utf-8") as f:
                encode_text(tok, f.read()).tofile(cache)
        return np.fromfile(cache, dtype="<u2").astype(np.int64), os.path.getsize(path)

    text, _ = encoded("train")
    val, val_bytes = encoded("val")
    bytes_per_token = val_bytes / len(val)
    print(f"text: train {len(text)} tokens, val {len(val)} ({bytes_per_token:.3f} bytes/token); "
          f"prepared in {time.time() - t0:.0f} s", flush=True)

    def decays(n: str, p: torch.Tensor) -> bool:
        return p.dim() == 2 and not n.startswith("mhc.b")

    groups = []
    for new in (False, True):
        for dec in (True, False):
            ps = [p for n, p in model.params.items() if decays(n, p) == dec and (n in new_names) == new]
            if ps:
                groups.append({"params": ps, "weight_decay": args.wd if dec else 0.0,
                               "lr_mult": args.new_lr_mult if new else 1.0})
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    def text_batch(data: np.ndarray, offs: np.ndarray, seq: int):
        y = data[offs[:, None] + np.arange(seq)[None, :]]
        x = np.concatenate([np.full((len(offs), 1), cfg.bos, dtype=np.int64), y[:, :-1]], 1)
        return x, y

    def logits_of(x: np.ndarray) -> torch.Tensor:
        rows = engram_indices(cfg, x.astype(np.uint32))
        return model(torch.from_numpy(x), rows)

    def chat_loss(x: np.ndarray, m: np.ndarray, reduction="mean") -> torch.Tensor:
        """Cross-entropy over the weighted tokens: the weighted mean, or for "sum" the plain
        sum over the trained tokens (the held-out loss, comparable across --call-weight)."""
        logits = logits_of(x)[:, :-1]
        y = torch.from_numpy(x[:, 1:])
        w = torch.from_numpy(m[:, 1:])
        mask = w > 0
        ce = F.cross_entropy(logits[mask], y[mask], reduction="none")
        if reduction == "sum":
            return ce.sum()
        wm = w[mask]
        return (ce * wm).sum() / wm.sum()

    val_rng = np.random.default_rng(7)
    val_offsets = val_rng.integers(0, len(val) - 256, size=(8, 16))

    def evaluate() -> tuple[float, float, float]:
        """Held-out chat loss (every assistant token), its tool calls' share, text bits/byte."""
        model.eval()
        with torch.no_grad():
            tot, n, call_tot, call_n = 0.0, 0, 0.0, 0
            for i in range(0, len(hx), 50):
                w = int((hx[i:i + 50] != 0).sum(1).max())
                m = hm[i:i + 50, :w]
                tot += chat_loss(hx[i:i + 50, :w], m, "sum").item()
                n += int((m[:, 1:] > 0).sum())
                call_tot += chat_loss(hx[i:i + 50, :w], (m == 2.0).astype(np.float32), "sum").item()
                call_n += int((m[:, 1:] == 2.0).sum())
            chat, call = tot / n, call_tot / max(1, call_n)
            tot, n = 0.0, 0
            for offs in val_offsets:
                x, y = text_batch(val, offs, 256)
                tot += F.cross_entropy(logits_of(x).reshape(-1, cfg.vocab), torch.from_numpy(y).reshape(-1),
                                       reduction="sum").item()
                n += y.size
        model.train()
        return chat, call, tot / n / math.log(2) / bytes_per_token

    out = os.path.join(args.data, "chat_float.safetensors")
    log = open(os.path.join(args.data, "chat_log.csv"), "w", newline="")
    writer = csv.writer(log)
    writer.writerow(["step", "seconds", "lr", "train_chat", "train_text", "heldout_chat", "val_bpb", "heldout_call"])
    start = time.time()
    run_chat = run_text = None

    def epoch() -> list[np.ndarray]:
        """Batches of similar lengths (sorted within windows of 32 batches), shuffled."""
        perm = rng.permutation(len(cx))
        out = []
        w = args.chat_batch * 32
        for i in range(0, len(perm) - args.chat_batch + 1, w):
            win = perm[i:i + w]
            win = win[np.argsort(lengths[win], kind="stable")]
            out += [win[j:j + args.chat_batch] for j in range(0, len(win) - args.chat_batch + 1, args.chat_batch)]
        return [out[k] for k in rng.permutation(len(out))]

    batches, pos = epoch(), 0
    model.train()
    step = 0
    while True:
        over = (args.max_minutes and (time.time() - start) / 60 >= args.max_minutes) or step == args.stop_at
        if step % args.eval_every == 0 or step == args.steps or over:
            hc, hcall, bpb = evaluate()
            elapsed = time.time() - start
            writer.writerow([step, f"{elapsed:.0f}", f"{lr_at(step):.2e}", f"{run_chat or float('nan'):.4f}",
                             f"{run_text or float('nan'):.4f}", f"{hc:.4f}", f"{bpb:.4f}", f"{hcall:.4f}"])
            log.flush()
            print(f"step {step:4d}  {elapsed / 60:5.1f} min  chat {run_chat or float('nan'):.4f} "
                  f"text {run_text or float('nan'):.4f}  held-out chat {hc:.4f} (calls {hcall:.4f})  val bpb {bpb:.4f}",
                  flush=True)
            export(model, cfg, tokenizer_json, out, {"step": step, "seconds": round(elapsed), "heldout_chat_loss": hc,
                                                     "val_bpb_sampled": bpb, "args": vars(args)})
        if step == args.steps or over:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step) * g["lr_mult"]
        if pos == len(batches):
            batches, pos = epoch(), 0
        idx = batches[pos]
        pos += 1
        width = int(lengths[idx].max())
        lc = chat_loss(cx[idx, :width], cm[idx, :width])
        if args.copy_batch:
            s0 = int(rng.integers(0, len(kx) - args.copy_batch + 1))
            k = kord[s0:s0 + args.copy_batch]
            w = int(klen[k].max())
            lc = (lc * args.chat_batch + chat_loss(kx[k, :w], km[k, :w]) * args.copy_batch) / (
                args.chat_batch + args.copy_batch)
        x, y = text_batch(text, rng.integers(0, len(text) - args.text_seq, size=args.text_batch), args.text_seq)
        lt = F.cross_entropy(logits_of(x).reshape(-1, cfg.vocab), torch.from_numpy(y).reshape(-1))
        loss = lc + lt
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run_chat = lc.item() if run_chat is None else 0.95 * run_chat + 0.05 * lc.item()
        run_text = lt.item() if run_text is None else 0.95 * run_text + 0.05 * lt.item()
        step += 1
        if step % 20 == 0:
            print(f"  step {step:4d} chat {lc.item():.4f} text {lt.item():.4f} "
                  f"({(time.time() - start) / step:.2f} s/step)", flush=True)
    log.close()


if __name__ == "__main__":
    main()
