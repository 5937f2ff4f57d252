#!/usr/bin/env python3
"""Train cqlm's byte-level BPE tokenizer and pre-tokenize the corpus.

Input : <data>/train.txt, <data>/val.txt (from corpus.py), tools/train/heldout.txt
Output: <data>/tokenizer.json   HF `tokenizers` format (loads with the Rust crate)
        <data>/train.u16, <data>/val.u16   raw little-endian uint16 token ids

Tokenizer spec:
  * model: BPE, vocab_size 4096, min_frequency 2, byte-level initial alphabet
    (all 256 bytes present, so every input is encodable; no <unk>)
  * special tokens exactly ["<pad>", "<bos>", "<eos>"] -> ids 0, 1, 2
  * pre-tokenizer: ByteLevel(add_prefix_space=False, use_regex=True)
  * decoder: ByteLevel
  * post-processor: ByteLevel(trim_offsets=False) only -- it does NOT add <bos>
    or <eos>. The Rust side prepends <bos> (id 1) itself when missing.
  * no normalizer.

The .u16 files are the plain concatenation of the ids of each paragraph-group
batch, in file order, with no <bos>/<eos> inserted between them. Encoding is
done in slices of whole paragraphs (split on blank lines, the separator kept
with the preceding slice) so that concatenating the pieces reproduces the text
byte-for-byte.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "data")
HELDOUT = os.path.join(HERE, "heldout.txt")

VOCAB_SIZE = 4096
SPECIALS = ["<pad>", "<bos>", "<eos>"]


def build_tokenizer(train_path: str) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([train_path], trainer)
    return tok


def pieces(text: str, target: int = 16384):
    """Split text into slices of whole paragraphs (~target chars) whose
    concatenation is exactly `text`."""
    out, start, n = [], 0, len(text)
    while start < n:
        end = start + target
        if end >= n:
            out.append(text[start:])
            break
        j = text.find("\n\n", end)
        if j < 0:
            out.append(text[start:])
            break
        j += 2
        while j < n and text[j] == "\n":
            j += 1
        out.append(text[start:j])
        start = j
    return out


def encode_text(tok: Tokenizer, text: str) -> np.ndarray:
    ps = pieces(text)
    ids = []
    B = 256
    for i in range(0, len(ps), B):
        for enc in tok.encode_batch(ps[i:i + B], add_special_tokens=False):
            ids.extend(enc.ids)
    arr = np.asarray(ids, dtype=np.int64)
    assert arr.size == 0 or (arr.min() >= 0 and arr.max() < 65536)
    return arr.astype("<u2")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=DEFAULT_DATA, help="data dir (default: %(default)s)")
    ap.add_argument("--heldout", default=HELDOUT, help="heldout fixture (default: %(default)s)")
    args = ap.parse_args()

    train_path = os.path.join(args.data, "train.txt")
    tok = build_tokenizer(train_path)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    tok_path = os.path.join(args.data, "tokenizer.json")
    tok.save(tok_path)

    # reload from disk so the encodings below come from exactly the saved file
    tok = Tokenizer.from_file(tok_path)
    stats = {}
    for split in ("train", "val"):
        with open(os.path.join(args.data, f"{split}.txt"), encoding="utf-8") as f:
            text = f.read()
        ids = encode_text(tok, text)
        ids.tofile(os.path.join(args.data, f"{split}.u16"))
        nbytes = len(text.encode("utf-8"))
        stats[split] = {"bytes": nbytes, "tokens": int(ids.size), "bytes_per_token": nbytes / max(1, ids.size)}
        print(f"{split}: {nbytes:,} bytes -> {ids.size:,} tokens, {nbytes / ids.size:.3f} bytes/token")

    with open(args.heldout, encoding="utf-8") as f:
        held = f.read()
    hid = tok.encode(held, add_special_tokens=False).ids
    hb = len(held.encode("utf-8"))
    assert tok.decode(hid) == held, "heldout does not round-trip"
    stats["heldout"] = {"bytes": hb, "tokens": len(hid), "bytes_per_token": hb / len(hid)}
    print(f"heldout: {hb:,} bytes -> {len(hid):,} tokens, {hb / len(hid):.3f} bytes/token")

    with open(os.path.join(args.data, "tokens.json"), "w") as f:
        json.dump(stats, f, indent=2, sort_keys=True)
        f.write("\n")

    # sanity: round trip of a prefix of val and of the specials
    enc = tok.encode("<bos>Hello, world!<eos>")
    print("sample ids:", enc.ids, "->", repr(tok.decode(enc.ids, skip_special_tokens=False)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
