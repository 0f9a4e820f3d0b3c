"""torch's flight recorder sees stragg's collectives (python/stragg/_flight_recorder.py,
csrc/backend/flight_recorder.h).

- With TORCH_FR_BUFFER_SIZE set, ``torch._C._distributed_c10d._dump_fr_trace()`` holds stragg's
  all_reduce, barrier and delegated collectives with torch's schema (sizes, dtypes, sequence
  numbers, state) plus a "stragg" dict; unset, nothing is recorded.
- With TORCH_FR_DUMP_TEMP_FILE too, every surviving rank writes its dump when a collective fails
  (a rank SIGSTOPped, a rank killed -9), and torch's own analyzer
  (``python -m torch.distributed.flight_recorder.fr_trace``) reads them and names the rank.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from typing import Any

import _harness as h
import pytest
import torch
import torch.distributed as dist

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]

BAD = 3  # the rank that is stopped / killed


def _dump() -> dict[str, Any]:
    return pickle.loads(torch._C._distributed_c10d._dump_fr_trace())


def _stragg_entries(dump: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in dump["entries"] if "stragg" in e]


# ----------------------------------------------------------------------------------------------
# A healthy group


def healthy_worker(rank: int, ws: int) -> dict[str, Any]:
    dist.all_reduce(torch.ones(8))
    dist.all_reduce(torch.ones(3, 5, dtype=torch.float64))
    t = torch.arange(4, dtype=torch.int32)
    dist.broadcast(t, 0)  # delegated to Gloo
    dist.barrier()
    dist.all_reduce(torch.ones(1000, dtype=torch.bfloat16))
    import stragg._C as C

    dump = _dump()
    return {"dump": dump, "size": C._fr_size(), "enabled": C._fr_enabled()}


def test_dump_includes_stragg_collectives() -> None:
    run = h.run_ranks(2, healthy_worker, env={"TORCH_FR_BUFFER_SIZE": "2000"}, timeout_s=150)
    for rank, v in enumerate(run.values()):
        assert v["enabled"] and v["size"] == 5, v
        dump = v["dump"]
        assert dump["version"] == "2.10", dump["version"]
        assert dump["pg_config"]["0"]["ranks"] == "[0, 1]", dump["pg_config"]
        entries = _stragg_entries(dump)
        got = [
            (e["profiling_name"], e["input_sizes"], e["input_dtypes"], e["output_sizes"],
             e["collective_seq_id"], e["state"], e["process_group"][0])
            for e in entries
        ]
        assert got == [
            ("gloo:all_reduce", [[8]], ["Float"], [[8]], 1, "completed", "0"),
            ("gloo:all_reduce", [[3, 5]], ["Double"], [[3, 5]], 2, "completed", "0"),
            ("gloo:broadcast", [[4]], ["Int"], [[4]], 3, "completed", "0"),
            ("gloo:barrier", [], [], [], 4, "completed", "0"),
            ("gloo:all_reduce", [[1000]], ["BFloat16"], [[1000]], 5, "completed", "0"),
        ], f"rank {rank}: {got}"
        # What only stragg knows: the session's call number and the plan of its all_reduces.
        first = entries[0]["stragg"]
        assert first["call"] == 0 and first.get("plan"), entries[0]
        assert all(e["record_id"] == i for i, e in enumerate(entries)), entries
        assert all(e["timeout_ms"] > 0 and e["duration_ms"] >= 0 for e in entries), entries
        # stragg's inner Gloo backend's own entries are left out (recorded under stragg's group).
        assert all(e["process_group"][0] != "" for e in dump["entries"]), dump["entries"]


def analyzed_worker(rank: int, ws: int, trace_dir: str) -> None:
    x = torch.ones(16)
    dist.all_reduce(x)
    dist.broadcast(x, 0)
    dist.all_gather([torch.empty(16) for _ in range(ws)], x)
    dist.all_gather_into_tensor(torch.empty(16 * ws), x)
    dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4 * ws))
    dist.reduce_scatter(torch.empty(4), [torch.ones(4) for _ in range(ws)])
    dist.reduce(x, 0)
    dist.barrier()
    dist.all_reduce_coalesced([torch.ones(3), torch.ones(5)])
    dist.all_reduce(torch.ones(7, dtype=torch.float64))
    from stragg import _flight_recorder

    with open(os.path.join(trace_dir, f"fr_{rank}"), "wb") as fh:
        fh.write(_flight_recorder.dump())


def test_the_analyzer_matches_every_collective_of_a_healthy_run() -> None:
    with tempfile.TemporaryDirectory(prefix="stragg-fr-") as trace_dir:
        h.run_ranks(4, analyzed_worker, trace_dir, env={"TORCH_FR_BUFFER_SIZE": "2000"},
                    timeout_s=150)
        # Nothing reported; with -v, the 10 collectives listed, each matched on the 4 ranks.
        quiet = _analyze(trace_dir)
        assert "has errors" not in quiet and "Not all ranks joining" not in quiet, quiet
        assert "Traceback" not in quiet, quiet
        out = _analyze(trace_dir, "-v")
        assert out.count("Collective(id=") == 10, out
        assert out.count("pass_check=True") == 10, out


def ring_worker(rank: int, ws: int) -> list[tuple[int, int, list[list[int]]]]:
    for n in range(1, 6):
        dist.all_reduce(torch.ones(n))
    return [(e["record_id"], e["collective_seq_id"], e["input_sizes"])
            for e in _stragg_entries(_dump())]


def test_the_buffer_keeps_the_last_entries() -> None:
    run = h.run_ranks(2, ring_worker, env={"TORCH_FR_BUFFER_SIZE": "3"}, timeout_s=150)
    for v in run.values():
        assert v == [(2, 3, [[3]]), (3, 4, [[4]]), (4, 5, [[5]])], v


def off_worker(rank: int, ws: int) -> dict[str, Any]:
    dist.all_reduce(torch.ones(8))
    dist.barrier()
    import stragg._C as C

    entries = pickle.loads(torch._C._distributed_c10d._dump_fr_trace()).get("entries", [])
    return {"enabled": C._fr_enabled(), "size": C._fr_size(),
            "stragg_entries": [e for e in entries if "stragg" in e]}


def test_nothing_recorded_without_buffer_size() -> None:
    run = h.run_ranks(2, off_worker, env={"TORCH_FR_BUFFER_SIZE": None}, timeout_s=150)
    for v in run.values():
        assert v == {"enabled": False, "size": 0, "stragg_entries": []}, v


# ----------------------------------------------------------------------------------------------
# A rank stopped or killed: the survivors dump, torch's analyzer names the rank


def _pid_file(rank: int) -> str:
    return os.path.join(h.run_dir(), f"pid.{rank}")


def failing_worker(rank: int, ws: int, fault: str) -> dict[str, Any]:
    for _ in range(3):
        dist.all_reduce(torch.ones(16))
    if rank == BAD:
        with open(_pid_file(rank), "w", encoding="utf-8") as fh:
            fh.write(str(os.getpid()))
        if fault.startswith("kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGSTOP)  # continued by rank 0 once the others failed
        return {}
    if fault == "kill-broadcast":  # a delegated collective (Gloo) fails
        out = h.capture(lambda: dist.broadcast(torch.ones(16), BAD))  # from the dead rank
    else:
        out = h.capture(lambda: dist.all_reduce(torch.ones(16)))
    h.post("raised", rank)
    if fault == "stop" and rank == 0:
        h.wait_posted("raised", [r for r in range(ws) if r != BAD], timeout_s=60)
        with open(_pid_file(BAD), encoding="utf-8") as fh:
            os.kill(int(fh.read()), signal.SIGCONT)
    return {"out": out}


def _analyze(trace_dir: str, *extra: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", trace_dir,
         "--prefix", "fr_", *extra],
        capture_output=True, text=True, timeout=120,
    )
    return proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["stop", "kill", "kill-broadcast"])
def test_survivors_dump_and_the_analyzer_names_the_rank(fault: str) -> None:
    with tempfile.TemporaryDirectory(prefix="stragg-fr-") as trace_dir:
        env = {"TORCH_FR_BUFFER_SIZE": "2000",
               "TORCH_FR_DUMP_TEMP_FILE": os.path.join(trace_dir, "fr_")}
        run = h.run_ranks(4, failing_worker, fault, env=env, pg_timeout_s=5.0, timeout_s=150,
                          check_leaks=False)
        survivors = [r for r in range(4) if r != BAD]
        for rank in survivors:
            out: h.Outcome = run[rank].value["out"]
            assert not out.ok, f"rank {rank}: {out}"
            if fault != "kill-broadcast":  # Gloo's own error may name only an address
                assert f"rank {BAD} " in out.msg, f"rank {rank}: {out}"
        assert sorted(os.listdir(trace_dir)) == [f"fr_{r}" for r in survivors], (
            os.listdir(trace_dir))
        for rank in survivors:
            with open(os.path.join(trace_dir, f"fr_{rank}"), "rb") as fh:
                dump = pickle.load(fh)
            entries = _stragg_entries(dump)
            assert [e["state"] for e in entries] == ["completed"] * 3 + ["started"], entries
            last = entries[-1]
            assert last["collective_seq_id"] == 4, last
            if fault == "kill-broadcast":
                assert last["profiling_name"] == "gloo:broadcast", last
            else:
                assert f"rank {BAD} " in last["stragg"]["error"], last
        # torch's analyzer: without the missing rank's dump it names it and stops; with
        # --allow-incomplete-ranks it goes through the collectives and names it again.
        strict = _analyze(trace_dir)
        assert f"Missing dump files from ranks {{{BAD}}}" in strict, strict
        partial = _analyze(trace_dir, "--allow-incomplete-ranks")
        assert f"missed FR dumps from ranks ({{{BAD}}})" in partial, partial
