"""stragg in the training libraries people already use. Each submodule imports its library, so
import only the one you need (it raises ImportError naming the package when it is missing):

- ``stragg.integrations.lightning``: Lightning strategies ``"ddp_stragg"`` (DDP on a stragg
  process group) and ``"ddp_stragg_hook"`` (DDP on Gloo/NCCL, gradients all_reduced by stragg's
  communication hook, on CPU as well as CUDA). Importing the module registers both names.
- ``stragg.integrations.hf``: ``use_stragg()`` makes accelerate's ``Accelerator`` and the
  transformers ``Trainer`` run their process group on stragg, on CPU and GPU, and warns when a
  model is left without DDP (no gradient synchronisation).
- ``stragg.integrations.torchft``: ``ProcessGroupStragg``, a reconfigurable process group for
  torchft's ``Manager`` (fault-tolerant replica groups).

See docs/integrations.md and examples/.
"""

from __future__ import annotations

import importlib.util

__all__ = ["available"]

_LIBRARIES = {
    "lightning": ("pytorch_lightning", "lightning.pytorch"),
    "hf": ("accelerate", "transformers"),
    "torchft": ("torchft",),
}


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def available() -> dict[str, bool]:
    """Which integrations can be imported here (their library is installed)."""
    return {key: any(_importable(m) for m in mods) for key, mods in _LIBRARIES.items()}


def missing(integration: str, packages: str) -> ImportError:
    """The ImportError an integration raises when its library is not installed."""
    return ImportError(
        f"stragg.integrations.{integration} needs {packages}, which is not installed "
        f"(pip install {packages.split(' ')[0]}; keep torch pinned in the same command)"
    )
