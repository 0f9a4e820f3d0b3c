"""Locate the torch-free extension module ``stragg._core``.

The installed package carries it as ``stragg._core`` (copied there by setup.py). For torch-free
development builds (``cmake -DSTRAGG_TORCH=OFF -DSTRAGG_PYTHON=ON``) a top-level ``_core`` module
on ``PYTHONPATH`` works too.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def load_core() -> ModuleType:
    try:
        return importlib.import_module("stragg._core")
    except ImportError as first:
        try:
            return importlib.import_module("_core")
        except ImportError:
            raise ImportError(
                "stragg._core is not built: build the project (pip install .) or a torch-free "
                "dev build with -DSTRAGG_PYTHON=ON and put the module on PYTHONPATH"
            ) from first
