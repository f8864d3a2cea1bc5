#!/usr/bin/env bash
# Configures and builds ellm into build/ (or $BUILD_DIR) with extra CMake flags from the args.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
