#!/usr/bin/env bash
# Sets up a fresh machine for stragg: system packages, a virtual environment in .venv with
# torch==2.13.0 (CPU) and the test tools, and stragg built against that torch and installed
# from its wheel (STRAGG_EDITABLE=1: editable). `--cpp` stops once the C++ suites can build:
# system packages, .venv and (with nvcc) NCCL's headers in it (scripts/test.sh builds the C++
# suites while the rest of the setup runs).
# Idempotent: re-running only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
CPP_ONLY=0
[ "${1:-}" = --cpp ] && CPP_ONLY=1

APT_PACKAGES="cmake g++ libgtest-dev nlohmann-json3-dev"
missing=""
for pkg in $APT_PACKAGES; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi

# OpenMPI (optional: only benchmarks/allreduce.py's MPI column uses it, no test needs it), so a
# failure here only warns.
MPI_PACKAGES="openmpi-bin libopenmpi-dev"
mpi_missing=""
for pkg in $MPI_PACKAGES; do
  dpkg -s "$pkg" >/dev/null 2>&1 || mpi_missing="$mpi_missing $pkg"
done
if [ -n "$mpi_missing" ]; then
  echo "setup: installing Debian packages (optional, the benchmark's MPI column):$mpi_missing"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
      $mpi_missing; } || echo "setup: warning: OpenMPI not installed; the benchmark skips MPI"
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
PY=.venv/bin/python
"$PY" -m pip install -q --upgrade "pip>=23" "setuptools>=64" wheel
# GPU parts (kernels/): only where a CUDA compiler exists. NCCL's headers and library come from
# its wheel (pinned: the NCCL ABI the GPU code is compiled against).
if command -v nvcc >/dev/null 2>&1; then
  "$PY" -m pip install -q "nvidia-nccl-cu13==2.32.3"
fi
[ $CPP_ONLY = 1 ] && exit 0
# torch is pinned: the CPU wheel is on local disk here. Never let pip pick a newer torch.
"$PY" -m pip install -q "torch==${STRAGG_TORCH_VERSION:-2.13.0}"
# transformers and matplotlib: examples/finetune.py (the model, its figure). The torch pin is
# repeated so that resolving their dependencies can never swap the torch installed above.
"$PY" -m pip install -q numpy pytest "pytest-xdist==3.8.0" pybind11 ninja "transformers==5.23.0" \
  "matplotlib==3.11.2" "torch==${STRAGG_TORCH_VERSION:-2.13.0}"
# stragg.integrations (examples/lightning_ddp.py, hf_trainer.py, torchft_replicas.py and their
# tests) and torch's own distributed test suite (expecttest). Pinned to versions that accept
# torch 2.13.0; the torch pin is repeated so that none of them can replace it.
"$PY" -m pip install -q "pytorch-lightning==2.6.6" "accelerate==1.15.0" "torchft==0.2.0" \
  "expecttest==0.3.0" "torch==${STRAGG_TORCH_VERSION:-2.13.0}"
# mpi4py for the benchmark's MPI column, only where OpenMPI is installed (optional: warns).
if command -v mpirun >/dev/null 2>&1; then
  "$PY" -m pip install -q "mpi4py==4.1.2" || echo "setup: warning: mpi4py not installed"
fi
# stragg itself, built against the torch installed above (--no-build-isolation: pip would fetch
# another torch otherwise). By default a wheel (build/wheel/, reused by check_installed.sh) is
# installed like a user's `pip install .`, so the tests import what users run, from
# site-packages. STRAGG_EDITABLE=1 installs it editable instead (python/ on the path: edits to
# Python files need no reinstall). The CMake build under build/ is incremental either way.
# Autoload off while building: setup.py imports torch, which would load an installed (maybe
# stale or half-built) stragg through its entry point.
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
if [ "${STRAGG_EDITABLE:-0}" = 1 ]; then
  "$PY" -m pip install -q --no-build-isolation -e .
else
  rm -rf build/wheel
  "$PY" -m pip wheel -q --no-build-isolation --no-deps -w build/wheel .
  "$PY" -m pip install -q --force-reinstall --no-deps build/wheel/stragg-*.whl
fi
unset TORCH_DEVICE_BACKEND_AUTOLOAD
"$PY" -c "import stragg, stragg._C, torch; print('setup: stragg', stragg.__version__, 'with torch', torch.__version__)"
