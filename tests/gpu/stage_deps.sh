#!/usr/bin/env bash
# Copies what the GPU run needs beyond the GPU machine's image into .gpu-deps/ (git-ignored, ~5 MB),
# to travel with the working tree (the device tool's `carry: [".gpu-deps"]`):
#   googletest/     GoogleTest's sources (Debian's libgtest-dev ships them in /usr/src/googletest);
#                   run_gpu_checks.sh builds them there once (~20 s) when the machine has no GoogleTest
#   nlohmann_json/  nlohmann/json, header-only, with its CMake config (nlohmann-json3-dev)
# The image has the rest: CMake, ninja, nvcc, torch with CUDA, NCCL's wheel, pytest, pybind11.
# Run it here, where scripts/setup.sh installed those Debian packages:
#   bash tests/gpu/stage_deps.sh [DEST]       (DEST default: .gpu-deps at the repository root)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-$ROOT/.gpu-deps}
GTEST_SRC=${GTEST_SRC:-/usr/src/googletest}
JSON_HEADERS=${JSON_HEADERS:-/usr/include/nlohmann}
JSON_CMAKE=${JSON_CMAKE:-/usr/share/cmake/nlohmann_json}
for need in "$GTEST_SRC/CMakeLists.txt" "$JSON_HEADERS/json.hpp" "$JSON_CMAKE/nlohmann_jsonConfig.cmake"; do
  [ -f "$need" ] || { echo "stage_deps: $need not found (apt-get install libgtest-dev nlohmann-json3-dev)" >&2; exit 1; }
done
rm -rf "$DEST"
mkdir -p "$DEST/nlohmann_json/include" "$DEST/nlohmann_json/share/cmake"
cp -r "$GTEST_SRC" "$DEST/googletest"
cp -r "$JSON_HEADERS" "$DEST/nlohmann_json/include/"
cp -r "$JSON_CMAKE" "$DEST/nlohmann_json/share/cmake/"
echo "stage_deps: $(du -sh "$DEST" | cut -f1) in $DEST (carry it: the device tool's carry [\"${DEST#"$ROOT"/}\"])"
