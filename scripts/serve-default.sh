#!/usr/bin/env bash
# The first command of the README: dependencies, build, the built-in default model (made once),
# then `ellm serve` on it. Extra arguments go to `ellm serve` (e.g. --port 9000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
model=models/default
if [ ! -f "$model/config.json" ]; then
  echo "making the default model in $model"
  build/ellm make-model --preset tiny --out "$model"
fi
exec build/ellm serve --model-path "$model" "$@"
