"""stragg: a torch.distributed backend whose all_reduce keeps working while a rank straggles.

    import stragg  # registers backend "stragg" (also registered automatically by torch)
    dist.init_process_group(backend="stragg")   # or "cpu:stragg,cuda:stragg"

all_reduce on CPU tensors runs on stragg's own C++ executor; every other collective (and, for
now, CUDA all_reduce) is delegated to an inner Gloo / NCCL backend. See README.md.
"""

from __future__ import annotations

from ._config import table as settings_table
from ._policy import Options, reset_policy, set_policy
from ._registration import BACKEND_NAME, backend_stats, is_registered, recent_calls, register
from .straggler import StragglerReport, straggler_detection, straggler_report

__version__ = "0.1.0"
__all__ = [
    "BACKEND_NAME",
    "Options",
    "StragglerReport",
    "__version__",
    "backend_stats",
    "is_registered",
    "recent_calls",
    "register",
    "reset_policy",
    "set_policy",
    "settings_table",
    "straggler_detection",
    "straggler_report",
]

register()
