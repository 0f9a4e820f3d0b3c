"""Builds stragg's C++ extension modules with CMake against the torch that is installed.

Install with `pip install --no-build-isolation .` (or `-e .`): build isolation would make pip
fetch a fresh torch (several GB) instead of building against the one you have.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent.resolve()


class CMakeExtension(Extension):
    def __init__(self, name: str, target: str) -> None:
        super().__init__(name, sources=[])
        self.target = target


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        assert isinstance(ext, CMakeExtension)
        try:
            import torch.utils
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise RuntimeError(
                "stragg builds against the installed torch: install torch first and use "
                "`pip install --no-build-isolation .`"
            ) from err
        out_dir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        # A persistent build tree (not pip's temporary one) keeps rebuilds incremental.
        tag = f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__}"
        build_dir = ROOT / "build" / f"cmake-{tag}"
        build_dir.mkdir(parents=True, exist_ok=True)
        args = [
            f"-DCMAKE_BUILD_TYPE={os.environ.get('STRAGG_BUILD_TYPE', 'Release')}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DSTRAGG_CUDA={os.environ.get('STRAGG_CUDA', 'off')}",  # on: also the GPU all_reduce path (needs a CUDA torch)
        ]
        if shutil.which("ninja") and not (build_dir / "Makefile").exists():
            args += ["-G", "Ninja"]
        subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir), *args])
        jobs = os.environ.get("STRAGG_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(
            ["cmake", "--build", str(build_dir), "--target", ext.target, "-j", jobs]
        )


setup(
    ext_modules=[CMakeExtension("stragg._C", "_C"), CMakeExtension("stragg._core", "_core")],
    cmdclass={"build_ext": CMakeBuild},
)
