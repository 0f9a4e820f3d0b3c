"""stragg quickstart: a drop-in all_reduce backend beside Gloo.

    torchrun --nproc-per-node 4 examples/quickstart.py [--max-size 16MiB]

Every rank initialises the usual Gloo default group, then creates a second group on the same
ranks with the "stragg" backend (registered by `import stragg`). Both groups all_reduce the same
tensors; the results must be identical, and rank 0 prints a side-by-side timing table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

try:
    import stragg  # importing registers the "stragg" backend with torch.distributed

    HAVE_STRAGG = True
except ImportError as e:
    HAVE_STRAGG = False
    STRAGG_ERROR = str(e)

SIZES = [64 << 10, 1 << 20, 16 << 20, 64 << 20]  # bytes of float32
WARMUP, ITERS = 2, 9


def fmt_size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def time_all_reduce(data: torch.Tensor, groups: dict[str, dist.ProcessGroup]) -> dict[str, float]:
    """Median seconds of one all_reduce per group; each sample is the slowest rank's time.

    The groups take turns iteration by iteration, so machine noise hits them alike.
    """
    bufs = {name: data.clone() for name in groups}
    samples: dict[str, list[float]] = {name: [] for name in groups}
    for i in range(WARMUP + ITERS):
        for name, group in groups.items():
            bufs[name].copy_(data)
            dist.barrier(group=group)
            start = time.perf_counter()
            dist.all_reduce(bufs[name], group=group)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            # The slowest rank's time, gathered through the default (Gloo) group.
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if i >= WARMUP:
                samples[name].append(elapsed.item())
    return {name: statistics.median(s) for name, s in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description="stragg next to Gloo, same tensors")
    parser.add_argument("--max-size", default="64MiB", choices=["64KiB", "1MiB", "16MiB", "64MiB"],
                        help="largest message (slow networks: a smaller one)")
    args = parser.parse_args()
    limit = {"64KiB": 64 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20, "64MiB": 64 << 20}[args.max_size]
    torch.set_num_threads(1)  # the ranks share this machine's cores
    # torchrun provides rank, world size and rendezvous address in the environment.
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    fast = dist.new_group(backend="stragg") if HAVE_STRAGG else None
    if rank == 0 and not HAVE_STRAGG:
        print(f"stragg is not available ({STRAGG_ERROR}); showing gloo only")

    rows = []
    for nbytes in (n for n in SIZES if n <= limit):
        numel = nbytes // 4
        # Integer-valued float32 data: every summation order gives the exact same result, so the
        # two backends must agree bit for bit even though they add in different orders.
        gen = torch.Generator().manual_seed(1234 + rank)
        data = torch.randint(-1000, 1000, (numel,), generator=gen).float()

        via_gloo = data.clone()
        dist.all_reduce(via_gloo, group=gloo)
        if fast is not None:
            via_stragg = data.clone()
            dist.all_reduce(via_stragg, group=fast)
            if not torch.equal(via_stragg, via_gloo):
                bad = int((via_stragg != via_gloo).sum())
                raise RuntimeError(
                    f"rank {rank}: stragg and gloo disagree on {bad} of {numel} "
                    f"elements at {fmt_size(nbytes)}"
                )

        groups = {"gloo": gloo} if fast is None else {"stragg": fast, "gloo": gloo}
        times = time_all_reduce(data, groups)
        t_gloo, t_stragg = times["gloo"], times.get("stragg", float("nan"))
        rows.append((nbytes, t_stragg, t_gloo))

    if rank == 0:
        print(
            f"all_reduce, float32 sum, {world} ranks; median of {ITERS} iterations "
            f"(slowest rank); results identical: {'yes' if fast is not None else 'n/a'}"
        )
        print(f"{'size':>8} {'stragg (ms)':>12} {'gloo (ms)':>10} {'speedup':>8}")
        for nbytes, t_s, t_g in rows:
            if fast is None:
                print(f"{fmt_size(nbytes):>8} {'-':>12} {t_g * 1e3:10.3f} {'-':>8}")
            else:
                print(
                    f"{fmt_size(nbytes):>8} {t_s * 1e3:12.3f} {t_g * 1e3:10.3f} {t_g / t_s:7.2f}x"
                )
        if fast is not None and hasattr(stragg, "backend_stats"):
            print("stragg backend_stats:", stragg.backend_stats(fast))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
