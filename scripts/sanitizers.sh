#!/usr/bin/env bash
# The C++ suites of the torch-free layers under sanitizers (called by scripts/test.sh; also
# runnable alone after scripts/setup.sh):
#   - AddressSanitizer + UndefinedBehaviorSanitizer (leak checks on): every suite of csrc/core,
#     plan, runtime, transport, session and the host GPU layer. Any report fails the run.
#   - ThreadSanitizer: the transports, the worker, the sessions, the executor and the host GPU
#     executor (the code with threads). Tests that fork a stopped child are left out: TSan does
#     not support fork() in a multi-threaded process.
# STRAGG_SANITIZERS=asan or tsan runs one of the two; benchmarks (Bench*) never run here.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)
WHICH=${STRAGG_SANITIZERS:-asan,tsan}
COMMON=(-DSTRAGG_TORCH=OFF -DSTRAGG_PYTHON=OFF -DSTRAGG_BUILD_TESTS=ON -DSTRAGG_CUDA=off
  -DCMAKE_BUILD_TYPE=RelWithDebInfo)

TSAN_TARGETS=(test_shm_transport test_tcp_transport test_tcp_resume test_mixed_transport
  test_serial_worker test_session test_mixed_session test_executor test_oneshot test_host_gpu_executor
  test_host_gpu_faults)
TSAN_LOG=build/tsan-build.log
tsan_build() {
  cmake -S . -B build/tsan "${COMMON[@]}" -DSTRAGG_SANITIZE=thread >/dev/null &&
    cmake --build build/tsan -j "$JOBS" --target "${TSAN_TARGETS[@]}"
}

tsan_pid=""
source scripts/kill_tree.sh
trap '[ -z "$tsan_pid" ] || kill_tree "$tsan_pid"' EXIT
if [[ $WHICH == *asan* ]]; then
  echo "== C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer =="
  cmake -S . -B build/asan "${COMMON[@]}" -DSTRAGG_SANITIZE=address,undefined >/dev/null
  cmake --build build/asan -j "$JOBS"
  # The TSan build compiles while the ASan suites run (they leave the cores half idle).
  if [[ $WHICH == *tsan* ]]; then
    mkdir -p build
    tsan_build >"$TSAN_LOG" 2>&1 &
    tsan_pid=$!
  fi
  ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build/asan --output-on-failure -j "$JOBS" -E "Bench"
fi

if [[ $WHICH == *tsan* ]]; then
  echo "== C++ tests of the threaded layers under ThreadSanitizer =="
  if [ -n "$tsan_pid" ]; then
    status=0
    wait "$tsan_pid" || status=$?
    tsan_pid=""
    if [ $status != 0 ]; then
      cat "$TSAN_LOG"
      echo "sanitizers: the TSan build failed" >&2
      exit 1
    fi
  else
    tsan_build
  fi
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/cpp/tsan.supp"
  # Every suite in its own process, $JOBS at a time; each one's output is printed when it ends.
  printf '%s\n' "${TSAN_TARGETS[@]}" | xargs -P "$JOBS" -I{} sh -c \
    'out=$(build/tsan/tests/cpp/{} --gtest_brief=1 --gtest_filter="-*Bench*:*StoppedRank*" 2>&1);
     rc=$?; printf -- "-- %s\n%s\n" {} "$out"; exit $((rc != 0))'
fi
