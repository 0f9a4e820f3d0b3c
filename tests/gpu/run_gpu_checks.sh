#!/usr/bin/env bash
# Runs the GPU checks of tests/gpu/README.md, each under its own time limit, and writes
# OUTDIR/summary.json plus one log per step (tests/gpu/gpu_checks.py has the steps and knobs):
#   bash tests/gpu/run_gpu_checks.sh OUTDIR            on the GPU machine: builds with CUDA against
#                                                      the Python whose torch has CUDA (PYTHON=...),
#                                                      installs nothing, fails if a check cannot run
#   bash tests/gpu/run_gpu_checks.sh --dry-run OUTDIR  on a CPU machine: every step that needs no
#                                                      GPU runs for real, GPU steps are "would_run"
# Exits non-zero when a step failed. Needs only a python3 (standard library) to drive it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for py in python3 python; do
  if command -v "$py" >/dev/null 2>&1; then
    exec "$py" "$here/gpu_checks.py" "$@"
  fi
done
echo "run_gpu_checks: no python3 on PATH" >&2
exit 1
