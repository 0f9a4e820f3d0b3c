"""Entry point for PyTorch's backend-extension autoload (group "torch.backends").

torch calls autoload() at the end of `import torch`, so `backend="stragg"` works in scripts that
never import stragg. It only registers the backend; the C++ extension loads when a stragg process
group is created. Disable with TORCH_DEVICE_BACKEND_AUTOLOAD=0.
"""

from __future__ import annotations

import logging
import sys


def autoload() -> None:
    partial = sys.modules.get("stragg._registration")
    if partial is not None and not hasattr(partial, "register"):
        # `import stragg` came first and is importing torch right now; it registers the backend
        # itself once torch is loaded.
        return
    try:
        from ._registration import register

        register()
    except Exception:  # never break `import torch` for everybody because of stragg
        logging.getLogger("stragg").warning("stragg: autoload failed", exc_info=True)
