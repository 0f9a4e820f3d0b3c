#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the tests:
#   bash scripts/test.sh           everything (CI): the C++ suites of the torch-free layers
#                                  (GoogleTest via CTest, the layer check), the same under
#                                  ASan/UBSan and TSan, the examples against the installed wheel
#                                  in a fresh venv (scripts/check_installed.sh), all Python tests
#   bash scripts/test.sh --quick   the C++ suites and the Python tests not marked slow
# Arguments after the flag go to pytest (e.g. -k barrier). The Python tests import the stragg
# installed in .venv (a wheel, see scripts/setup.sh), never the source tree.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0
if [ "${1:-}" = --quick ]; then
  QUICK=1
  shift
fi
phase_start=$SECONDS
phase() {  # prints how long the previous phase took, then the next one's title
  echo "test: $((SECONDS - phase_start)) s"
  phase_start=$SECONDS
  echo "== $1 =="
}
echo "== Setup =="
bash scripts/setup.sh

phase "C++ tests of the torch-free layers"
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

# The same suites under ASan + UBSan, and the threaded ones under TSan (not with --quick;
# STRAGG_SANITIZERS=none also skips them).
if [ $QUICK = 0 ] && [ "${STRAGG_SANITIZERS:-}" != none ]; then
  phase "C++ tests under sanitizers"
  bash scripts/sanitizers.sh
fi

if [ $QUICK = 0 ]; then
  phase "Installed package: the wheel in a fresh venv, demo and a benchmark outside the tree"
  bash scripts/check_installed.sh
fi

phase "Python tests"
MARK=()
[ $QUICK = 1 ] && MARK=(-m "not slow")
STRAGG_TEST_REQUIRE=1 .venv/bin/python -m pytest tests --durations=15 "${MARK[@]}" "$@"
phase "done"
