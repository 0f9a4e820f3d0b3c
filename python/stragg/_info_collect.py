"""The collectors of `python -m stragg.info`: each section of the bug report is a small function
returning a JSON-serialisable dict (stragg.info formats them; stragg._info_format prints them).

Nothing here fails: a part that cannot be read is reported as {"error": "..."}.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any

# Environment variables that change how torch.distributed or stragg behave; reported when set.
_TORCH_ENV = (
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
    "TORCH_CPP_LOG_LEVEL",
    "TORCH_DISTRIBUTED_DEBUG",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_DEBUG",
    "GLOO_SOCKET_IFNAME",
)
# Libraries stragg integrates with (stragg.integrations) or that the examples use.
_RELATED = (
    "numpy",
    "lightning",
    "pytorch-lightning",
    "accelerate",
    "transformers",
    "torchft",
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu13",
)
_LIMITS = (
    ("open_files", "RLIMIT_NOFILE"),
    ("locked_memory_bytes", "RLIMIT_MEMLOCK"),
    ("processes", "RLIMIT_NPROC"),
    ("address_space_bytes", "RLIMIT_AS"),
    ("stack_bytes", "RLIMIT_STACK"),
    ("core_file_bytes", "RLIMIT_CORE"),
)


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a report must not fail on one unreadable part
        return {"error": f"{type(e).__name__}: {e}"}


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _os_release() -> str:
    text = _read("/etc/os-release") or ""
    fields = dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
    )
    return fields.get("PRETTY_NAME", "").strip('"') or platform.platform()


def versions() -> dict[str, Any]:
    import torch

    import stragg

    return {
        "stragg": stragg.__version__,
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "torch_debug": bool(getattr(torch.version, "debug", False)),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "os": _os_release(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "libc": " ".join(platform.libc_ver()).strip() or None,
        "related_packages": {n: v for n in _RELATED if (v := _dist_version(n)) is not None},
    }


def _install_kind() -> dict[str, Any]:
    """How the stragg distribution was installed (editable or not) and where it lives."""
    import stragg

    out: dict[str, Any] = {"package_dir": os.path.dirname(os.path.abspath(stragg.__file__))}
    try:
        dist = importlib.metadata.distribution("stragg")
    except importlib.metadata.PackageNotFoundError:
        out["distribution"] = None  # imported from a path, not installed
        return out
    out["distribution"] = dist.version
    direct = dist.read_text("direct_url.json")
    editable = False
    if direct:
        try:
            editable = bool(json.loads(direct).get("dir_info", {}).get("editable", False))
        except ValueError:
            pass
    out["editable"] = editable
    eps = importlib.metadata.entry_points(group="torch.backends")
    out["autoload_entry_point"] = any(ep.name == "stragg" for ep in eps)
    return out


def build() -> dict[str, Any]:
    """The C++ extensions: can they load, where are they, what was compiled in."""
    import stragg

    out: dict[str, Any] = {"install": _safe(_install_kind), "registered": stragg.is_registered()}
    try:
        from stragg import _C
    except Exception as e:  # noqa: BLE001
        out["extension"] = {"loaded": False, "error": f"{type(e).__name__}: {e}"}
    else:
        out["extension"] = {
            "loaded": True,
            "path": getattr(_C, "__file__", None),
            # CUDA all_reduce on stragg's GPU executor (else delegated to NCCL).
            "cuda_allreduce_compiled": bool(getattr(_C, "cuda_allreduce_compiled", False)),
        }
        build_info = getattr(_C, "build_info", None)  # richer build flags, when the module has them
        if callable(build_info):
            out["extension"]["build_info"] = _safe(lambda: dict(build_info()))
    try:
        core = importlib.import_module("stragg._core")
        out["core_extension"] = {"loaded": True, "path": getattr(core, "__file__", None)}
    except Exception as e:  # noqa: BLE001
        out["core_extension"] = {"loaded": False, "error": f"{type(e).__name__}: {e}"}
    return out


def cuda() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    out: dict[str, Any] = {
        "torch_cuda_build": torch.version.cuda,
        "available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "nccl_available": dist.is_nccl_available(),
        "gloo_available": dist.is_gloo_available(),
    }
    if out["nccl_available"]:
        out["nccl_version"] = _safe(lambda: ".".join(map(str, torch.cuda.nccl.version())))
    if out["device_count"]:
        out["devices"] = [
            _safe(lambda i=i: torch.cuda.get_device_name(i)) for i in range(out["device_count"])
        ]
    nvcc = shutil.which("nvcc")
    out["nvcc"] = nvcc
    if nvcc:
        out["nvcc_version"] = _safe(lambda: _nvcc_release(nvcc))
    return out


def _nvcc_release(nvcc: str) -> str:
    proc = subprocess.run(
        [nvcc, "--version"], capture_output=True, text=True, timeout=20, check=False
    )
    text = proc.stdout
    for line in text.splitlines():
        if "release" in line:
            return line.strip()
    return text.strip().splitlines()[-1] if text.strip() else ""


def _mount_of(path: str) -> dict[str, str] | None:
    best: dict[str, str] | None = None
    for line in (_read("/proc/mounts") or "").splitlines():
        parts = line.split()
        if len(parts) < 4 or not path.startswith(parts[1]):
            continue
        if best is None or len(parts[1]) > len(best["mount_point"]):
            best = {"mount_point": parts[1], "fs": parts[2], "options": parts[3]}
    return best


def shared_memory() -> dict[str, Any]:
    """/dev/shm: where the shared-memory transport's segments live (unlinked after setup)."""
    path = "/dev/shm"
    if not os.path.isdir(path):
        return {"path": path, "exists": False}
    st = os.statvfs(path)
    out: dict[str, Any] = {
        "path": path,
        "exists": True,
        "size_bytes": st.f_blocks * st.f_frsize,
        "free_bytes": st.f_bavail * st.f_frsize,
        "writable": os.access(path, os.W_OK),
        "mount": _mount_of(path),
    }
    for name in ("shmmax", "shmall", "shmmni"):
        value = _read(f"/proc/sys/kernel/{name}")
        if value is not None:
            out[f"sysv_{name}"] = int(value) if value.isdigit() else value
    return out


def limits() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, name in _LIMITS:
        res = getattr(resource, name, None)
        if res is None:
            continue
        soft, hard = resource.getrlimit(res)
        inf = resource.RLIM_INFINITY
        out[key] = {
            "soft": None if soft == inf else soft,
            "hard": None if hard == inf else hard,
        }
    out["cpus"] = os.cpu_count()
    if hasattr(os, "sched_getaffinity"):
        out["cpus_usable"] = len(os.sched_getaffinity(0))
    pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    out["memory_bytes"] = pages * page
    return out


def _namespace_inode(kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return None


def _ifname_source(config: dict[str, Any] | None) -> str | None:
    """Where the interfaces that pick the TCP address come from, if any are named."""
    spec = (config or {}).get("socket_ifname") or ""
    if not spec:
        return None
    source = "STRAGG_SOCKET_IFNAME" if os.environ.get("STRAGG_SOCKET_IFNAME", "").strip() else (
        "GLOO_SOCKET_IFNAME" if os.environ.get("GLOO_SOCKET_IFNAME", "").strip() else "socket_ifname"
    )
    return f"the first interface {source} selects ({spec!r})"


def transport(config: dict[str, Any] | None) -> dict[str, Any]:
    """What STRAGG_TRANSPORT selects for ranks on this host and for ranks across hosts."""
    mode = (config or {}).get("transport", os.environ.get("STRAGG_TRANSPORT", "auto") or "auto")
    identity = {
        "hostname": socket.gethostname(),
        "boot_id": _read("/proc/sys/kernel/random/boot_id"),
        "net_namespace": _namespace_inode("net"),
        "ipc_namespace": _namespace_inode("ipc"),
    }
    advertised = (config or {}).get("tcp_host") or ""
    idle = _read("/proc/sys/net/ipv4/tcp_slow_start_after_idle")
    store_host = os.environ.get("MASTER_ADDR", "").strip()
    out: dict[str, Any] = {
        "setting": mode,
        "host_identity": identity,
        "tcp_advertised_address": advertised or None,
        # 1 (the kernel's default): a TCP connection idle for longer than its retransmission
        # timeout restarts slow start, so every collective that reaches a peer it has not
        # talked to for a while (StragglAR's rounds) starts that transfer slowly.
        "tcp_slow_start_after_idle": None if idle is None else idle == "1",
        "tcp_address_source": (
            "STRAGG_TCP_HOST"
            if advertised
            else _ifname_source(config)
            or (
                "route toward MASTER_ADDR / the TCPStore host"
                if store_host
                else "route toward the TCPStore host (known when the group is created)"
            )
        ),
    }
    if mode == "auto":
        out["ranks_on_this_host"] = "shm"
        out["ranks_across_hosts"] = "tcp (gloo if a rank knows no address of its own)"
        out["rule"] = (
            "shm when every rank has the same hostname, boot id and network/IPC namespace; "
            "otherwise tcp when every rank has an address, else all_reduce on the inner Gloo"
        )
    else:
        out["ranks_on_this_host"] = mode
        out["ranks_across_hosts"] = mode if mode != "shm" else "error (shm needs one host)"
    return out


def settings() -> dict[str, Any]:
    """STRAGG_* variables set in the environment, the overrides of this process, and the
    configuration a stragg group created now would get (or the error it would raise)."""
    from stragg import _config

    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("STRAGG_")}
    other = {k: os.environ[k] for k in _TORCH_ENV if k in os.environ}
    out: dict[str, Any] = {
        "environment": env,
        "related_environment": other,
        "python_overrides": {k: raw for k, (raw, _source) in _config._overrides.items()},
    }
    try:
        # Every setting of the table (csrc/plan/settings.cc) as its canonical text.
        out["effective"] = _config.effective_settings()
    except ValueError as e:
        out["effective"] = {"error": str(e)}
    return out


def collect(probe: bool = False) -> dict[str, Any]:
    """Everything above, as one JSON-serialisable dict."""
    info: dict[str, Any] = {
        "versions": _safe(versions),
        "build": _safe(build),
        "cuda": _safe(cuda),
        "shared_memory": _safe(shared_memory),
        "limits": _safe(limits),
        "settings": _safe(settings),
    }
    effective = info["settings"].get("effective") if isinstance(info["settings"], dict) else None
    cfg = effective if isinstance(effective, dict) and "error" not in effective else None
    info["transport"] = _safe(lambda: transport(cfg))
    if probe:
        from ._info_probe import probe_transport

        info["transport"]["probe"] = _safe(probe_transport)
    return info
