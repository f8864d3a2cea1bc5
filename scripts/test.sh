#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a full test run: dependencies, build, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
# The end-to-end tests' npm packages (the openai and anthropic clients, Qwen Code, Claude Code, Codex,
# Node 22), when package.json's are not all there.
(cd tests/e2e && { npm ls --silent >/dev/null 2>&1 || npm install --no-audit --no-fund --silent >/dev/null 2>&1; }) ||
  echo "warning: npm install failed; the client and agent tests will fail"
cd build
ctest --output-on-failure -j 2 "$@"
