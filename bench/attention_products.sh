#!/usr/bin/env bash
# ellm bench with attention in FP32 and on BF16 products (--attention-products), alternating,
# ROUNDS times, on one model: prefill at PROMPTS tokens (tok/s, attention's share of the pass and
# its TFLOP/s against the tier's BF16 peak) and decode at batch 1 over CONTEXTS positions of a
# zeroed KV cache (tok/s, attention's share of the step). Prints one table.
#
#   bash bench/attention_products.sh
#
# Environment: MODEL [/work/models/qwen3-0.6b; made with `ellm make-model --preset qwen3-0.6b`
# when missing], ELLM [build/ellm], PROMPTS [512,2048,8192], CONTEXTS [8192,32768], ROUNDS [1],
# OUT [/tmp/attention_products].
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-/work/models/qwen3-0.6b}
ELLM=${ELLM:-build/ellm}
PROMPTS=${PROMPTS:-512,2048,8192}
CONTEXTS=${CONTEXTS:-8192,32768}
ROUNDS=${ROUNDS:-1}
OUT=${OUT:-/tmp/attention_products}
mkdir -p "$OUT"
[ -d "$MODEL" ] || "$ELLM" make-model --preset qwen3-0.6b --out "$MODEL"
for round in $(seq "$ROUNDS"); do
  for mode in fp32 bf16; do
    "$ELLM" bench --model-path "$MODEL" --prompt-lengths "$PROMPTS" --decode-batches 1 \
      --decode-contexts "$CONTEXTS" --zero-context --busy false --image-size "" \
      --attention-products "$mode" --json "$OUT/$mode-$round.jsonl" > "$OUT/$mode-$round.log" 2>&1
  done
done
grep -h -m1 "^loaded" "$OUT"/bf16-1.log || true
python3 -c "import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])]; sys.exit(0 if any(r.get('attention_products') == 'bf16' for r in rows) else 1)" \
  "$OUT/bf16-1.jsonl" || echo "note: BF16 products are not in effect here (see the load line); both columns are FP32"
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for mode in ("fp32", "bf16"):
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{mode}-{r}.jsonl"):
            j = json.loads(line)
            if j.get("kind") == "prefill":
                key = ("prefill", j["prompt_tokens"] if "prompt_tokens" in j else j.get("tokens"))
                a = j["attention"]
                rows.setdefault(key, {}).setdefault(mode, []).append(
                    (j["tokens_per_s"], a["share_of_time"], a["tflops"], a["fraction_of_peak"]))
            elif j.get("kind") in ("decode_context",):
                key = ("decode", j["context"])
                share = next((o["share"] for o in j.get("ops", []) if o["op"] == "attention"), 0.0)
                rows.setdefault(key, {}).setdefault(mode, []).append((j["tokens_per_s"], share, 0, 0))
print("| | FP32 tok/s | BF16 tok/s | BF16 / FP32 | attention's share, FP32 -> BF16 | attention TFLOP/s (of the BF16 peak), FP32 -> BF16 |")
print("| --- | --- | --- | --- | --- | --- |")
for (kind, n), modes in sorted(rows.items()):
    f, b = modes.get("fp32", []), modes.get("bf16", [])
    if not f or not b: continue
    ft = "/".join(f"{x[0]:.1f}" for x in f); bt = "/".join(f"{x[0]:.1f}" for x in b)
    ratio = sum(x[0] for x in b) / sum(x[0] for x in f)
    share = f"{100*f[0][1]:.0f}% -> {100*b[0][1]:.0f}%"
    fl = f"{f[0][2]:.3f} ({100*f[0][3]:.0f}%) -> {b[0][2]:.3f} ({100*b[0][3]:.0f}%)" if kind == "prefill" else ""
    label = f"prefill {n}" if kind == "prefill" else f"decode b1 at {n} positions"
    print(f"| {label} | {ft} | {bt} | {ratio:.2f} | {share} | {fl} |")
PY
