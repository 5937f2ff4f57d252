#!/usr/bin/env bash
# The shipped chat model, from the prose model it was fine-tuned from, as it was trained:
# three runs of finetune.py, each resuming from the last (the first two were stopped early,
# replayed here with --stop-at; their logs, as they ran, are tools/train/chat_log.csv). ~75 minutes on 2 CPU cores. Then tools/train/ship.sh packs and ships.
#
#   pip install torch numpy tokenizers safetensors jinja2 rdata
#   python3 tools/train/corpus.py && tools/train/finetune.sh && tools/train/ship.sh
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
D=data
mkdir -p "$D"
# The prose model (the built-in model before this fine-tune), from the repository's history.
git show 16e85b4:models/cqlm-small.safetensors > "$D/base.safetensors"
COMMON=(--chat-batch 16 --text-batch 6 --text-seq 256 --lr 1e-3)

# 1. Tool conversations and text (400 of a 1300-step schedule). After it the model names the
#    right tool but copies no argument.
"$PY" chat_data.py
"$PY" finetune.py --base "$D/base.safetensors" --steps 1300 "${COMMON[@]}" --eval-every 200 --stop-at 400
cp "$D/chat_float.safetensors" "$D/chat_float_stage1.safetensors"; cp "$D/chat_log.csv" "$D/chat_log_stage1.csv"

# 2. + 16 say-it-back rows a step, short spans (150 of 900).
"$PY" chat_data.py --copy-max-words 8 --copy-max-names 3
"$PY" finetune.py --resume "$D/chat_float_stage1.safetensors" --steps 900 "${COMMON[@]}" --copy-batch 16 \
    --warmup 20 --eval-every 150 --stop-at 150
cp "$D/chat_float.safetensors" "$D/chat_float_stage2.safetensors"; cp "$D/chat_log.csv" "$D/chat_log_stage2.csv"

# 3. 48 say-it-back rows a step, longer spans, fewer tool conversations.
"$PY" chat_data.py
"$PY" finetune.py --resume "$D/chat_float_stage2.safetensors" --steps 600 --chat-batch 12 --copy-batch 48 \
    --text-batch 5 --text-seq 256 --lr 1e-3 --warmup 10 --eval-every 150 --stop-at 600
