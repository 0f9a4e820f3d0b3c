"""The GPU run's summary parsers (tests/gpu/gpu_checks.py) on outputs of the shapes the GPU
machine prints, so a parsing slip costs no device time. Runs on the CPU (CI)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import gpu_checks as g

GTEST_REPORT = {
    "tests": 3,
    "failures": 1,
    "testsuites": [
        {
            "name": "GpuReduce",
            "testsuite": [
                {
                    "name": "MatchesCpuForEveryDtypeAndOp",
                    "result": "COMPLETED",
                    "elements_compared": "1200",
                    "bitwise_mismatches": "7",
                    "failures": [{"failure": "float16 SUM ...", "type": ""}],
                },
                {
                    "name": "ScaleAndDivideMatchCpu",
                    "result": "COMPLETED",
                    "elements_compared": "300",
                    "bitwise_mismatches": "0",
                },
                {"name": "ArgumentErrorsThrowWithoutTouchingTheDevice", "result": "COMPLETED"},
            ],
        },
        {
            "name": "NcclAllreduce",
            "testsuite": [{"name": "RingAndStragglarAcrossGpus", "result": "SKIPPED"}],
        },
    ],
}


def test_gtest_figures_count_results_and_sum_properties() -> None:
    f = g.gtest_figures(GTEST_REPORT)
    assert (f["tests"], f["passed"], f["failed"], f["skipped"]) == (4, 2, 1, 1)
    assert f["failed_tests"] == ["GpuReduce.MatchesCpuForEveryDtypeAndOp"]
    assert f["skipped_tests"] == ["NcclAllreduce.RingAndStragglarAcrossGpus"]
    assert (f["elements_compared"], f["bitwise_mismatches"]) == (1500, 7)
    assert "rank_results_compared" not in f


def test_bench_figures_from_the_json_line() -> None:
    line = json.dumps(
        {
            "device": "NVIDIA H200",
            "bytes": 256 << 20,
            "iters": 20,
            "copy_us": 130.0,
            "copy_membw_gbps": 4100.0,
            "rows": [
                {
                    "dtype": "float32",
                    "op": "sum",
                    "us": 200.0,
                    "algbw_gbps": 1300.0,
                    "membw_gbps": 3900.0,
                    "pct_of_copy": 95.1,
                },
                {
                    "dtype": "int8",
                    "op": "min",
                    "us": 260.0,
                    "algbw_gbps": 1000.0,
                    "membw_gbps": 3000.0,
                    "pct_of_copy": 73.2,
                },
            ],
        }
    )
    f = g.bench_figures("bench_reduce: int8 min at 73.2% ...\n" + line + "\n")
    assert f["device"] == "NVIDIA H200" and f["mib_per_operand"] == 256
    assert f["copy_membw_gbps"] == 4100.0
    assert (f["reduce_membw_gbps_min"], f["reduce_membw_gbps_max"]) == (3000.0, 3900.0)
    assert f["pct_of_copy_min"] == 73.2
    assert f["rows_below_min_pct"] == ["int8 min 73.2%"]
    assert f["rows"]["float32 sum"] == [3900.0, 95.1]
    assert g.bench_figures("bench_reduce: no CUDA device\n") == {}


def test_junit_figures(tmp_path: Path) -> None:
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest" tests="3">'
        '<testcase classname="tests.gpu.test_gpu" name="test_a[2]"/>'
        '<testcase classname="tests.gpu.test_gpu" name="test_a[4]"><failure message="x"/></testcase>'
        '<testcase classname="tests.gpu.test_gpu" name="test_b"><skipped message="y"/></testcase>'
        "</testsuite></testsuites>"
    )
    f = g.junit_figures(xml)
    assert (f["tests"], f["passed"], f["failed"], f["skipped"]) == (3, 1, 1, 1)
    assert f["failed_tests"] == ["tests.gpu.test_gpu::test_a[4]"]
    assert g.junit_figures(tmp_path / "missing.xml") == {}


def test_sanitizer_figures() -> None:
    memcheck = "========= COMPUTE-SANITIZER\n...\n========= ERROR SUMMARY: 0 errors\n" * 3
    assert g.sanitizer_figures(memcheck) == {"processes": 3, "errors": 0}
    racecheck = (
        "========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)\n"
        "========= ERROR SUMMARY: 1 error\n"
    )
    f = g.sanitizer_figures(racecheck)
    assert (f["errors"], f["hazards"], f["race_errors"], f["race_warnings"]) == (1, 2, 1, 1)
    assert g.sanitizer_figures("========= Error: Device not supported\n")["device_not_supported"]


def test_listing_and_collection() -> None:
    listing = (
        "Running main() from gtest_main.cc\nGpuReduce.\n  A\n  B\n"
        "Algorithms/CudaIpcAllreduce.\n  ExactAndBitwiseIdenticalOnOneGpu/ring_2  # GetParam() = x\n"
    )
    assert g.count_listed_tests(listing) == 3
    collected = (
        "SKIPPED [1] tests/gpu/test_gpu.py:41: torch.cuda is not available\n"
        "no tests collected in 0.03s\n"
    )
    f = g.pytest_collect_figures(collected)
    assert f == {
        "collected": 0,
        "modules_skipped": 1,
        "skip_reasons": ["torch.cuda is not available"],
    }
    assert (
        g.pytest_collect_figures("tests/gpu/test_gpu.py::test_a[2]\n\n5 tests collected in 0.1s")[
            "collected"
        ]
        == 5
    )


def test_check_limits_fit_the_budget() -> None:
    assert sum(c.limit_s for c in g.CHECKS) <= g.CHECKS_BUDGET_S
    assert g.BUILD_LIMIT_S <= 240
    # summary.json and one log per step: the device tool returns at most 8 files
    assert len({c.log for c in g.CHECKS} | {"build.log", "summary.json"}) <= 8


def test_run_kills_the_whole_process_group_at_its_limit(tmp_path: Path) -> None:
    """A check's forked ranks die with it when its time limit is reached."""
    pid_file = tmp_path / "child.pid"
    logp = tmp_path / "step.log"
    ran = g.run(["bash", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], logp, 1)
    assert ran.timed_out and ran.rc == 124
    child = int(pid_file.read_text())
    # reaped by init once killed; /proc/<pid> may linger only as a zombie
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"
    assert "TIMED OUT after 1 s" in logp.read_text()
