#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the quickstart demo: 4 ranks under torchrun all_reduce the
# same tensors with stragg and with gloo and print the times side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node "${NPROC:-4}" \
  examples/quickstart.py "$@"
