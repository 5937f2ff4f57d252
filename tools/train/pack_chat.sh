#!/usr/bin/env bash
# Pack a chat checkpoint as the built-in model is packed: 4 bits everywhere, the chat template
# and the tool-call markers stored in the archive. The one place these flags live: ship.sh packs
# the shipped model with it, finetune.sh the archives that later runs resume from.
#
#   tools/train/pack_chat.sh FLOAT OUT     # paths as seen from the caller's directory
#
# Builds cqlm (release) first; prints `cqlm pack`'s report.
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: $0 FLOAT OUT" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml"
"$ROOT/target/release/cqlm" pack --model "$1" --bits all=4 --chat-template "$HERE/chat_template.jinja" \
    --tool-call-markers "<tool_call>" "</tool_call>" --out "$2"
