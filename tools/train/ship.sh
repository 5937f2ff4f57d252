#!/usr/bin/env bash
# From the trained float checkpoint to everything the repository ships and records:
#   models/cqlm-small.safetensors     the built-in model (cqlm pack, 4 bits)
#   tests/fixtures/trained/           what the Rust tests compare against (PyTorch side)
#   tools/train/data/                 the 2-bit-attention variant and the figures
# Run after `python3 tools/train/train.py --compile`; then rebuild (the archive is
# compiled into the binary) and run `cqlm eval` on both backends (tools/train/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=tools/train/data
cargo build --release
CQLM=target/release/cqlm
"$CQLM" pack --model "$DATA/float.safetensors" --bits all=4 --out models/cqlm-small.safetensors | tee "$DATA/pack4.txt"
"$CQLM" pack --model "$DATA/float.safetensors" --bits all=4,attn=2 --out "$DATA/cqlm-small-attn2.safetensors" | tee "$DATA/pack_attn2.txt"
python3 tools/train/evaluate.py fixtures --archive models/cqlm-small.safetensors \
    --float "$DATA/float.safetensors" --out tests/fixtures/trained
python3 tools/train/evaluate.py bpb --model "$DATA/cqlm-small-attn2.safetensors" --kv-int8 \
    --text tools/train/heldout.txt | tee "$DATA/attn2_heldout.json"
cargo build --release
