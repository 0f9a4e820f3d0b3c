"""The text of `python -m stragg.info`: the collectors' dict (stragg._info_collect.collect) as
one titled section per part, "key : value" rows."""

from __future__ import annotations

from typing import Any

from ._info_collect import _LIMITS


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
        if t.get("tcp_slow_start_after_idle"):
            rows.append(("TCP tuning", "net.ipv4.tcp_slow_start_after_idle = 1: idle connections "
                         "restart slow start (set it to 0 on every host, docs/settings.md)"))
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
