#!/usr/bin/env bash
# From the fine-tuned chat checkpoint to everything the repository ships and records:
#   models/cqlm-small.safetensors     the built-in model (cqlm pack, 4 bits, chat template)
#   tests/fixtures/trained/           what the Rust tests compare against (PyTorch side)
#   tests/fixtures/chat/rendered.json the Python rendering of chat conversations (template check)
#   tools/train/data/chat_eval_*.json the held-out chat evaluation through the engine
# Run after `python3 tools/train/finetune.py ...` (tools/train/README.md); the archive is
# compiled into the binary, so the binary is rebuilt before the evaluation.
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=tools/train/data
FLOAT=${FLOAT:-$DATA/chat_float.safetensors}
PY=${PYTHON:-python3}
CQLM=target/release/cqlm
tools/train/pack_chat.sh "$FLOAT" models/cqlm-small.safetensors | tee "$DATA/pack4.txt"
"$PY" tools/train/evaluate.py fixtures --archive models/cqlm-small.safetensors \
    --float "$FLOAT" --out tests/fixtures/trained
"$PY" tools/train/chat_fixtures.py
cargo build --release
for backend in cpu; do
  "$PY" tools/train/evaluate.py chat --cqlm "$CQLM" --backend "$backend" \
      --log "$DATA/chat_eval_$backend.jsonl" | tee "$DATA/chat_eval_$backend.json"
done
