#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the main demo: examples/finetune.py fine-tunes a small GPT-2
# with DDP on 4 ranks, once on gloo and once on stragg, with rank 3 straggling; it prints the step
# times, the straggler stragg detected, the speedup and both losses, and writes finetune.png.
# Arguments go to the demo (e.g. --steps 60, --json, --no-straggler). The older all_reduce
# quickstart: .venv/bin/python -m torch.distributed.run --nproc-per-node 4 examples/quickstart.py
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/finetune.py "$@"
