"""torch's own distributed test suite (DistributedTest._DistTestBase) on stragg at world sizes 2
and 4, through tests/_torch_suite.py (forked ranks; ~1 minute per run on 2 cores).

1. As torch would run it for a backend called "stragg": every test of the suite; all that apply
   to a CPU backend must pass, except the known failure below.
2. The tests torch skips only because the backend is not called "gloo" (its decorators test the
   name, not a capability), run on stragg with the suite told it is Gloo: they must pass, except
   those whose failure is the name itself.

docs/benchmarks.md has the counts, docs/integrations.md the skip reasons.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
RUNNER = REPO / "tests" / "_torch_suite.py"

pytestmark = [pytest.mark.slow, pytest.mark.needs_backend, pytest.mark.stragg_only]
if os.environ.get("STRAGG_TEST_REQUIRE") != "1":
    pytest.importorskip("expecttest", reason="torch's test utilities need expecttest")

# DDP's logging data reports every plugin backend as "custom" (torch's reducer knows only its
# built-in backends by name): torch's doing, nothing a plugin can change.
KNOWN_FAILURES = {"test_ddp_logging_data_cpu": "'custom' != 'stragg'"}
# Passing on stragg at world size 2 and 4 when measured (2-core VM, torch 2.13.0); fewer means
# tests stopped running on stragg (e.g. skipped because the backend is not registered).
MIN_PASSES = 64

# Skipped on "stragg" but run on "gloo" only because of the backend's name (measured: the set
# difference of the two runs at world size 4; the last three need 4 ranks on Gloo too).
NAME_ONLY_SKIPS = (
    "test_DistributedDataParallel_requires_grad",
    "test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_accumulate_gradients_no_sync_grad_is_view",
    "test_all_gather_object_default_pg",
    "test_all_gather_object_subgroup",
    "test_all_reduce_coalesced_full_group_max",
    "test_all_reduce_coalesced_full_group_min",
    "test_all_reduce_coalesced_full_group_product",
    "test_all_reduce_coalesced_full_group_sum",
    "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_min",
    "test_all_reduce_coalesced_product",
    "test_all_reduce_coalesced_sum",
    "test_barrier_timeout_full_group",
    "test_batch_isend_irecv_gloo",
    "test_batch_isend_irecv_gloo_tags",
    "test_get_future",
    "test_grads_same_across_ranks_with_no_sync",
    "test_monitored_barrier_gloo",
    "test_monitored_barrier_gloo_rank_0_timeout",
    "test_monitored_barrier_gloo_subgroup",
    "test_scatter_object_list",
    "test_sparse_all_reduce_sum",
    "test_gather_object",
    "test_gather_object_subgroup",
    "test_new_subgroups_with_group_param",
)
# dist.monitored_barrier() itself refuses every backend but Gloo by name (torch's Python).
_REFUSED = "monitored_barrier is only implemented for GLOO backend"
NAME_CHECKED_BY_TORCH = {
    "test_monitored_barrier_gloo": _REFUSED,
    "test_monitored_barrier_gloo_subgroup": _REFUSED,
}


def _suite(tmp_path: Path, world_size: int, *args: str) -> dict[str, Any]:
    out = tmp_path / f"suite-{world_size}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRAGG_", "MASTER_"))}
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--world-size", str(world_size), "--json", str(out), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert out.exists(), proc.stderr[-5000:]
    return json.loads(out.read_text())


def _failures(result: dict[str, Any]) -> dict[str, str]:
    return {n: r["reason"] for n, r in result["tests"].items() if r["outcome"] == "fail"}


@pytest.mark.parametrize("world_size", [2, 4])
def test_suite_as_torch_runs_it(tmp_path: Path, world_size: int) -> None:
    result = _suite(tmp_path, world_size)
    summary = result["summary"]
    failures = _failures(result)
    unexpected = {n: r[-1500:] for n, r in failures.items() if n not in KNOWN_FAILURES}
    assert not unexpected, json.dumps(unexpected, indent=1)
    for name, text in KNOWN_FAILURES.items():
        if name in failures:
            assert text in failures[name], failures[name][-1500:]
    assert summary["pass"] >= MIN_PASSES, summary
    # Every test of torch's suite (285 in torch 2.13.0) reached an outcome, none "errored".
    assert summary["total"] >= 280, summary
    assert summary["total"] == summary["pass"] + summary["fail"] + summary["skip"], summary
    tests = result["tests"]
    for core in ("test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_sum_complex",
                 "test_all_reduce_max", "test_all_reduce_min", "test_all_reduce_product",
                 "test_all_reduce_full_group_sum", "test_broadcast", "test_all_gather",
                 "test_barrier", "test_barrier_full_group"):  # fmt: skip
        assert core in tests, (core, sorted(tests)[:20])
        assert tests[core]["outcome"] == "pass", (core, tests[core])


@pytest.mark.parametrize("world_size", [2, 4])
def test_name_only_skips_pass_on_stragg(tmp_path: Path, world_size: int) -> None:
    args = ["--as", "gloo"]
    for name in NAME_ONLY_SKIPS:
        args += ["--test", name]
    result = _suite(tmp_path, world_size, *args)
    tests = result["tests"]
    assert set(tests) == set(NAME_ONLY_SKIPS)
    failures = _failures(result)
    unexpected = {n: r[-1500:] for n, r in failures.items() if n not in NAME_CHECKED_BY_TORCH}
    assert not unexpected, json.dumps(unexpected, indent=1)
    for name, text in NAME_CHECKED_BY_TORCH.items():
        if name in failures:
            assert text in failures[name]
    passed = {n for n, r in tests.items() if r["outcome"] == "pass"}
    skipped = {n: r["reason"] for n, r in tests.items() if r["outcome"] == "skip"}
    # The only skips left are for the world size (Gloo skips them too at this size).
    assert all("world size" in why.lower() for why in skipped.values()), skipped
    assert passed == set(NAME_ONLY_SKIPS) - set(NAME_CHECKED_BY_TORCH) - set(skipped)
    assert len(passed) >= 23
