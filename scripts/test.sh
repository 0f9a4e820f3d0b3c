#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the tests:
#   bash scripts/test.sh           everything (CI): the C++ suites of the torch-free layers
#                                  (GoogleTest via CTest, the layer check), the same under
#                                  ASan/UBSan and TSan, the examples against the installed wheel
#                                  in a fresh venv (scripts/check_installed.sh), all Python tests
#   bash scripts/test.sh --quick   the C++ suites and the Python tests not marked slow
# Arguments after the flag go to pytest (e.g. -k barrier). The Python tests import the stragg
# installed in .venv (a wheel, see scripts/setup.sh), never the source tree. They run in
# STRAGG_TEST_WORKERS pytest-xdist processes (default: the core count, at least 2: most tests
# wait on spawned ranks and emulated links; 0 runs them in one process).
#
# Two lanes share the cores: the C++ lane (build, suites, sanitizers; its output goes to
# build/ci-cpp.log and is printed when it ends) runs while the Python side sets up (pip is
# mostly I/O) and checks the wheel; the Python tests start once both are done, on idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0
if [ "${1:-}" = --quick ]; then
  QUICK=1
  shift
fi
source scripts/kill_tree.sh
start=$SECONDS
phase_start=$SECONDS
phase() {  # prints how long the previous phase took, then the next one's title
  echo "test: $((SECONDS - phase_start)) s"
  phase_start=$SECONDS
  echo "== $1 =="
}

cpp_lane() {
  local t0=$SECONDS
  echo "== C++ tests of the torch-free layers =="
  # With nvcc on PATH the same build also compiles every GPU source (kernels/, tests/gpu/:
  # target stragg_cuda_check); the GPU suites then skip at runtime on machines without a CUDA
  # device. NCCL's headers come from .venv's wheel (scripts/setup.sh --cpp).
  local cuda=off
  if command -v nvcc >/dev/null 2>&1; then
    cuda=on
  else
    echo "test: nvcc not found: skipping the CUDA compile check (kernels/, tests/gpu/)"
  fi
  cmake -S . -B build/ctest -DSTRAGG_TORCH=OFF -DSTRAGG_PYTHON=OFF -DSTRAGG_BUILD_TESTS=ON \
    -DSTRAGG_CUDA="$cuda" -DPython_EXECUTABLE="$PWD/.venv/bin/python" >/dev/null
  cmake --build build/ctest -j "$(nproc)"
  if [ $cuda = on ]; then
    cmake --build build/ctest --target stragg_cuda_check -j "$(nproc)"
    echo "test: CUDA compile check passed (GPU suites skip without a CUDA device)"
  fi
  ctest --test-dir build/ctest --output-on-failure -j "$(nproc)"
  echo "test: C++ suites: $((SECONDS - t0)) s"
  # The same suites under ASan + UBSan, and the threaded ones under TSan (not with --quick;
  # STRAGG_SANITIZERS=none also skips them).
  if [ $QUICK = 0 ] && [ "${STRAGG_SANITIZERS:-}" != none ]; then
    t0=$SECONDS
    bash scripts/sanitizers.sh
    echo "test: sanitizers: $((SECONDS - t0)) s"
  fi
}

echo "== Setup =="
bash scripts/setup.sh --cpp  # what the C++ lane needs: compilers, GoogleTest, NCCL's headers
mkdir -p build
CPP_LOG=build/ci-cpp.log
cpp_lane >"$CPP_LOG" 2>&1 &
cpp_pid=$!
trap '[ -z "$cpp_pid" ] || kill_tree "$cpp_pid"' EXIT
echo "test: the C++ lane runs in the background (log: $CPP_LOG)"
bash scripts/setup.sh

if [ $QUICK = 0 ]; then
  phase "Installed package: the wheel in a fresh venv, demo and a benchmark outside the tree"
  bash scripts/check_installed.sh
fi

phase "C++ lane (waiting for it)"
cpp_status=0
wait "$cpp_pid" || cpp_status=$?
cpp_pid=""
cat "$CPP_LOG"
if [ $cpp_status != 0 ]; then
  echo "test: the C++ lane failed (exit $cpp_status): see its output above" >&2
  exit 1
fi

if [ $QUICK = 0 ] && command -v nvcc >/dev/null 2>&1; then
  # Everything of the GPU run that needs no GPU, on the C++ lane's CUDA build (tests/gpu/README.md).
  phase "GPU run, dry (tests/gpu/run_gpu_checks.sh --dry-run, on build/ctest)"
  STRAGG_GPU_BUILD=build/ctest bash tests/gpu/run_gpu_checks.sh --dry-run build/gpu-dry-run
fi

phase "Python tests"
MARK=()
[ $QUICK = 1 ] && MARK=(-m "not slow")
WORKERS=${STRAGG_TEST_WORKERS:-$(( $(nproc) > 2 ? $(nproc) : 2 ))}
STRAGG_TEST_REQUIRE=1 .venv/bin/python -m pytest tests -n "$WORKERS" --durations=15 "${MARK[@]}" "$@"
phase "done"
echo "test: total $((SECONDS - start)) s"
