"""stragg.ddp: a DDP communication hook that all_reduces gradient buckets on a stragg group.

The DDP models run on a plain "gloo" default group; the hook's state holds a stragg group over
the same ranks. Training with the hook must end where plain gloo DDP ends (same seeds, same
data), with bitwise identical parameters on every rank, and the bucket all_reduces must have run
on stragg's executor. Also: ``stragg.ddp.register`` on a default group that is stragg itself,
and the errors for a non-DDP module and a non-stragg group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import _harness as h
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

pytestmark = [pytest.mark.needs_backend, pytest.mark.stragg_only]

STEPS = 4
LR = 0.1


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3), nn.Tanh(), nn.Linear(3, 2))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)


def _train(rank: int, group: Any = None, hook: Any = None) -> dict[str, Any]:
    """STEPS of SGD on DDP(model, group); ``hook(ddp)`` registers a comm hook first."""
    model = _model()
    # A tiny bucket cap gives several buckets per step (after DDP rebuilds them at step 1).
    ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.0001)
    state = hook(ddp) if hook is not None else None
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = _batch(rank, step)
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    params = [p.detach().clone() for p in model.parameters()]
    return {"params": params, "digests": [h.digest(p) for p in params], "state": state}


def _prefixed(prefix: str) -> Callable[[str], str]:
    return lambda message: f"{prefix}: {message}"


def _stats(group: Any) -> dict[str, Any]:
    return h.backend_stats(group)


# ----------------------------------------------------------------------------------------------
# Default group gloo, hook on a stragg group
# ----------------------------------------------------------------------------------------------


def hook_worker(rank: int, ws: int) -> dict[str, Any]:
    import stragg.ddp

    assert dist.get_backend() == "gloo"
    out: dict[str, Any] = {"initial": [p.detach().clone() for p in _model().parameters()]}
    out["plain"] = _train(rank)

    state = stragg.ddp.StraggHookState()  # collective: creates the stragg group
    out["state_repr"] = repr(state)
    out["state_ranks"] = dist.get_process_group_ranks(state.process_group)
    before = _stats(state.process_group)

    def hook(ddp: DistributedDataParallel) -> Any:
        ddp.register_comm_hook(state, stragg.ddp.allreduce_hook)
        return None

    out["hooked"] = _train(rank, hook=hook)
    out["stats"] = (before, _stats(state.process_group))

    # The same through the helper, with the stragg group passed in explicitly.
    before = _stats(state.process_group)
    helped = _train(rank, hook=lambda ddp: stragg.ddp.register(ddp, state.process_group))
    out["helper_same_group"] = helped.pop("state").process_group is state.process_group
    out["helper"] = helped
    out["helper_stats"] = (before, _stats(state.process_group))

    # A gloo group is refused.
    gloo_group = dist.new_group(backend="gloo")
    out["gloo_group_error"] = h.capture(lambda: stragg.ddp.StraggHookState(gloo_group))
    dist.barrier()
    return out


def _run(ws: int, env: dict[str, str] | None = None) -> h.RunResult:
    return h.run_ranks(ws, hook_worker, backend="gloo", env=env, timeout_s=240)


@pytest.fixture(scope="module", params=[2, 4], ids=lambda ws: f"ws{ws}")
def run(request: pytest.FixtureRequest) -> h.RunResult:
    return _run(request.param)


def test_hook_matches_plain_gloo_ddp(run: h.RunResult) -> None:
    values = run.values()
    ws = len(values)
    for rank, v in enumerate(values):
        assert v["state_ranks"] == list(range(ws)), v["state_ranks"]
        plain = v["plain"]["params"]
        changed = any(not torch.equal(p, q) for p, q in zip(plain, v["initial"]))
        assert changed, f"rank {rank}: training did not change the parameters"
        for variant in ("hooked", "helper"):
            for i, (p, q) in enumerate(zip(v[variant]["params"], plain)):
                torch.testing.assert_close(
                    p,
                    q,
                    rtol=1e-5,
                    atol=1e-6,
                    msg=_prefixed(f"rank {rank} param {i} ({variant} vs plain gloo DDP)"),
                )
            if ws == 2:
                # Two summands: any reduction order gives the same float sum, and the hook
                # scales like DDP's reducer, so the match is exact.
                assert v[variant]["digests"] == v["plain"]["digests"], (
                    f"rank {rank}: {variant} differs bitwise from plain DDP at world size 2"
                )


def test_hook_ranks_bitwise_identical(run: h.RunResult) -> None:
    values = run.values()
    for variant in ("plain", "hooked", "helper"):
        digests = [v[variant]["digests"] for v in values]
        assert all(d == digests[0] for d in digests), f"{variant}: parameters differ across ranks"


def test_hook_ran_on_stragg(run: h.RunResult) -> None:
    for rank, v in enumerate(run.values()):
        for key in ("stats", "helper_stats"):
            before, after = v[key]
            calls = after["allreduce_calls"] - before["allreduce_calls"]
            assert calls >= STEPS, f"rank {rank} ({key}): {before} -> {after}"
            assert after["failed_calls"] == before["failed_calls"], f"rank {rank}: {after}"
        assert v["helper_same_group"], f"rank {rank}: register() did not use the given group"
        assert v["state_repr"].startswith("StraggHookState("), v["state_repr"]


def test_non_stragg_group_refused(run: h.RunResult) -> None:
    for rank, v in enumerate(run.values()):
        err = v["gloo_group_error"]
        assert not err.ok and err.is_instance("ValueError"), f"rank {rank}: {err}"
        assert "stragg" in err.msg and "gloo" in err.msg, err.msg


def test_hook_bitwise_equal_to_plain_ddp_when_reduction_is_gloo() -> None:
    """With STRAGG_TRANSPORT=gloo, stragg sums in gloo's order: then the hook's scaling must
    reproduce DDP's exactly, also for a world size that is not a power of two (3)."""
    values = _run(3, env={"STRAGG_TRANSPORT": "gloo"}).values()
    for rank, v in enumerate(values):
        assert v["stats"][1]["transport"] == "gloo", v["stats"][1]
        for variant in ("hooked", "helper"):
            assert v[variant]["digests"] == v["plain"]["digests"], (
                f"rank {rank}: {variant} differs bitwise from plain DDP"
            )


# ----------------------------------------------------------------------------------------------
# register() with the default group stragg itself
# ----------------------------------------------------------------------------------------------


def register_default_worker(rank: int, ws: int) -> dict[str, Any]:
    import stragg.ddp

    assert dist.get_backend() == "stragg"
    gloo_group = dist.new_group(backend="gloo")
    plain = _train(rank, gloo_group)
    before = _stats(None)
    hooked = _train(rank, hook=stragg.ddp.register)
    after = _stats(None)
    state = hooked.pop("state")
    return {
        "plain": plain,
        "hooked": hooked,
        "stats": (before, after),
        "uses_default": state.process_group is dist.distributed_c10d._get_default_group(),
        "world_size": state.world_size,
    }


def test_register_on_stragg_default_group() -> None:
    values = h.run_ranks(2, register_default_worker, backend="stragg", timeout_s=180).values()
    for rank, v in enumerate(values):
        assert v["uses_default"], f"rank {rank}: register() did not reuse the stragg default group"
        assert v["world_size"] == 2
        before, after = v["stats"]
        assert after["allreduce_calls"] - before["allreduce_calls"] >= STEPS, (before, after)
        assert v["hooked"]["digests"] == v["plain"]["digests"], (
            f"rank {rank}: hooked DDP on the stragg default group differs from gloo DDP"
        )
    assert values[0]["hooked"]["digests"] == values[1]["hooked"]["digests"]


# ----------------------------------------------------------------------------------------------
# Errors without a process group
# ----------------------------------------------------------------------------------------------


def test_register_rejects_non_ddp_module() -> None:
    import stragg.ddp

    with pytest.raises(TypeError, match="DistributedDataParallel"):
        stragg.ddp.register(nn.Linear(2, 2))  # type: ignore[arg-type]


def test_hook_annotations_accepted_by_ddp() -> None:
    """DDP rejects a hook whose annotations are strings (``from __future__ import annotations``)."""
    import inspect

    import stragg.ddp

    sig = inspect.signature(stragg.ddp.allreduce_hook)
    assert sig.parameters["bucket"].annotation is dist.GradBucket
    assert sig.return_annotation == torch.futures.Future[torch.Tensor]


def test_state_needs_initialized_distributed() -> None:
    import stragg.ddp

    assert not dist.is_initialized(), "the test process never initializes torch.distributed"
    with pytest.raises(RuntimeError, match="not initialized"):
        stragg.ddp.StraggHookState()
