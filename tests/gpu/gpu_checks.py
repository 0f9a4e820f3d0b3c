"""The GPU checks of tests/gpu/README.md, each under its own time limit, with a JSON summary.

    bash tests/gpu/run_gpu_checks.sh OUTDIR            # on the GPU machine (offline)
    bash tests/gpu/run_gpu_checks.sh --dry-run OUTDIR  # on a CPU machine (CI)

Writes OUTDIR/summary.json (rewritten after every step, so a run cut short still leaves one) and
one log per step: build.log, reduce.log, executor.log, nccl.log, bench.log, python.log,
sanitizer.log. Nothing else goes to OUTDIR (the device tool returns at most 8 files); the raw
GoogleTest JSON and JUnit XML stay in the build directory.

A real run builds stragg once (CMake, the torch-free libraries, the CUDA kernels, the GPU test
suites and stragg._C / stragg._core against the torch of the Python found) and runs the checks
with STRAGG_TEST_REQUIRE=1, so a check that cannot run fails instead of skipping. A failed build
stops the run, except when only stragg._C failed: then the C++ checks still run and checks 5-6
are skipped. The dry run builds and lists everything for real and reports each GPU step as
"would_run" with its time limit.

Environment: PYTHON (the Python whose torch to build against), STRAGG_GPU_BUILD (build
directory, default build/gpu-run; an already configured one is reused as it is),
STRAGG_GPU_DEPS (carried GoogleTest / nlohmann_json, default .gpu-deps, see stage_deps.sh),
STRAGG_GPU_USE_DEPS=1 (use the carried ones even where the system has them), STRAGG_BUILD_JOBS
(default: the cores), CUDA_ARCHS (default: the GPU's, else CMake's default 80;90),
STRAGG_GPU_BUILD_LIMIT (seconds; default 240 on the GPU machine, 1800 in a dry run).
Standard library only: it runs with any python3 >= 3.9.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BUILD_LIMIT_S = 240  # budget on the GPU machine: build <= 4 min
CHECKS_BUDGET_S = 300  # ... and the checks <= 5 min (the limits below add up to it)
KILL_GRACE_S = 10  # timeout -k: SIGKILL this long after SIGTERM
MIN_PCT_OF_COPY = 90  # check 4's roofline threshold
# Configure arguments that only the torch-facing part (stragg._C, stragg._core) needs (the
# Python stays: NCCL's headers are found through its nvidia-nccl wheel).
TORCH_ONLY_ARGS = (
    "-DSTRAGG_TORCH=",
    "-DSTRAGG_PYTHON=",
    "-DSTRAGG_BACKEND_CUDA=",
    "-DCMAKE_LIBRARY_OUTPUT_DIRECTORY=",
    "-DCUDA_nvrtc_LIBRARY=",
)


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    number: str  # the check's number in tests/gpu/README.md
    title: str
    limit_s: int
    log: str


CHECKS = (
    Check(
        "reduce_kernels",
        "1",
        "reduction kernels on the device, bitwise vs the CPU",
        25,
        "reduce.log",
    ),
    Check(
        "executor_ipc", "2", "GpuExecutor over CUDA IPC, forked ranks on GPU 0", 45, "executor.log"
    ),
    Check(
        "nccl_p2p",
        "3",
        "NcclP2P with one rank, the executor's scratch/staged paths",
        30,
        "nccl.log",
    ),
    Check("roofline", "4", "reduce kernels vs a D2D cudaMemcpyAsync, >= 90% each", 20, "bench.log"),
    Check(
        "backend_cuda",
        "5-6",
        "dist.all_reduce on CUDA tensors: stream semantics, the backend",
        90,
        "python.log",
    ),
    Check("memcheck", "7", "compute-sanitizer memcheck over checks 1-2", 60, "sanitizer.log"),
    Check("racecheck", "7", "compute-sanitizer racecheck over checks 1-2", 30, "sanitizer.log"),
)
assert sum(c.limit_s for c in CHECKS) <= CHECKS_BUDGET_S

# The executor cases the sanitizers run (every one under memcheck would outlast its limit).
SANITIZED_EXECUTOR_CASES = (
    "Algorithms/CudaIpcAllreduce.*/ring_2:Algorithms/CudaIpcAllreduce.*/stragglar_4"
)


def log(msg: str) -> None:
    print(f"gpu-checks: {msg}", flush=True)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------------------------
# Running commands under a time limit
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Ran:
    rc: int
    seconds: float
    timed_out: bool
    output: str  # what the command printed (also appended to the log)


def run(
    cmd: list[str],
    log_path: Path,
    limit_s: float,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> Ran:
    """Runs cmd under coreutils `timeout` (which signals the command's whole process group, forked
    ranks included), appending a header and its output to log_path."""
    limit = int(limit_s)
    if limit < 1:
        with log_path.open("a", encoding="utf-8") as f:
            f.write(f"\n$ {' '.join(cmd)}\n# not run: the step's time limit is spent\n")
        return Ran(124, 0.0, True, "")
    full = ["timeout", "-k", str(KILL_GRACE_S), str(limit), *cmd]
    t0 = time.monotonic()
    with log_path.open("a", encoding="utf-8") as f:
        f.write(f"\n$ {' '.join(cmd)}    # time limit {limit} s\n")
        f.flush()
        start = f.tell()
        proc = subprocess.run(
            full,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            check=False,
        )
    seconds = time.monotonic() - t0
    with log_path.open("r", encoding="utf-8", errors="replace") as f:
        f.seek(start)
        output = f.read()
    timed_out = proc.returncode in (124, 137)
    with log_path.open("a", encoding="utf-8") as f:
        what = f"TIMED OUT after {limit} s" if timed_out else f"exit {proc.returncode}"
        f.write(f"# {what}, {seconds:.1f} s\n")
    return Ran(proc.returncode, seconds, timed_out, output)


def shown(arg: str) -> str:
    """A path inside the repository relative to its root (the summary's commands)."""
    if arg.startswith(str(ROOT) + os.sep):
        return os.path.relpath(arg, ROOT)
    return arg


def capture(cmd: list[str], limit_s: float = 60, env: dict[str, str] | None = None) -> str | None:
    """stdout of a short probe, None when it fails or cannot start."""
    try:
        p = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=limit_s,
            env=env,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


# ----------------------------------------------------------------------------------------------
# Parsing the checks' outputs into key figures (also used by tests/gpu/test_gpu_summary.py)
# ----------------------------------------------------------------------------------------------

# Properties the GPU suites record per test (RecordProperty), summed over the tests.
GTEST_COUNTED = (
    "elements_compared",
    "bitwise_mismatches",
    "rank_results_compared",
    "rank_results_differing",
)


def gtest_figures(report: dict[str, Any]) -> dict[str, Any]:
    """GoogleTest's --gtest_output=json report -> counts, failed/skipped tests, summed properties."""
    figures: dict[str, Any] = {"tests": 0, "passed": 0, "failed": 0, "skipped": 0}
    failed: list[str] = []
    skipped: list[str] = []
    sums = {key: 0 for key in GTEST_COUNTED}
    seen = set()
    for suite in report.get("testsuites", []):
        for case in suite.get("testsuite", []):
            name = f"{suite.get('name', '')}.{case.get('name', '')}"
            figures["tests"] += 1
            if case.get("failures"):
                figures["failed"] += 1
                failed.append(name)
            elif case.get("result") == "SKIPPED":
                figures["skipped"] += 1
                skipped.append(name)
            else:
                figures["passed"] += 1
            for key in GTEST_COUNTED:
                if key in case:
                    seen.add(key)
                    sums[key] += int(case[key])
    if failed:
        figures["failed_tests"] = failed[:20]
    if skipped:
        figures["skipped_tests"] = skipped[:20]
    figures.update({key: sums[key] for key in GTEST_COUNTED if key in seen})
    return figures


def read_gtest_report(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def bench_figures(output: str, min_pct: float = MIN_PCT_OF_COPY) -> dict[str, Any]:
    """bench_reduce --json's line -> the copy's and each row's memory bandwidth, the rows below."""
    report = None
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("{") and '"rows"' in line:
            report = json.loads(line)
    if report is None:
        return {}
    rows = report.get("rows", [])
    figures: dict[str, Any] = {
        "device": report.get("device"),
        "mib_per_operand": int(report.get("bytes", 0)) >> 20,
        "copy_membw_gbps": report.get("copy_membw_gbps"),
    }
    if rows:
        figures["reduce_membw_gbps_min"] = min(r["membw_gbps"] for r in rows)
        figures["reduce_membw_gbps_max"] = max(r["membw_gbps"] for r in rows)
        figures["pct_of_copy_min"] = min(r["pct_of_copy"] for r in rows)
        figures["rows_below_min_pct"] = [
            f"{r['dtype']} {r['op']} {r['pct_of_copy']}%"
            for r in rows
            if r["pct_of_copy"] < min_pct
        ]
        figures["rows"] = {
            f"{r['dtype']} {r['op']}": [r["membw_gbps"], r["pct_of_copy"]] for r in rows
        }
    return figures


def junit_figures(path: Path) -> dict[str, Any]:
    """pytest --junitxml report -> counts and the failed / skipped tests."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {}
    figures: dict[str, Any] = {"tests": 0, "passed": 0, "failed": 0, "skipped": 0}
    failed: list[str] = []
    skipped: list[str] = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        figures["tests"] += 1
        if case.find("failure") is not None or case.find("error") is not None:
            figures["failed"] += 1
            failed.append(name)
        elif case.find("skipped") is not None:
            figures["skipped"] += 1
            skipped.append(name)
        else:
            figures["passed"] += 1
    if failed:
        figures["failed_tests"] = failed[:20]
    if skipped:
        figures["skipped_tests"] = skipped[:20]
    return figures


_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_RACE_SUMMARY = re.compile(
    r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)"
)
_UNSUPPORTED = ("Device not supported", "device not supported")


def sanitizer_figures(output: str) -> dict[str, Any]:
    """compute-sanitizer's closing lines (one per process it followed) -> errors, hazards."""
    errors = [int(m.group(1)) for m in _ERROR_SUMMARY.finditer(output)]
    figures: dict[str, Any] = {"processes": len(errors), "errors": sum(errors)}
    races = list(_RACE_SUMMARY.finditer(output))
    if races:
        figures["hazards"] = sum(int(m.group(1)) for m in races)
        figures["race_errors"] = sum(int(m.group(2)) for m in races)
        figures["race_warnings"] = sum(int(m.group(3)) for m in races)
    if any(u in output for u in _UNSUPPORTED):
        figures["device_not_supported"] = True
    return figures


def pytest_collect_figures(output: str) -> dict[str, Any]:
    """pytest --collect-only -q output -> tests collected, modules skipped (with the reason)."""
    figures: dict[str, Any] = {"collected": 0}
    m = re.search(r"(\d+) tests? collected", output)
    if m:
        figures["collected"] = int(m.group(1))
    skips = re.findall(r"SKIPPED \[(\d+)\] [^:]+:\d+: (.*)", output)
    if skips:
        figures["modules_skipped"] = sum(int(n) for n, _ in skips)
        figures["skip_reasons"] = sorted({reason for _, reason in skips})
    return figures


def count_listed_tests(output: str) -> int:
    """--gtest_list_tests output -> the number of tests (indented lines)."""
    return sum(1 for line in output.splitlines() if line.startswith("  ") and line.strip())


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TorchPython:
    path: str
    info: dict[str, Any]

    @property
    def has_cuda(self) -> bool:
        return self.info.get("torch_cuda") is not None


PROBE = r"""
import importlib.util, json, os, sys
out = {"python": sys.version.split()[0], "executable": sys.executable}
import torch
out["torch"] = torch.__version__
out["torch_cuda"] = torch.version.cuda
try:
    out["cuda_available"] = bool(torch.cuda.is_available())
    if out["cuda_available"]:
        out["gpu"] = torch.cuda.get_device_name(0)
        out["gpu_count"] = torch.cuda.device_count()
except Exception as e:
    out["cuda_available"] = False
    out["cuda_error"] = str(e)
for mod in ("pytest", "xdist", "pybind11", "numpy"):
    out["has_" + mod] = importlib.util.find_spec(mod) is not None
try:
    from importlib.metadata import version
    out["nccl_wheel"] = version("nvidia-nccl-cu13")
except Exception:
    out["nccl_wheel"] = None
site = [p for p in sys.path if p.endswith("site-packages")]
out["site_packages"] = site
print(json.dumps(out))
"""


def probe_python(path: str) -> TorchPython | None:
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = capture([path, "-c", PROBE], limit_s=120, env=env)
    if out is None:
        return None
    try:
        return TorchPython(path, json.loads(out.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return None


def find_torch_python(dry_run: bool) -> TorchPython | None:
    """PYTHON if set; else the first candidate whose torch has CUDA (dry run: any torch)."""
    if os.environ.get("PYTHON"):
        return probe_python(os.environ["PYTHON"])
    candidates = [str(ROOT / ".venv/bin/python")] if dry_run else []
    candidates += [
        "python3",
        "python",
        "/opt/torch/.venv/bin/python3",
        str(ROOT / ".venv/bin/python"),
    ]
    fallback = None
    for cand in candidates:
        exe = (
            shutil.which(cand) if "/" not in cand else (cand if os.access(cand, os.X_OK) else None)
        )
        if not exe:
            continue
        found = probe_python(exe)
        if found is None:
            continue
        if dry_run or found.has_cuda:
            return found
        fallback = fallback or found
    return fallback


def cuda_toolkit_root(nvcc: str) -> str | None:
    """CUDA_HOME, else nvcc's TOP (nvcc may be a wrapper script outside the toolkit)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    out = subprocess.run(
        [nvcc, "--dryrun", "-c", "-x", "cu", "/dev/null", "-o", "/dev/null"],
        capture_output=True,
        text=True,
        check=False,
    )
    m = re.search(r"#\$ TOP=(\S+)", out.stderr + out.stdout)
    return os.path.normpath(m.group(1)) if m else None


def find_sanitizer(nvcc: str | None) -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    if nvcc:
        roots.append(cuda_toolkit_root(nvcc) or "")
    for root in roots:
        for rel in ("bin/compute-sanitizer", "compute-sanitizer/compute-sanitizer"):
            p = Path(root) / rel
            if root and p.is_file() and os.access(p, os.X_OK):
                return str(p)
    return None


def gpu_query() -> list[str] | None:
    out = capture(
        [
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total,compute_cap",
            "--format=csv,noheader",
        ],
        limit_s=30,
    )
    if not out or not out.strip():
        return None
    return [part.strip() for part in out.strip().splitlines()[0].split(",")]


def cache_value(build: Path, key: str) -> str | None:
    try:
        text = (build / "CMakeCache.txt").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = re.search(rf"^{re.escape(key)}:[A-Z]+=(.*)$", text, re.MULTILINE)
    return m.group(1) if m else None


class Runner:
    def __init__(self, outdir: Path, dry_run: bool) -> None:
        self.out = outdir
        self.dry = dry_run
        self.build = Path(os.environ.get("STRAGG_GPU_BUILD", "build/gpu-run"))
        if not self.build.is_absolute():
            self.build = ROOT / self.build
        self.results = self.build / "gpu-results"
        self.jobs = os.environ.get("STRAGG_BUILD_JOBS") or str(os.cpu_count() or 1)
        self.build_limit = float(
            os.environ.get("STRAGG_GPU_BUILD_LIMIT", 1800 if dry_run else BUILD_LIMIT_S)
        )
        self.started = time.monotonic()
        self.summary: dict[str, Any] = {
            "mode": "dry_run" if dry_run else "gpu",
            "started": now_iso(),
            "finished": None,
            "result": "running",
            "budget_s": {"build": BUILD_LIMIT_S, "checks": CHECKS_BUDGET_S},
            "environment": {},
            "steps": [],
        }
        self.py: TorchPython | None = None
        self.nvcc = shutil.which("nvcc") or (
            "/usr/local/cuda/bin/nvcc" if os.access("/usr/local/cuda/bin/nvcc", os.X_OK) else None
        )
        self.have_torch_build = False  # stragg._C / _core built into build/py
        self.torch_build_error: str | None = None

    # -- summary ---------------------------------------------------------------------------

    def record(self, step: dict[str, Any]) -> None:
        why = step.get("error") or step.get("reason")
        if why and step.get("log"):
            with (self.out / step["log"]).open("a", encoding="utf-8") as f:
                f.write(f"\n# {step['name']}: {step['status']}: {why}\n")
        self.summary["steps"].append(step)
        self.write_summary()
        status = step["status"]
        secs = f", {step['seconds']:.1f} s" if step.get("seconds") is not None else ""
        log(
            f"{step['name']}: {status}{secs} (limit {step.get('limit_s')} s, log {step.get('log')})"
        )

    def write_summary(self, final: bool = False) -> None:
        counts: dict[str, int] = {}
        for step in self.summary["steps"]:
            counts[step["status"]] = counts.get(step["status"], 0) + 1
        self.summary["counts"] = counts
        self.summary["seconds"] = round(time.monotonic() - self.started, 1)
        if final:
            self.summary["finished"] = now_iso()
            self.summary["result"] = "failed" if counts.get("failed") else "passed"
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(self.summary, indent=1) + "\n", encoding="utf-8")
        tmp.replace(self.out / "summary.json")

    # -- environment and build --------------------------------------------------------------

    def env_for_tests(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        if not self.dry:
            env["STRAGG_TEST_REQUIRE"] = "1"  # a check that cannot run fails, never skips
        if self.have_torch_build:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(self.build / "py"), os.environ.get("PYTHONPATH", "")) if p
            )
        return env

    def environment(self, blog: Path) -> None:
        envd: dict[str, Any] = {
            "cores": os.cpu_count(),
            "build_dir": str(self.build),
            "build_jobs": self.jobs,
        }
        gpu = gpu_query()
        if gpu:
            envd["gpu"] = dict(zip(("name", "driver", "memory", "compute_cap"), gpu))
        envd["nvcc"] = self.nvcc
        if self.nvcc:
            out = capture([self.nvcc, "--version"]) or ""
            envd["nvcc_version"] = next((x for x in out.splitlines() if "release" in x), "")
        out = capture(["cmake", "--version"]) or ""
        envd["cmake"] = (out.strip().splitlines() or [""])[0]
        envd["compute_sanitizer"] = find_sanitizer(self.nvcc)
        self.py = find_torch_python(self.dry)
        if self.py is None and self.dry and not os.environ.get("PYTHON"):
            # A fresh clone on a CPU machine: scripts/setup.sh makes .venv (torch, pytest, NCCL).
            log("no Python with torch found: running scripts/setup.sh (log: build.log)")
            ran = run(["bash", "scripts/setup.sh"], blog, self.build_limit)
            if ran.rc == 0:
                self.py = probe_python(str(ROOT / ".venv/bin/python"))
        envd["python"] = self.py.info if self.py else None
        self.summary["environment"] = envd
        with blog.open("a", encoding="utf-8") as f:
            f.write("environment: " + json.dumps(envd, indent=1) + "\n")
        self.write_summary()

    def deps_prefixes(self, blog: Path, deadline: float) -> tuple[list[str], str | None]:
        """CMAKE_PREFIX_PATH entries for GoogleTest / nlohmann_json carried in .gpu-deps (built
        here once) where the system lacks them; (prefixes, error)."""
        deps = Path(os.environ.get("STRAGG_GPU_DEPS", str(ROOT / ".gpu-deps")))
        force = os.environ.get("STRAGG_GPU_USE_DEPS") == "1"
        prefixes: list[str] = []

        def system_has(rel: str) -> bool:
            return any((Path(p) / rel).is_file() for p in ("/usr/include", "/usr/local/include"))

        if force or not system_has("nlohmann/json.hpp"):
            if (deps / "nlohmann_json/include/nlohmann/json.hpp").is_file():
                prefixes.append(str(deps / "nlohmann_json"))
            elif not system_has("nlohmann/json.hpp"):
                return prefixes, (
                    "nlohmann_json not found: run `bash tests/gpu/stage_deps.sh` "
                    "where it is installed and carry .gpu-deps"
                )
        if force or not system_has("gtest/gtest.h"):
            src = deps / "googletest"
            if not (src / "CMakeLists.txt").is_file():
                if system_has("gtest/gtest.h"):
                    return prefixes, None
                return prefixes, (
                    "GoogleTest not found: run `bash tests/gpu/stage_deps.sh` where "
                    "it is installed and carry .gpu-deps"
                )
            prefix = self.build / "deps"
            if not list(prefix.glob("lib*/cmake/GTest/GTestConfig.cmake")):
                gbuild = self.build / "deps-build"
                gen = ["-G", "Ninja"] if shutil.which("ninja") else []
                for cmd in (
                    [
                        "cmake",
                        "-S",
                        str(src),
                        "-B",
                        str(gbuild),
                        *gen,
                        "-DCMAKE_BUILD_TYPE=Release",
                        "-DCMAKE_POLICY_VERSION_MINIMUM=3.5",
                        "-DBUILD_GMOCK=OFF",
                        "-DINSTALL_GTEST=ON",
                        f"-DCMAKE_INSTALL_PREFIX={prefix}",
                    ],
                    ["cmake", "--build", str(gbuild), "-j", self.jobs],
                    ["cmake", "--install", str(gbuild)],
                ):
                    ran = run(cmd, blog, deadline - time.monotonic())
                    if ran.rc != 0:
                        return prefixes, "building the carried GoogleTest failed (build.log)"
            prefixes.append(str(prefix))
        return prefixes, None

    def configure_args(self, prefixes: list[str]) -> list[str]:
        assert self.nvcc is not None
        args = [
            "-DCMAKE_BUILD_TYPE=Release",
            "-DCMAKE_POLICY_VERSION_MINIMUM=3.5",  # CMake 4 and older packages' configs
            "-DSTRAGG_BUILD_TESTS=ON",
            "-DSTRAGG_CUDA=on",
            f"-DCMAKE_CUDA_COMPILER={self.nvcc}",
        ]
        if shutil.which("ninja") and not (self.build / "Makefile").exists():
            args += ["-G", "Ninja"]
        root = cuda_toolkit_root(self.nvcc)
        if root:  # for torch's FindCUDA, when nvcc is a wrapper outside the toolkit
            args.append(f"-DCUDA_TOOLKIT_ROOT_DIR={root}")
        archs = os.environ.get("CUDA_ARCHS")
        gpu = self.summary["environment"].get("gpu")
        if not archs and gpu and re.fullmatch(r"\d+\.\d+", gpu.get("compute_cap", "")):
            archs = gpu["compute_cap"].replace(".", "")
        if archs:
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={archs}")
        if prefixes:
            args.append("-DCMAKE_PREFIX_PATH=" + ";".join(prefixes))
        if self.py:
            args += [
                f"-DPython_EXECUTABLE={self.py.info['executable']}",
                "-DSTRAGG_TORCH=ON",
                "-DSTRAGG_PYTHON=ON",
                # a CUDA torch: the GPU path must be compiled in; a CPU torch (dry run): auto
                "-DSTRAGG_BACKEND_CUDA=" + ("on" if self.py.has_cuda else "auto"),
                f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={self.build / 'py' / 'stragg'}",
            ]
            # torch's CMake config links nvrtc: take the one its wheels ship where the toolkit
            # has none.
            for site in self.py.info.get("site_packages", []):
                libs = sorted(Path(site).glob("nvidia/*/lib/libnvrtc.so.*"))
                libs = [p for p in libs if re.fullmatch(r"libnvrtc\.so\.\d+", p.name)]
                if libs and not (root and list(Path(root).glob("lib*/libnvrtc.so*"))):
                    args.append(f"-DCUDA_nvrtc_LIBRARY={libs[0]}")
                    break
        else:
            args += ["-DSTRAGG_TORCH=OFF", "-DSTRAGG_PYTHON=OFF"]
        return args

    def build_step(self) -> bool:
        """Configures (unless the build directory is already configured) and builds; False when
        nothing can run."""
        blog = self.out / "build.log"
        t0 = time.monotonic()
        step: dict[str, Any] = {
            "name": "build",
            "status": "passed",
            "limit_s": BUILD_LIMIT_S,
            "log": blog.name,
            "figures": {},
        }
        if self.dry:
            step["dry_run_limit_s"] = int(self.build_limit)
        self.environment(blog)
        deadline = t0 + self.build_limit
        figures = step["figures"]

        def fail(why: str) -> bool:
            step.update(status="failed", error=why, seconds=round(time.monotonic() - t0, 1))
            self.record(step)
            return False

        if self.nvcc is None:
            return fail("nvcc not found: the CUDA sources cannot be built")
        reuse = (self.build / "CMakeCache.txt").is_file() and "STRAGG_GPU_BUILD" in os.environ
        figures["reused_build_dir"] = reuse
        if not reuse:
            prefixes, err = self.deps_prefixes(blog, deadline)
            if err:
                return fail(err)
            args = self.configure_args(prefixes)
            step["configure"] = args
            t1 = time.monotonic()
            ran = run(
                ["cmake", "-S", str(ROOT), "-B", str(self.build), *args],
                blog,
                deadline - time.monotonic(),
            )
            if ran.rc != 0 and self.py is not None and not ran.timed_out:
                # The torch-facing part (Python headers, torch's CMake config) may be what fails:
                # configure without it, so that the C++ checks still run.
                self.torch_build_error = "configure with torch failed (build.log)"
                step.update(
                    status="failed",
                    error=self.torch_build_error,
                    torch_error=self.torch_build_error,
                )
                (self.build / "CMakeCache.txt").unlink(missing_ok=True)
                shutil.rmtree(self.build / "CMakeFiles", ignore_errors=True)
                args = [a for a in args if not a.startswith(TORCH_ONLY_ARGS)]
                args += ["-DSTRAGG_TORCH=OFF", "-DSTRAGG_PYTHON=OFF"]
                step["configure_without_torch"] = args
                ran = run(
                    ["cmake", "-S", str(ROOT), "-B", str(self.build), *args],
                    blog,
                    deadline - time.monotonic(),
                )
            figures["configure_s"] = round(time.monotonic() - t1, 1)
            if ran.rc != 0:
                return fail("configure failed" + (" (time limit)" if ran.timed_out else ""))
        if not cache_value(self.build, "CMAKE_CUDA_COMPILER"):
            return fail(f"{self.build} is configured without CUDA (STRAGG_CUDA=on needs nvcc)")
        figures["cuda_architectures"] = (
            cache_value(self.build, "CMAKE_CUDA_ARCHITECTURES") or "80;90 (the default)"
        )
        t1 = time.monotonic()
        ran = run(
            ["cmake", "--build", str(self.build), "-j", self.jobs, "--target", "stragg_cuda_check"],
            blog,
            deadline - time.monotonic(),
        )
        figures["build_gpu_s"] = round(time.monotonic() - t1, 1)
        if ran.rc != 0:
            return fail(
                "building stragg_cuda_check (kernels, GPU suites) failed"
                + (" (time limit)" if ran.timed_out else "")
            )
        torch_on = cache_value(self.build, "STRAGG_TORCH") in ("ON", "1", "TRUE", "on")
        if torch_on:
            t1 = time.monotonic()
            ran = run(
                ["cmake", "--build", str(self.build), "-j", self.jobs, "--target", "_C", "_core"],
                blog,
                deadline - time.monotonic(),
            )
            figures["build_torch_s"] = round(time.monotonic() - t1, 1)
            if ran.rc != 0:
                self.torch_build_error = "building stragg._C / stragg._core failed" + (
                    " (time limit)" if ran.timed_out else ""
                )
                step.update(status="failed", error=self.torch_build_error)
            else:
                pkg = self.build / "py" / "stragg"
                shutil.copytree(
                    ROOT / "python" / "stragg",
                    pkg,
                    dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"),
                )
                self.have_torch_build = True
        elif self.torch_build_error is None:
            self.torch_build_error = "the build directory has STRAGG_TORCH=OFF (no stragg._C)"
        figures["gpu_path_compiled"] = self.gpu_path_compiled(blog)
        step["seconds"] = round(time.monotonic() - t0, 1)
        self.record(step)
        return True

    def gpu_path_compiled(self, blog: Path) -> bool | None:
        """stragg._C.cuda_allreduce_compiled of the stragg the tests will import."""
        if self.py is None:
            return None
        code = "import stragg._C as C; print('cuda_allreduce_compiled', C.cuda_allreduce_compiled)"
        ran = run([self.py.path, "-c", code], blog, 120, env=self.env_for_tests())
        m = re.search(r"cuda_allreduce_compiled (True|False)", ran.output)
        return None if m is None else m.group(1) == "True"

    # -- checks ----------------------------------------------------------------------------

    def gtest_bin(self, name: str) -> Path:
        return self.build / "tests" / "gpu" / name

    def base_step(self, check: Check) -> dict[str, Any]:
        return {
            "name": check.name,
            "check": check.number,
            "title": check.title,
            "limit_s": check.limit_s,
            "log": check.log,
            "figures": {},
        }

    def finish(self, step: dict[str, Any], ran: Ran | None, ok: bool) -> None:
        if ran is not None:
            step["seconds"] = round(ran.seconds, 1)
            step["rc"] = ran.rc
            if ran.timed_out:
                step["timed_out"] = True
        step["status"] = "passed" if ok else "failed"
        self.record(step)

    def skip(self, step: dict[str, Any], why: str) -> None:
        step.update(status="skipped", reason=why)
        self.record(step)

    def gtest_check(self, check: Check, binary: str, missing_ok: str | None = None) -> None:
        step = self.base_step(check)
        exe = self.gtest_bin(binary)
        logp = self.out / check.log
        report = self.results / f"{binary}.json"
        step["command"] = shown(str(exe))
        if not exe.is_file():
            if missing_ok:
                return self.skip(step, missing_ok)
            step.update(status="failed", error=f"{exe} was not built")
            return self.record(step)
        if self.dry:
            ran = run([str(exe), "--gtest_list_tests"], logp, 60, env=self.env_for_tests())
            step["figures"]["tests"] = count_listed_tests(ran.output)
            if ran.rc != 0:
                step.update(status="failed", error="--gtest_list_tests failed", rc=ran.rc)
                return self.record(step)
            step["status"] = "would_run"
            return self.record(step)
        report.unlink(missing_ok=True)
        ran = run(
            [str(exe), f"--gtest_output=json:{report}"],
            logp,
            check.limit_s,
            env=self.env_for_tests(),
        )
        parsed = read_gtest_report(report)
        if parsed is not None:
            step["figures"] = gtest_figures(parsed)
        self.finish(step, ran, ran.rc == 0 and parsed is not None)

    def bench_check(self, check: Check) -> None:
        step = self.base_step(check)
        exe = self.build / "kernels" / "bench_reduce"
        cmd = [str(exe), "--json", "--min-pct", str(MIN_PCT_OF_COPY)]
        step["command"] = " ".join(shown(a) for a in cmd)
        if not exe.is_file():
            step.update(status="failed", error=f"{exe} was not built")
            return self.record(step)
        if self.dry:
            step["status"] = "would_run"
            return self.record(step)
        ran = run(cmd, self.out / check.log, check.limit_s)
        step["figures"] = bench_figures(ran.output)
        self.finish(step, ran, ran.rc == 0)

    def python_check(self, check: Check) -> None:
        step = self.base_step(check)
        logp = self.out / check.log
        if self.py is None:
            return self.skip_or_fail(step, "no Python with torch was found (PYTHON=...)")
        pytest_args = ["-m", "pytest", "tests/gpu/test_gpu.py", "-ra", "-p", "no:cacheprovider"]
        step["command"] = f"{self.py.path} {' '.join(pytest_args)}"
        if self.dry:
            ran = run(
                [self.py.path, *pytest_args, "--collect-only", "-q"],
                logp,
                120,
                env=self.env_for_tests(),
            )
            step["figures"] = pytest_collect_figures(ran.output)
            # 5: nothing collected (the module skips itself without torch.cuda)
            if ran.rc not in (0, 5):
                step.update(status="failed", error="pytest could not collect tests/gpu", rc=ran.rc)
                return self.record(step)
            step["status"] = "would_run"
            return self.record(step)
        if not self.py.has_cuda:
            return self.skip_or_fail(step, f"torch {self.py.info.get('torch')} has no CUDA")
        if not self.have_torch_build:
            return self.skip(step, self.torch_build_error or "stragg._C was not built")
        junit = self.results / "pytest.xml"
        junit.unlink(missing_ok=True)
        extra = ["-n", "2"] if self.py.info.get("has_xdist") else []
        ran = run(
            [self.py.path, *pytest_args, *extra, f"--junitxml={junit}"],
            logp,
            check.limit_s,
            env=self.env_for_tests(),
        )
        step["figures"] = junit_figures(junit)
        self.finish(step, ran, ran.rc == 0)

    def skip_or_fail(self, step: dict[str, Any], why: str) -> None:
        """On the GPU machine a check that cannot run is a failure (STRAGG_TEST_REQUIRE=1)."""
        step.update(status="failed", error=why)
        self.record(step)

    def sanitizer_check(self, check: Check, tool: str) -> None:
        step = self.base_step(check)
        sanitizer = find_sanitizer(self.nvcc)
        reduce_bin, exec_bin = (
            self.gtest_bin("test_gpu_reduce"),
            self.gtest_bin("test_gpu_executor"),
        )
        base = [
            sanitizer or "compute-sanitizer",
            "--tool",
            tool,
            "--target-processes",
            "all",
            "--error-exitcode",
            "1",
            "--print-limit",
            "20",
        ]
        runs = [
            [*base, str(reduce_bin), f"--gtest_output=json:{self.results / f'{tool}-reduce.json'}"],
            [
                *base,
                str(exec_bin),
                f"--gtest_filter={SANITIZED_EXECUTOR_CASES}",
                f"--gtest_output=json:{self.results / f'{tool}-executor.json'}",
            ],
        ]
        step["command"] = " ; ".join(
            " ".join(["compute-sanitizer", *(shown(a) for a in r[1:-1])]) for r in runs
        )
        if self.dry:
            step["status"] = "would_run"
            step["figures"]["compute_sanitizer_here"] = sanitizer
            return self.record(step)
        if sanitizer is None:
            return self.skip_or_fail(step, "compute-sanitizer not found (PATH, CUDA_HOME)")
        logp = self.out / check.log
        t0 = time.monotonic()
        deadline = t0 + check.limit_s
        ok = True
        total: dict[str, Any] = {}
        last: Ran | None = None
        for cmd in runs:
            left = deadline - time.monotonic()
            if left < 1:
                ok = False
                step["timed_out"] = True
                break
            last = run(cmd, logp, left, env=self.env_for_tests())
            figs = sanitizer_figures(last.output)
            for key, value in figs.items():
                total[key] = total.get(key, 0) + value if not isinstance(value, bool) else value
            ok = ok and last.rc == 0
            if last.timed_out:
                step["timed_out"] = True
                break
        step["figures"] = total
        step["seconds"] = round(time.monotonic() - t0, 1)
        if total.get("device_not_supported"):
            return self.skip(step, "compute-sanitizer refused the device (as under gVisor)")
        if last is not None:
            step["rc"] = last.rc
        self.finish(step, None, ok)

    def run_all(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        for name in ["summary.json"] + sorted({c.log for c in CHECKS} | {"build.log"}):
            (self.out / name).unlink(missing_ok=True)
        self.results.mkdir(parents=True, exist_ok=True)
        log(f"{'dry run' if self.dry else 'GPU run'}: build {self.build}, output {self.out}")
        if not self.build_step():
            for check in CHECKS:
                step = self.base_step(check)
                self.skip(step, "the build failed (build.log)")
            self.write_summary(final=True)
            return 1
        by_name = {c.name: c for c in CHECKS}
        self.gtest_check(by_name["reduce_kernels"], "test_gpu_reduce")
        self.gtest_check(by_name["executor_ipc"], "test_gpu_executor")
        nccl_lib = cache_value(self.build, "STRAGG_NCCL_LIBRARY") or ""
        self.gtest_check(
            by_name["nccl_p2p"],
            "test_gpu_nccl",
            missing_ok=None
            if nccl_lib and not nccl_lib.endswith("NOTFOUND")
            else "no NCCL library found at configure: test_gpu_nccl not built",
        )
        self.bench_check(by_name["roofline"])
        self.python_check(by_name["backend_cuda"])
        self.sanitizer_check(by_name["memcheck"], "memcheck")
        self.sanitizer_check(by_name["racecheck"], "racecheck")
        self.write_summary(final=True)
        log(
            f"{self.summary['result']}: {self.summary['counts']} in {self.summary['seconds']} s; "
            f"summary: {self.out / 'summary.json'}"
        )
        return 0 if self.summary["result"] == "passed" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU machine: build and list for real, report GPU steps as would_run",
    )
    parser.add_argument("outdir", type=Path, help="summary.json and the logs go here")
    args = parser.parse_args(argv)
    outdir = args.outdir if args.outdir.is_absolute() else Path.cwd() / args.outdir
    return Runner(outdir, args.dry_run).run_all()


if __name__ == "__main__":
    sys.exit(main())
