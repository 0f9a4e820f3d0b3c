#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every test: the C++ suites of the torch-free layers
# (GoogleTest via CTest) and the multi-process Python suite (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

echo "== C++ tests (csrc/core, csrc/runtime) =="
cmake -S . -B build/ctest -DSTRAGG_TORCH=OFF -DSTRAGG_PYTHON=OFF -DSTRAGG_BUILD_TESTS=ON \
  -DPython_EXECUTABLE="$PWD/.venv/bin/python" >/dev/null
cmake --build build/ctest -j "$(nproc)"
ctest --test-dir build/ctest --output-on-failure -j 2

echo "== Python tests =="
STRAGG_TEST_REQUIRE=1 .venv/bin/python -m pytest tests "$@"
