"""What a stragg bug report needs: `python -m stragg.info` (add `--json` for one JSON object).

Like `torch.utils.collect_env`: versions (stragg, torch, Python, OS), how stragg was built and
installed (C++ extension, CUDA all_reduce compiled in), CUDA / NCCL as torch sees them, shared
memory (/dev/shm size and free space, mount options), resource limits, the all_reduce transport
that STRAGG_TRANSPORT selects on this host, and the STRAGG_* settings in force (environment and
`stragg.set_policy` / `stragg.profiler.configure` overrides of this process).

`--probe` also creates a 2-rank stragg group on this host (two spawned processes) and reports the
transport it really chose and whether a small all_reduce was correct.

(One module over 500 lines on purpose: each section is a small independent collector, and a
user reads the report's whole definition in one place.)

Nothing here fails: a part that cannot be read is reported as {"error": "..."}.
"""

from __future__ import annotations

import argparse
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
    store_host = os.environ.get("MASTER_ADDR", "").strip()
    out: dict[str, Any] = {
        "setting": mode,
        "host_identity": identity,
        "tcp_advertised_address": advertised or None,
        "tcp_address_source": (
            "STRAGG_TCP_HOST"
            if advertised
            else (
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


# --------------------------------------------------------------------------------------------
# Text report


def _fmt_bytes(n: Any) -> str:
    if not isinstance(n, int):
        return str(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _fmt_limit(v: Any, key: str) -> str:
    if not isinstance(v, dict) or "soft" not in v:
        return str(v)
    conv = _fmt_bytes if key.endswith("_bytes") else str

    def one(x: Any) -> str:
        return "unlimited" if x is None else conv(x)

    return f"{one(v['soft'])} (hard {one(v['hard'])})"


def _section(title: str, rows: list[tuple[str, Any]]) -> list[str]:
    lines = [title]
    width = max((len(k) for k, _ in rows), default=0)
    for key, value in rows:
        lines.append(f"  {key:<{width}} : {value}")
    return lines


def _err(part: Any) -> str | None:
    return part["error"] if isinstance(part, dict) and "error" in part else None


def format_text(info: dict[str, Any]) -> str:
    out: list[str] = []
    v = info["versions"]
    if _err(v):
        out += _section("Versions", [("error", _err(v))])
    else:
        rel = ", ".join(f"{k} {x}" for k, x in v["related_packages"].items()) or "none"
        out += _section(
            "Versions",
            [
                ("stragg", v["stragg"]),
                ("torch", f"{v['torch']} (git {v['torch_git']}, debug {v['torch_debug']})"),
                ("python", f"{v['python']} ({v['python_executable']})"),
                ("OS", f"{v['os']}, kernel {v['kernel']}, {v['machine']}, {v['libc']}"),
                ("related packages", rel),
            ],
        )
    b = info["build"]
    if _err(b):
        out += _section("Build", [("error", _err(b))])
    else:
        ext, core, inst = b["extension"], b["core_extension"], b["install"]
        ext_desc = ext.get("path") if ext.get("loaded") else f"NOT loadable: {ext.get('error')}"
        rows = [
            ("install", _install_desc(inst)),
            ("backend registered", b["registered"]),
            ("stragg._C", ext_desc),
        ]
        if ext.get("loaded"):
            rows.append(
                (
                    "CUDA all_reduce compiled",
                    f"{ext['cuda_allreduce_compiled']} "
                    + (
                        "(stragg's GPU executor)"
                        if ext["cuda_allreduce_compiled"]
                        else "(CUDA all_reduce is delegated to NCCL)"
                    ),
                )
            )
            for key, value in (ext.get("build_info") or {}).items():
                rows.append((f"build {key}", value))
        rows.append(("stragg._core", core.get("path") if core.get("loaded") else core.get("error")))
        out += _section("Build", rows)
    c = info["cuda"]
    if _err(c):
        out += _section("CUDA / NCCL", [("error", _err(c))])
    else:
        rows = [
            ("torch built with CUDA", c["torch_cuda_build"] or "no (CPU build)"),
            ("CUDA available", f"{c['available']} ({c['device_count']} devices)"),
            ("NCCL", c.get("nccl_version", "available") if c["nccl_available"] else "no"),
            ("Gloo", c["gloo_available"]),
            ("nvcc", c.get("nvcc_version") or c["nvcc"] or "not on PATH"),
        ]
        rows += [(f"device {i}", name) for i, name in enumerate(c.get("devices") or [])]
        out += _section("CUDA / NCCL", rows)
    s = info["shared_memory"]
    if _err(s) or not s.get("exists"):
        out += _section("Shared memory", [("/dev/shm", _err(s) or "missing")])
    else:
        mount = s.get("mount") or {}
        out += _section(
            "Shared memory",
            [
                (
                    "/dev/shm size",
                    f"{_fmt_bytes(s['size_bytes'])}, free {_fmt_bytes(s['free_bytes'])}",
                ),
                ("writable", s["writable"]),
                ("mount", f"{mount.get('fs')} {mount.get('options')}" if mount else "unknown"),
            ],
        )
    lim = info["limits"]
    if _err(lim):
        out += _section("Limits", [("error", _err(lim))])
    else:
        rows = [(k, _fmt_limit(lim[k], k)) for k, _ in _LIMITS if k in lim]
        rows.append(("CPUs", f"{lim['cpus']} ({lim.get('cpus_usable', '?')} usable)"))
        rows.append(("memory", _fmt_bytes(lim["memory_bytes"])))
        out += _section("Limits", rows)
    t = info["transport"]
    if _err(t):
        out += _section("Transport", [("error", _err(t))])
    else:
        ident = t["host_identity"]
        host = " ".join(
            str(ident[k]) for k in ("hostname", "boot_id", "net_namespace", "ipc_namespace")
        )
        rows = [
            ("STRAGG_TRANSPORT", t["setting"]),
            ("ranks on this host", t["ranks_on_this_host"]),
            ("ranks across hosts", t["ranks_across_hosts"]),
            ("host identity", host),
            ("TCP address", t["tcp_advertised_address"] or t["tcp_address_source"]),
        ]
        if "probe" in t:
            rows.append(("probe (2 ranks here)", _probe_desc(t["probe"])))
        out += _section("Transport", rows)
    st = info["settings"]
    if _err(st):
        out += _section("Settings", [("error", _err(st))])
    else:
        rows = [(k, val) for k, val in st["environment"].items()] or [("STRAGG_*", "none set")]
        rows += [(k, val) for k, val in st["related_environment"].items()]
        rows += [(f"override {k}", val) for k, val in st["python_overrides"].items()]
        eff = st["effective"]
        if _err(eff):
            rows.append(("INVALID", _err(eff)))
        else:
            rows.append(("algorithm", eff["algo"]))
            rows.append(("straggler", _straggler_desc(eff["straggler"])))
            rows.append(("profiler", "on" if eff["profile"] == "1" else "off"))
            rows.append(("shm staging", f"{eff['shm_slots']} x {eff['shm_slot_bytes']} per peer"))
            rows.append(("one-shot", f"all_reduce up to {eff['oneshot_bytes']} (one host)"))
        out += _section("Settings", rows)
    return "\n".join(out)


def _install_desc(inst: Any) -> str:
    if _err(inst):
        return str(_err(inst))
    if inst.get("distribution") is None:
        return f"not an installed distribution (imported from {inst['package_dir']})"
    kind = "editable" if inst.get("editable") else "regular"
    ep = "yes" if inst.get("autoload_entry_point") else "MISSING"
    where = inst["package_dir"]
    return f"{kind} install of {inst['distribution']} at {where}; autoload entry point {ep}"


def _straggler_desc(text: str) -> str:
    return {"auto": "auto (profiler)"}.get(text, f"rank {text}" if text.isdigit() else text)


def _probe_desc(p: Any) -> str:
    if _err(p):
        return f"failed: {_err(p)}"
    result = "ok" if p["ok"] else "WRONG"
    return f"transport {p['transport']}, algorithm {p['algorithm']}, all_reduce {result}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stragg.info",
        description="Print what a stragg bug report needs: versions, build, CUDA/NCCL, shared "
        "memory, limits, transport for this host and the STRAGG_* settings in force.",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    parser.add_argument(
        "--probe",
        action="store_true",
        help="also create a 2-rank stragg group on this host and report its transport",
    )
    args = parser.parse_args(argv)
    info = collect(probe=args.probe)
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True, default=str))
    else:
        print(format_text(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
