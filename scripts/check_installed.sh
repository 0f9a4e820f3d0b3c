#!/usr/bin/env bash
# The examples and benchmarks against a regular install: takes the wheel of this tree, installs it
# (not editable) into a fresh virtual environment beside torch==2.13.0, and runs the demo
# (examples/finetune.py --quick) and one benchmark (benchmarks/allreduce.py, tiny sizes) from a
# directory outside the source tree, with copies of the scripts, so that nothing can be imported
# from the checkout. Needs scripts/setup.sh first (its .venv builds the wheel). About 1-2 minutes.
#
#   bash scripts/check_installed.sh            # temporary directory, removed afterwards
#   STRAGG_CHECK_DIR=/tmp/x bash scripts/check_installed.sh   # keep everything in /tmp/x
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python3}
TORCH_PIN="torch==${STRAGG_TORCH_VERSION:-2.13.0}"

if [ -n "${STRAGG_CHECK_DIR:-}" ]; then
  WORK="$STRAGG_CHECK_DIR"
  mkdir -p "$WORK"
else
  WORK="$(mktemp -d -t stragg-installed-XXXXXX)"
  trap 'rm -rf "$WORK"' EXIT
fi
case "$WORK/" in
  "$REPO"/*) echo "check_installed: $WORK is inside the source tree" >&2; exit 2 ;;
esac

# The wheel scripts/setup.sh built (build/wheel/), else a fresh one.
if [ "${STRAGG_EDITABLE:-0}" != 1 ] && ls "$REPO"/build/wheel/stragg-*.whl >/dev/null 2>&1; then
  WHEEL="$(ls "$REPO"/build/wheel/stragg-*.whl)"
  echo "check_installed: the wheel scripts/setup.sh built: $(basename "$WHEEL")"
else
  echo "check_installed: building the wheel"
  rm -rf "$WORK/dist"
  (cd "$REPO" && TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python -m pip wheel -q --no-build-isolation --no-deps -w "$WORK/dist" .)
  WHEEL="$(ls "$WORK"/dist/stragg-*.whl)"
fi

echo "check_installed: fresh venv with $TORCH_PIN and $(basename "$WHEEL")"
rm -rf "$WORK/venv"
"$PYTHON" -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
# The torch pin is repeated in the same command: stragg's own requirement must never make pip
# pick another torch than the one on local disk.
"$PY" -m pip install -q "$TORCH_PIN" numpy "$WHEEL" "$TORCH_PIN"

# Copies of the scripts, run from $WORK: only the installed stragg can be imported.
rm -rf "$WORK/run"
mkdir -p "$WORK/run/examples" "$WORK/run/benchmarks"
cp "$REPO/examples/finetune.py" "$WORK/run/examples/"
cp "$REPO"/benchmarks/*.py "$WORK/run/benchmarks/"
cd "$WORK/run"
"$PY" - "$WORK/venv" <<'EOF'
import os, sys
import stragg, stragg._C
venv = os.path.realpath(sys.argv[1])
where = os.path.realpath(stragg.__file__)
assert where.startswith(venv + os.sep), f"stragg imported from {where}, not from {venv}"
print(f"check_installed: stragg {stragg.__version__} from {os.path.dirname(where)}")
import stragg.emucluster, stragg.info, stragg.integrations  # packaged too (the integrations' libraries may be absent)
assert set(stragg.integrations.available()) == {"lightning", "hf", "torchft"}
EOF
"$PY" -m stragg.info | sed -n '/^Build/,/^CUDA/p' | head -n -1

echo "check_installed: examples/finetune.py --quick"
"$PY" examples/finetune.py --quick --json > finetune.json
"$PY" - finetune.json <<'EOF'
import json, sys
out = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
stats = out["stragg_backend_stats"]
assert stats["allreduce_calls"] >= out["steps"], stats
assert stats["failed_calls"] == 0, stats
assert out["loss_rel_diff"] < 1e-4, out["loss_rel_diff"]
print(f"check_installed: demo ok: {out['steps']} steps on {out['ranks']} ranks, "
      f"{stats['allreduce_calls']} all_reduces on stragg ({stats['transport']}), "
      f"loss difference to gloo {out['loss_rel_diff']:.1e}")
EOF

echo "check_installed: benchmarks/allreduce.py (tiny sizes)"
"$PY" benchmarks/allreduce.py --ranks 2 --sizes 4KiB,256KiB --iters 5 --warmup 1 --budget 0 \
  --reps 1 --json > allreduce.json
"$PY" - allreduce.json <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
stragg = [r for r in rows if r["backend"] == "stragg"]
assert len(stragg) == 2 and all(r["transport"] == "shm" for r in stragg), rows
for r in rows:
    print(f"  {r['backend']:>7} {r['bytes']:>8} B  {r['time_s'] * 1e6:8.1f} us")
print("check_installed: benchmark ok")
EOF
echo "check_installed: passed"
