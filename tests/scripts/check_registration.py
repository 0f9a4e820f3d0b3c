"""Registration checks, run in a fresh interpreter: ``python check_registration.py MODE``.

MODE "import": import stragg explicitly, then import it again, importlib.reload it and call
stragg.register() again; every step must work and leave exactly one "stragg" registration.
MODE "autoload": never import stragg; only PyTorch's extension autoload may register it.
Both then create a world-size-1 "stragg" group and all_reduce on it.
Prints one line "RESULT {json}".
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from typing import Any


def _single_rank_allreduce(report: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("stragg", store=dist.HashStore(), rank=0, world_size=1)
    t = torch.arange(5, dtype=torch.float32)
    dist.all_reduce(t)
    report["allreduce_ws1"] = t.tolist()
    report["get_backend"] = dist.get_backend()
    stats = sys.modules["stragg"].backend_stats()
    report["stats"] = dict(stats)
    dist.destroy_process_group()


def _registered(report: dict[str, Any], key: str) -> None:
    import torch.distributed as dist

    report[key] = {
        "in_backend_list": "stragg" in dist.Backend.backend_list,
        "count_in_backend_list": dist.Backend.backend_list.count("stragg"),
        "capability": list(getattr(dist.Backend, "backend_capability", {}).get("stragg", [])),
        "module_loaded": "stragg" in sys.modules,
    }


def main(mode: str) -> dict[str, Any]:
    report: dict[str, Any] = {"mode": mode}
    if mode == "import":
        import stragg

        _registered(report, "after_import")
        import stragg as again  # noqa: F401  (a second import is a no-op)

        importlib.reload(stragg)
        _registered(report, "after_reload")
        stragg.register()
        stragg.register()
        _registered(report, "after_register")
    elif mode == "autoload":
        import torch  # noqa: F401

        _registered(report, "after_import_torch")
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    _single_rank_allreduce(report)
    return report


if __name__ == "__main__":
    try:
        result = main(sys.argv[1])
    except Exception as exc:  # noqa: BLE001  (report instead of a bare traceback)
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    print("RESULT " + json.dumps(result, sort_keys=True), flush=True)
