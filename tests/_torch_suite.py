"""torch's own distributed test suite (DistributedTest._DistTestBase) on a backend.

    python tests/_torch_suite.py --world-size 4                    # every test, on stragg
    python tests/_torch_suite.py --world-size 2 --backend gloo     # the same on Gloo
    python tests/_torch_suite.py --world-size 2 -k test_all_reduce_sum -k test_barrier
    python tests/_torch_suite.py --world-size 4 --json out.json    # per-test outcome and reason

torch.testing._internal.distributed.distributed_test is the suite torch runs on Gloo and NCCL
(test/distributed/test_distributed_spawn.py). This runner builds the same test class, with its
processes forked instead of spawned (the suite's own CPU-backend path, much faster to start),
runs the selected tests with unittest and reports pass / fail / skip, every skip with its
reason. tests/test_torch_suite.py runs a focused subset of it in CI; docs/benchmarks.md has the counts.

Environment: BACKEND, WORLD_SIZE, TEMP_DIR and INIT_METHOD are set here for the suite module
(it reads them at import); DISTRIBUTED_TESTS_DEFAULT_TIMEOUT (seconds per test, default 90
here) bounds a test that hangs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import tempfile
import time
import unittest
from typing import Any


def _configure_env(backend: str, world_size: int, temp_dir: str) -> None:
    os.environ["BACKEND"] = backend
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["TEMP_DIR"] = temp_dir
    os.environ.setdefault("INIT_METHOD", "env://")
    os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "90")
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def alias_backend(real: str, named: str) -> None:
    """Every process group the suite asks for on backend `named` is created on `real`.

    With BACKEND=<named> the suite takes all its skip decisions for the backend it believes it
    runs on (several of them test the name, not a capability); this shows which of the tests
    skipped for the name alone pass on `real`. Inherited by the forked ranks.
    """
    import torch.distributed as dist

    def swap(backend: Any) -> Any:
        return real if isinstance(backend, str) and backend.lower() == named else backend

    init, new = dist.init_process_group, dist.new_group

    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        return init(swap(backend), *args, **kwargs)

    def new_group(*args: Any, backend: Any = None, **kwargs: Any) -> Any:
        if len(args) >= 3:  # new_group(ranks, timeout, backend, ...)
            args = (*args[:2], swap(args[2]), *args[3:])
            return new(*args, **kwargs)
        return new(*args, backend=swap(backend), **kwargs)

    dist.init_process_group = init_process_group
    dist.new_group = new_group


def enable_profiler_checks(backend: str) -> None:
    """Adds `backend` to the suite's lists of backends whose profiler events it checks (names
    "<backend>:<op>", async, one event per call, input shapes with record_shapes=True)."""
    from torch.testing._internal.distributed import distributed_test as suite

    for name in ("PROFILING_SUPPORTED_BACKENDS", "SEND_RECV_PROFILING_SUPPORTED_BACKENDS"):
        backends = getattr(suite, name, None)
        if isinstance(backends, list) and backend not in backends:
            backends.append(backend)


def build_test_class() -> type:
    """The suite's test class with forked ranks (import after _configure_env)."""
    import torch.multiprocessing
    from torch.testing._internal.distributed.distributed_test import (
        DistributedTest,
        TestDistBackend,
    )

    class TestDistBackendWithFork(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self) -> None:
            super().setUp()
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

    return TestDistBackendWithFork


class _Recorder(unittest.TextTestResult):
    """Outcome, reason and duration of every test."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.records: dict[str, dict[str, Any]] = {}
        self._t0 = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        self._t0 = time.monotonic()
        super().startTest(test)

    def _record(self, test: unittest.TestCase, outcome: str, reason: str = "") -> None:
        name = test.id().rsplit(".", 1)[-1]
        self.records[name] = {
            "outcome": outcome,
            "reason": reason.strip()[-2000:],
            "seconds": round(time.monotonic() - self._t0, 3),
        }

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self._record(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self._record(test, "fail", self._exc_info_to_string(err, test))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self._record(test, "skip", reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._record(test, "pass", "expected failure")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self._record(test, "fail", "unexpected success")


def test_names(cls: type) -> list[str]:
    return sorted(n for n in dir(cls) if n.startswith("test_") and callable(getattr(cls, n)))


def run(
    backend: str,
    world_size: int,
    patterns: list[str],
    exact: list[str],
    verbosity: int = 1,
    stream: Any = None,
    named: str = "",
    profiler_checks: bool = False,
) -> dict[str, dict[str, Any]]:
    """Runs the selected tests (all when no pattern/name given); returns name -> record.
    `named`: the backend name the suite is told (default: `backend` itself)."""
    with tempfile.TemporaryDirectory(prefix="stragg-torch-suite-") as tmp:
        _configure_env(named or backend, world_size, tmp)
        if backend == "stragg":
            import stragg  # noqa: F401  registers the backend (also autoloaded)
        if named and named != backend:
            alias_backend(backend, named)
        cls = build_test_class()
        if profiler_checks:
            enable_profiler_checks(backend)
        names = test_names(cls)
        if exact:
            unknown = sorted(set(exact) - set(names))
            if unknown:
                raise SystemExit(f"torch suite: no such tests: {', '.join(unknown)}")
            names = [n for n in names if n in set(exact)]
        if patterns:
            names = [n for n in names if any(p in n for p in patterns)]
        suite = unittest.TestSuite(cls(n) for n in names)
        runner = unittest.TextTestRunner(
            stream=stream or sys.stderr, verbosity=verbosity, resultclass=_Recorder
        )
        result = runner.run(suite)
    return result.records  # type: ignore[attr-defined]


def summarize(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    counts = collections.Counter(r["outcome"] for r in records.values())
    reasons = collections.Counter(
        r["reason"].splitlines()[0] if r["reason"] else "" for r in records.values()
        if r["outcome"] == "skip"
    )  # fmt: skip
    return {
        "total": len(records),
        "pass": counts.get("pass", 0),
        "fail": counts.get("fail", 0),
        "skip": counts.get("skip", 0),
        "skip_reasons": dict(reasons.most_common()),
        "failed": sorted(n for n, r in records.items() if r["outcome"] == "fail"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="stragg")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("-k", action="append", default=[], help="substring of test names (repeat)")
    p.add_argument("--test", action="append", default=[], help="exact test name (repeat)")
    p.add_argument("--as", dest="named", default="", metavar="NAME",
                   help="tell the suite the backend is NAME (e.g. gloo): its name-based skips "
                   "then run, on --backend")  # fmt: skip
    p.add_argument("--profiler-checks", action="store_true",
                   help="also run the suite's profiler assertions on --backend (torch runs "
                   "them only for gloo, nccl, mpi and ucc)")  # fmt: skip
    p.add_argument("--json", default="", help="write {summary, tests} here")
    p.add_argument("-v", action="store_true", help="one line per test")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    with contextlib.redirect_stdout(sys.stderr):
        records = run(
            args.backend, args.world_size, args.k, args.test, 2 if args.v else 1,
            named=args.named, profiler_checks=args.profiler_checks,
        )  # fmt: skip
    summary = summarize(records)
    summary.update(backend=args.backend, named=args.named or args.backend,
                   profiler_checks=args.profiler_checks,
                   world_size=args.world_size,
                   wall_s=round(time.monotonic() - t0, 1))  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "tests": records}, f, indent=1, sort_keys=True)
    print(json.dumps({k: v for k, v in summary.items() if k != "skip_reasons"}))
    for reason, n in summary["skip_reasons"].items():
        print(f"  skip x{n}: {reason}")
    return 0 if summary["fail"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
