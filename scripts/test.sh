#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every test: the C++ suites of the torch-free layers
# (GoogleTest via CTest), the examples against a regular install of the wheel
# (scripts/check_installed.sh) and the multi-process Python suite (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

echo "== C++ tests (csrc/core, csrc/runtime) =="
# With nvcc on PATH the same build also compiles every GPU source (kernels/, tests/gpu/: target
# stragg_cuda_check); the GPU suites then skip at runtime on machines without a CUDA device.
if command -v nvcc >/dev/null 2>&1; then
  STRAGG_CUDA_MODE=on
else
  STRAGG_CUDA_MODE=off
  echo "test: nvcc not found: skipping the CUDA compile check (kernels/, tests/gpu/)"
fi
cmake -S . -B build/ctest -DSTRAGG_TORCH=OFF -DSTRAGG_PYTHON=OFF -DSTRAGG_BUILD_TESTS=ON \
  -DSTRAGG_CUDA="$STRAGG_CUDA_MODE" -DPython_EXECUTABLE="$PWD/.venv/bin/python" >/dev/null
cmake --build build/ctest -j "$(nproc)"
if [ "$STRAGG_CUDA_MODE" = on ]; then
  cmake --build build/ctest --target stragg_cuda_check -j "$(nproc)"
  echo "test: CUDA compile check passed (GPU suites skip without a CUDA device)"
fi
ctest --test-dir build/ctest --output-on-failure -j 2

# The same suites under ASan + UBSan, and the threaded ones under TSan (STRAGG_SANITIZERS=none
# skips them for a quick local run).
if [ "${STRAGG_SANITIZERS:-}" != none ]; then
  bash scripts/sanitizers.sh
fi

echo "== Installed package: wheel in a fresh venv, demo and a benchmark outside the tree =="
bash scripts/check_installed.sh

echo "== Python tests =="
STRAGG_TEST_REQUIRE=1 .venv/bin/python -m pytest tests "$@"
