#!/usr/bin/env bash
# Builds stragg._C and stragg._core against another torch than .venv's, to check that the
# extension compiles and links against that version's headers and libraries:
#   bash scripts/check_torch_build.sh 2.11.0      (the GPU machine's torch: 2.11.0+cu130)
# It makes a venv OUTSIDE the repository (STRAGG_TORCH_VENV, default ../venv-torch-VERSION) with
# only that torch wheel, installed without its dependencies (PyPI's x86_64 wheel is the CUDA build,
# ~530 MB; its CUDA libraries, several GB, are not needed to compile), pybind11, and where nvcc
# exists the NCCL wheel torch pins (and nvrtc, which torch's CMake config links). The build runs
# CMake directly with Torch_DIR, since torch cannot be imported without its CUDA libraries; with
# nvcc and a CUDA wheel the GPU path (STRAGG_BACKEND_CUDA, NCCL) is compiled in. Then every symbol
# that _C needs from outside Python must be defined by torch's libraries, CUDA's runtime, NCCL or
# the C/C++ runtime (an API that exists in the headers but not in the libraries fails here), and
# where torch imports (a CPU wheel with its dependencies), `import stragg._C` is tried too.
# Not part of CI (the download and the build take minutes); results: tests/gpu/README.md.
# Knobs: PYTHON (base interpreter, default python3), STRAGG_BUILD_JOBS, CUDA_ARCHS (default 90).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=${1:?usage: scripts/check_torch_build.sh TORCH_VERSION (e.g. 2.11.0)}
VENV=${STRAGG_TORCH_VENV:-$ROOT/../venv-torch-$VERSION}
mkdir -p "$VENV"
VENV=$(cd "$VENV" && pwd)
case "$VENV/" in
  "$ROOT"/*) echo "check_torch_build: $VENV is inside the repository: choose STRAGG_TORCH_VENV outside" >&2
             exit 2 ;;
esac
JOBS=${STRAGG_BUILD_JOBS:-$(nproc)}
PY=$VENV/bin/python
start=$SECONDS
say() { echo "check_torch_build: $*"; }

[ -x "$PY" ] || "${PYTHON:-python3}" -m venv "$VENV"
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
installed=$("$PY" -m pip show torch 2>/dev/null | sed -n 's/^Version: //p')
if [ "${installed%%+*}" != "$VERSION" ]; then
  say "downloading torch==$VERSION (no dependencies) into $VENV/wheels"
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$VENV/wheels" "torch==$VERSION"
  "$PY" -m pip install -q --no-deps "$VENV"/wheels/torch-"$VERSION"*.whl
fi
"$PY" -m pip install -q pybind11 "setuptools>=64" wheel
TORCH=$SITE/torch
CUDA_WHEEL=0
[ -f "$TORCH/lib/libc10_cuda.so" ] && CUDA_WHEEL=1
say "torch $("$PY" -m pip show torch | sed -n 's/^Version: //p') (CUDA build: $CUDA_WHEEL) in $VENV"

args=(-DCMAKE_BUILD_TYPE=Release "-DTorch_DIR=$TORCH/share/cmake/Torch" "-DPython_EXECUTABLE=$PY"
      "-DCMAKE_LIBRARY_OUTPUT_DIRECTORY=$VENV/stragg-build/out")
command -v ninja >/dev/null 2>&1 && [ ! -f "$VENV/stragg-build/Makefile" ] && args+=(-G Ninja)
LIBS=("$TORCH"/lib/*.so)
if command -v nvcc >/dev/null 2>&1; then
  # nvcc may be a wrapper script: its TOP is the toolkit (torch's FindCUDA looks there).
  CUDA_ROOT=${CUDA_HOME:-$(nvcc --dryrun -c -x cu /dev/null -o /dev/null 2>&1 |
                           sed -n 's/^#\$ TOP=//p' | head -1)}
  CUDA_ROOT=$(cd "$CUDA_ROOT" && pwd)
  args+=(-DSTRAGG_CUDA=on "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-90}"
         "-DCUDA_TOOLKIT_ROOT_DIR=$CUDA_ROOT")
  LIBS+=("$CUDA_ROOT"/lib64/libcudart.so.*)
  if [ $CUDA_WHEEL = 1 ]; then
    args+=(-DSTRAGG_BACKEND_CUDA=on)
    # The NCCL torch pins (the one a machine with this torch has).
    nccl=$(sed -n 's/^Requires-Dist: \(nvidia-nccl-cu[0-9]*==[0-9.]*\).*/\1/p' \
           "$SITE"/torch-*.dist-info/METADATA | head -1)
    [ -n "$nccl" ] && "$PY" -m pip install -q --no-deps "$nccl"
    if ! ls "$CUDA_ROOT"/lib64/libnvrtc.so* >/dev/null 2>&1; then
      nvcc_version=$(nvcc --version | sed -n 's/.*, V\([0-9.]*\)$/\1/p')
      "$PY" -m pip install -q --no-deps "nvidia-cuda-nvrtc==$nvcc_version"
      nvrtc=$(ls "$SITE"/nvidia/*/lib/libnvrtc.so.[0-9]* | grep -E 'libnvrtc\.so\.[0-9]+$' | head -1)
      args+=("-DCUDA_nvrtc_LIBRARY=$nvrtc")
    fi
    LIBS+=("$SITE"/nvidia/nccl/lib/libnccl.so.*)
  else
    args+=(-DSTRAGG_BACKEND_CUDA=off)
  fi
else
  args+=(-DSTRAGG_CUDA=off)
  say "nvcc not found: building without the GPU path"
fi

# A build tree configured from another checkout cannot be reused.
if [ -f "$VENV/stragg-build/CMakeCache.txt" ] &&
   ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$ROOT" "$VENV/stragg-build/CMakeCache.txt"; then
  rm -rf "$VENV/stragg-build"
fi
say "configure + build (-j$JOBS) in $VENV/stragg-build"
cmake -S "$ROOT" -B "$VENV/stragg-build" "${args[@]}" >"$VENV/configure.log" 2>&1 ||
  { tail -40 "$VENV/configure.log"; say "FAILED: configure (log: $VENV/configure.log)"; exit 1; }
cmake --build "$VENV/stragg-build" -j "$JOBS" --target _C _core >"$VENV/build.log" 2>&1 ||
  { grep -E -A6 'error|Error' "$VENV/build.log" | head -60
    say "FAILED: build (log: $VENV/build.log)"; exit 1; }
SO=$(ls "$VENV"/stragg-build/out/_C.*.so)
gpu_path=off
grep -q "CUDA all_reduce on stragg's GPU executor" "$VENV/configure.log" && gpu_path=on

# Link check: what _C needs must be defined by torch, CUDA's runtime, NCCL or the C/C++ runtime.
for lib in libstdc++.so.6 libc.so.6 libm.so.6 libgcc_s.so.1 ld-linux-x86-64.so.2; do
  LIBS+=("$(gcc -print-file-name="$lib")")
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nm -D --undefined-only "$SO" | awk '$1 == "U" {sub(/@.*/, "", $2); print $2}' | sort -u >"$tmp/need"
for lib in "${LIBS[@]}"; do
  [ -f "$lib" ] && nm -D --defined-only "$lib" | awk '{sub(/@.*/, "", $3); print $3}'
done | sort -u >"$tmp/have"
missing=$(comm -23 "$tmp/need" "$tmp/have" | grep -v -E '^_?Py' || true)
if [ -n "$missing" ]; then
  echo "$missing" | head -20 | c++filt
  say "FAILED: $(echo "$missing" | wc -l) symbols that _C needs are defined nowhere (torch $VERSION, CUDA, NCCL, C/C++ runtime)"
  exit 1
fi
say "link check: all $(wc -l <"$tmp/need") symbols _C needs are defined (Python's own excepted)"

if TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PY" -c "import torch" >/dev/null 2>&1; then
  mkdir -p "$tmp/py"
  cp -r "$ROOT/python/stragg" "$tmp/py/"
  cp "$VENV"/stragg-build/out/*.so "$tmp/py/stragg/"
  PYTHONPATH=$tmp/py TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PY" -c \
    "import stragg._C as C; print('check_torch_build: import stragg._C: GPU path', C.cuda_allreduce_compiled)"
else
  say "torch does not import here (its CUDA libraries are not installed): import not tried"
fi
say "passed: torch $VERSION, GPU path $gpu_path, $((SECONDS - start)) s"
