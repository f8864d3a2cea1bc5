#!/usr/bin/env bash
# ellm INT4 beside llama.cpp Q4_K_M on one random Qwen3-0.6B-shaped model, same machine, same
# threads, runs alternating: llama-bench (pp512, pp2048, tg128) then ellm bench (--quantize int4,
# beside BF16 and FP8), ROUNDS times. Writes everything to OUT (raw outputs, the recipe) and prints
# a table. Nothing of llama.cpp is kept in this repository: it is built from source outside it.
#
#   bash bench/llama_cpp_side_by_side.sh [stage...]      stages: build convert bench (default: all)
#
# Environment (defaults in brackets):
#   LLAMA_GIT     a git directory holding llama.cpp [/work/.mirror/unslothai+llama.cpp/repo: a
#                 mirror whose commit below is upstream ggml-org/llama.cpp's]
#   LLAMA_COMMIT  [82bb48500, upstream master of 2026-08-07]
#   LLAMA_SRC     where it is unpacked and built [/work/llama.cpp]
#   MODEL         the Hugging Face folder [/work/models/qwen3-0.6b; made with `ellm make-model
#                 --preset qwen3-0.6b` when missing]
#   ELLM          the ellm binary [build/ellm]     THREADS [2]     ROUNDS [2]
#   OUT           [/tmp/llama_cpp_side_by_side]
#
# The GGUF: llama.cpp's convert_hf_to_gguf.py needs PyTorch >= 2.1 (float8 dtypes), which Debian 12
# does not ship (python3-torch 1.13), so bench/hf_to_gguf_qwen3.py writes the BF16 GGUF with
# llama.cpp's own gguf-py (numpy only: Debian's python3-numpy, python3-yaml) with the tensor names
# and metadata convert_hf_to_gguf.py gives Qwen3ForCausalLM; llama-quantize makes Q4_K_M of it.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
LLAMA_GIT=${LLAMA_GIT:-/work/.mirror/unslothai+llama.cpp/repo}
LLAMA_COMMIT=${LLAMA_COMMIT:-82bb48500}
LLAMA_SRC=${LLAMA_SRC:-/work/llama.cpp}
MODEL=${MODEL:-/work/models/qwen3-0.6b}
ELLM=${ELLM:-$REPO/build/ellm}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-/tmp/llama_cpp_side_by_side}
STAGES=${*:-build convert bench}
mkdir -p "$OUT"
GGUF_BF16=$OUT/model-bf16.gguf
GGUF_Q4=$OUT/model-q4_k_m.gguf

has_stage() { [[ " $STAGES " == *" $1 "* ]]; }

if has_stage build; then
  if [ ! -f "$LLAMA_SRC/CMakeLists.txt" ]; then
    # Unpack the commit's files (a mirror may lack some large docs and vocab test files, which the
    # build does not need).
    mkdir -p "$LLAMA_SRC"
    present=$(git --git-dir="$LLAMA_GIT" ls-tree -r "$LLAMA_COMMIT" |
      awk '{print $3, $4}' | while read -r sha path; do
        git --git-dir="$LLAMA_GIT" cat-file -e "$sha" 2>/dev/null && echo "$path"; done)
    # shellcheck disable=SC2086
    git --git-dir="$LLAMA_GIT" archive --format=tar "$LLAMA_COMMIT" $present 2>/dev/null |
      tar -x -C "$LLAMA_SRC" || true
  fi
  cmake -S "$LLAMA_SRC" -B "$LLAMA_SRC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_APP=OFF >/dev/null
  cmake --build "$LLAMA_SRC/build" -j "$(nproc)" --target llama-bench llama-quantize
fi

if has_stage convert; then
  [ -d "$MODEL" ] || "$ELLM" make-model --preset qwen3-0.6b --out "$MODEL"
  PYTHONPATH="$LLAMA_SRC/gguf-py" /usr/bin/python3 bench/hf_to_gguf_qwen3.py "$MODEL" "$GGUF_BF16"
  "$LLAMA_SRC/build/bin/llama-quantize" "$GGUF_BF16" "$GGUF_Q4" Q4_K_M "$THREADS" > "$OUT/quantize.log" 2>&1
  tail -3 "$OUT/quantize.log"
fi

if has_stage bench; then
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cores, threads $THREADS"
    echo "ellm: $(git -C "$REPO" rev-parse --short HEAD) ($ELLM)"
    echo "llama.cpp: $LLAMA_COMMIT from $LLAMA_GIT, built in $LLAMA_SRC/build (GGML_NATIVE=ON)"
    echo "model: $MODEL; GGUF $GGUF_Q4 ($(stat -c %s "$GGUF_Q4") bytes)"
    echo "llama-bench: -m $GGUF_Q4 -t $THREADS -p 512,2048 -n 128 -r 3 -o json"
    echo "ellm bench: --model-path $MODEL --threads $THREADS --quantize int4 --activations bf16,int8 --prompt-lengths 512,2048 --decode-batches 1,4 --decode-contexts 512 --zero-context --busy false"
  } > "$OUT/recipe.txt"
  cat "$OUT/recipe.txt"
  for round in $(seq 1 "$ROUNDS"); do
    echo "round $round: load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/recipe.txt"
    "$LLAMA_SRC/build/bin/llama-bench" -m "$GGUF_Q4" -t "$THREADS" -p 512,2048 -n 128 -r 3 -o json \
      > "$OUT/llama-bench-$round.json" 2> "$OUT/llama-bench-$round.log"
    "$ELLM" bench --model-path "$MODEL" --threads "$THREADS" --quantize int4 --activations bf16,int8 \
      --prompt-lengths 512,2048 --decode-batches 1,4 --decode-contexts 512 --zero-context \
      --busy false --json "$OUT/ellm-$round.jsonl" > "$OUT/ellm-$round.txt" 2>&1
  done
  /usr/bin/python3 - "$OUT" "$ROUNDS" <<'EOF'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print("\n| figure | " + " | ".join(["ellm BF16", "ellm FP8", "ellm INT4 (BF16 act.)",
                                      "ellm INT4 (int8 act.)", "llama.cpp Q4_K_M"]) + " |")
print("| --- | --- | --- | --- | --- | --- |")
cols = ["bf16", "fp8", "int4/bf16", "int4/int8"]
figures = {}
for r in range(1, rounds + 1):
    for line in open(f"{out}/ellm-{r}.jsonl"):
        row = json.loads(line)
        w = row.get("weights")
        if row["kind"] == "decode" and row["batch"] == 1:
            figures.setdefault(("decode b1 tok/s", w), []).append(row["tokens_per_s"])
        if row["kind"] == "prefill":
            figures.setdefault((f"prefill {row['tokens']} tok/s", w), []).append(row["tokens_per_s"])
    for row in json.load(open(f"{out}/llama-bench-{r}.json")):
        name = "decode b1 tok/s" if row["n_gen"] > 0 else f"prefill {row['n_prompt']} tok/s"
        figures.setdefault((name, "llama"), []).append(row["avg_ts"])
for name in ["decode b1 tok/s", "prefill 512 tok/s", "prefill 2048 tok/s"]:
    cells = [" / ".join(f"{v:.1f}" for v in figures.get((name, c), [])) or "-" for c in cols + ["llama"]]
    print(f"| {name} | " + " | ".join(cells) + " |")
EOF
fi
