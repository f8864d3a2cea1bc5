#!/usr/bin/env bash
# Issue 37's benchmark: Qwen3.8-Flash-Next's real shapes cut to LAYERS layers (FP8, the real-size
# n-gram table as sparse-file holes), `ellm bench` against the limits measured in the same run:
# prefill at PROMPTS, decode at batch 1 at 64 positions and at CONTEXTS, the table's resident
# share and page faults per token, and a prefill with the table's pages dropped (cold).
# CONTEXTS are decoded over a zeroed cache and state (--zero-context: the same bytes read and
# work done, without the hours a 128k prefill takes on a small machine); ZERO_CONTEXT=0 prefills
# them instead.
# Usage: bench/qwen38_flash_next.sh [MODEL_DIR] (written by make-model when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-/work/models/qwen3.8-flash-next-l4-fp8}
layers=${LAYERS:-4}
prompts=${PROMPTS:-512,2048}
contexts=${CONTEXTS:-4096,131072}
zero=()
[ "${ZERO_CONTEXT:-1}" = 1 ] && zero=(--zero-context)
if [ ! -f "$model/config.json" ]; then
  # Without its vision tower (27 blocks, 0.9 GB): issue 37's memory figure is the text decoder's;
  # the tower is Qwen3.6-27B's, measured in the README's Images section.
  build/ellm make-model --preset qwen3.8-flash-next --layers "$layers" --dtype fp8 --no-vision --out "$model"
fi
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/Flags:.*\(avx512[a-z_0-9]*\|amx[a-z_0-9]*\).*/Flags: (avx512\/amx present)/' | head -3
du -sh --apparent-size "$model"; du -sh "$model"
build/ellm bench --model-path "$model" --prompt-lengths "$prompts" --decode-batches 1 \
  --decode-contexts "$contexts" "${zero[@]}" --decode-steps 16 --busy false --json "${JSON:-/tmp/qwen38_bench.json}"
