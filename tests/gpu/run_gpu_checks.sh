#!/usr/bin/env bash
# Runs every check that needs a real GPU (tests/gpu/README.md), failing instead of skipping when
# a check cannot run. Usage, on a machine with a CUDA GPU and nvcc:
#   bash tests/gpu/run_gpu_checks.sh            # all of it
#   PYTHON=/path/to/cuda-torch/python bash tests/gpu/run_gpu_checks.sh   # the backend's GPU path
#                                               # with a CUDA torch (see README.md)
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${PYTHON:-}" ]; then
  [ -x .venv/bin/python ] || bash scripts/setup.sh || exit 1
  PYTHON=$PWD/.venv/bin/python
fi
BUILD=build/gpu
export STRAGG_TEST_REQUIRE=1
status=0
step() { echo; echo "== $*"; }

step "build: kernels, GPU tests, bench_reduce (STRAGG_CUDA=on)"
cmake -S . -B "$BUILD" -DSTRAGG_TORCH=OFF -DSTRAGG_PYTHON=OFF -DSTRAGG_BUILD_TESTS=ON \
  -DSTRAGG_CUDA=on -DPython_EXECUTABLE="$PYTHON" >/dev/null &&
  cmake --build "$BUILD" -j --target stragg_cuda_check || exit 1

step "1-3: kernels bitwise vs the CPU on the device; CUDA IPC 2 and 4 ranks; NCCL 1 rank"
ctest --test-dir "$BUILD" -L gpu --output-on-failure || status=1

step "4: kernel roofline: every dtype x op at >= 90% of cudaMemcpy D2D memory bandwidth"
"$BUILD/kernels/bench_reduce" --min-pct 90 || status=1

step "5-6: the backend's CUDA path and its stream semantics (dist.all_reduce on CUDA tensors)"
# test_gpu.py skips without torch.cuda or without the compiled GPU path: require both here.
"$PYTHON" -c "import torch, stragg._C as C
assert torch.cuda.is_available(), 'this torch has no CUDA (torch.version.cuda=%s)' % torch.version.cuda
assert C.cuda_allreduce_compiled, 'stragg._C was built without STRAGG_BACKEND_CUDA'" || {
  echo "the backend's GPU path cannot run with $PYTHON: see tests/gpu/README.md"; status=1; }
"$PYTHON" -m pytest tests/gpu -ra || status=1

echo
[ "$status" -eq 0 ] && echo "all GPU checks passed" || echo "some GPU checks FAILED"
exit "$status"
