"""Fine-tune a small language model with DDP on Gloo, then on stragg, while one rank straggles.

    python examples/finetune.py                      # 4 ranks, rank 3 is late every step
    python examples/finetune.py --steps 40 --json    # last stdout line: one JSON object
    python examples/finetune.py --no-straggler       # the same job without an injected straggler

The script is its own launcher: it runs the same training job twice under
`python -m torch.distributed.run --standalone --nproc-per-node R` (torchrun), once with
`dist.init_process_group("gloo")` and once with `dist.init_process_group("stragg")`. Both are
plain `DistributedDataParallel`; nothing in the training code knows about stragg. One rank (the
injected persistent straggler) spends D (computing; --straggler-mode sleep: sleeping) before
every backward pass, so it is late for every gradient all_reduce. stragg's profiler notices which rank keeps arriving last and switches the
all_reduce to StragglAR for it: the other ranks reduce-scatter among themselves while they wait.

The model is a small GPT-2 (transformers' GPT2LMHeadModel built from a config with random
weights; a small torch transformer defined below when transformers is not installed), trained on
a synthetic token language (a fixed random Markov chain), so nothing is downloaded and the loss
falls. Seeds, data shards and initial weights are identical in both runs, so the loss curves
agree up to the summation order of the gradient all_reduce (relative difference well below 1e-4).

The launcher prints the per-step times of both runs, the straggler stragg detected and when, the
speedup (mean Gloo step time / mean stragg step time, first --warmup steps excluded), the final
losses, and saves a figure (--plot). Run it under torchrun yourself to get one worker job:
`torchrun --nproc-per-node 4 examples/finetune.py --backends stragg`.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_STEPS = 150
DEFAULT_WARMUP = 5
# D = one Gloo all_reduce of the gradient, about twice its reduce-scatter half: with 4 CPU-bound
# ranks sharing 2 cores the arrival jitter is +-20 ms, and at half that delay the straggler was
# last in only ~40-50% of the steps (not a persistent straggler); at one all_reduce ~85%.
AUTO_DELAY_FACTOR = 1.0
# --quick: a smoke run (CI, a first try): 2 ranks, a tiny model, a few steps, no figure. Options
# given explicitly on the command line still win.
QUICK = {
    "steps": 6,
    "warmup": 1,
    "ranks": 2,
    "layers": 1,
    "d_model": 64,
    "heads": 2,
    "vocab": 128,
    "seq": 16,
    "straggler_delay_ms": "3",
    "plot": "none",
}


# --------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(
            "DDP fine-tuning of a small GPT-2 on 'gloo' and on 'stragg' with an injected "
            "persistent straggler; compares step times and loss curves."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "straggler delay 'auto': before training, the first job times a Gloo all_reduce of "
            "a buffer as large as the model's gradients (median of a few, slowest rank) and uses "
            f"{AUTO_DELAY_FACTOR:g}x that time as D; later jobs reuse the same D. Half of it (the "
            "reduce-scatter half of a ring all_reduce) is what the fast ranks can fill with "
            "StragglAR's reduce-scatter; the default doubles it so the straggler stays last through "
            "the scheduling jitter of a host with fewer cores than ranks. "
            "--straggler-delay-ms sets D directly.\n\n"
            "Environment: STRAGG_* settings (e.g. STRAGG_PROFILE_EVERY) pass through to the "
            "stragg job; --stragg-env KEY=VALUE sets them for the stragg job only."
        ),
    )
    p.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"training steps per job (default {DEFAULT_STEPS})",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=DEFAULT_WARMUP,
        help=f"first steps left out of the mean step time (default {DEFAULT_WARMUP})",
    )
    p.add_argument("--ranks", type=int, default=4, help="processes (default 4)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: "
        + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
        + " (explicit options still apply)",
    )
    p.add_argument(
        "--straggler-rank",
        type=int,
        default=None,
        help="the rank that sleeps before every backward (default: the last rank)",
    )
    p.add_argument("--no-straggler", action="store_true", help="inject no straggler")
    p.add_argument(
        "--straggler-mode",
        choices=("busy", "sleep"),
        default="busy",
        help="how the straggler spends D: 'busy' (default) computes (spins) for D, like a slower "
        "GPU or extra work; 'sleep' sleeps, which on a host with fewer cores than ranks hands its "
        "core to the others and so makes it much less late than D",
    )
    p.add_argument(
        "--straggler-delay-ms",
        default="auto",
        help="delay D per step in ms, or 'auto' (default; see below)",
    )
    p.add_argument(
        "--backends",
        default="gloo,stragg",
        help="comma-separated backends to run in order (default gloo,stragg); "
        "'stragg-ring' adds a stragg job fixed to the plain Ring (no straggler "
        "handling), to separate the transport's gain from StragglAR's",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object as the last line of stdout (progress on stderr)",
    )
    p.add_argument(
        "--plot",
        default="finetune.png",
        help="PNG to write (default finetune.png); 'none' for no figure",
    )
    p.add_argument(
        "--stragg-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the stragg job (repeatable), e.g. "
        "STRAGG_STRAGGLER=3 to name the straggler instead of detecting it",
    )
    g = p.add_argument_group("model and data")
    g.add_argument("--layers", type=int, default=2)
    g.add_argument("--d-model", type=int, default=384)
    g.add_argument("--heads", type=int, default=6)
    g.add_argument("--vocab", type=int, default=512)
    g.add_argument("--seq", type=int, default=32, help="tokens per sequence")
    g.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    g.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument(
        "--model",
        choices=("auto", "gpt2", "torch"),
        default="auto",
        help="auto: transformers' GPT-2 when importable, else the built-in model",
    )
    # Internal: set by the launcher for its torchrun workers.
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    p.add_argument("--delay-s", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:  # the quick values become the defaults; explicit options are parsed again
        p.set_defaults(**QUICK)
        args = p.parse_args(argv)
    if args.ranks < 2:
        p.error("--ranks must be at least 2")
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.seq < 2:
        p.error("--seq must be at least 2 (the model predicts each sequence's next tokens)")
    args.warmup = max(0, min(args.warmup, args.steps - 1))
    if args.no_straggler:
        args.straggler_rank = None
    elif args.straggler_rank is None:
        args.straggler_rank = args.ranks - 1
    elif not 0 <= args.straggler_rank < args.ranks:
        p.error(f"--straggler-rank must be in [0, {args.ranks})")
    if str(args.straggler_delay_ms).strip().lower() != "auto":
        try:
            if float(args.straggler_delay_ms) < 0:
                raise ValueError
        except ValueError:
            p.error("--straggler-delay-ms must be a non-negative number or 'auto'")
    args.backend_list = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not args.backend_list:
        p.error("--backends is empty")
    return args


# --------------------------------------------------------------------------------------------
# Model and data (worker side)


def build_model(args: argparse.Namespace) -> tuple[Any, str]:
    import torch

    torch.manual_seed(args.seed)
    if args.model in ("auto", "gpt2"):
        try:
            import transformers
            from transformers import GPT2Config, GPT2LMHeadModel
        except ImportError:
            if args.model == "gpt2":
                raise
        else:
            transformers.logging.set_verbosity_error()
            cfg = GPT2Config(
                vocab_size=args.vocab,
                n_positions=args.seq,
                n_embd=args.d_model,
                n_layer=args.layers,
                n_head=args.heads,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                bos_token_id=0,
                eos_token_id=0,
                loss_type="ForCausalLM",
                # Untied input/output embeddings: the bigram structure of the synthetic language
                # is learnt quickly and smoothly, so the loss curves of the two runs stay close.
                tie_word_embeddings=False,
            )
            return GPT2LMHeadModel(cfg), "transformers GPT2LMHeadModel"
    return TinyCausalLM(args), "built-in causal transformer"


def _tiny_model_class() -> Any:
    import torch
    from torch import nn

    class _TinyCausalLM(nn.Module):
        """A GPT-style decoder (pre-norm blocks, causal self-attention, untied output head)."""

        def __init__(self, args: argparse.Namespace) -> None:
            super().__init__()
            d = args.d_model
            self.tok = nn.Embedding(args.vocab, d)
            self.pos = nn.Embedding(args.seq, d)
            layer = nn.TransformerEncoderLayer(
                d,
                args.heads,
                4 * d,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            self.blocks = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, args.vocab, bias=False)

        def forward(self, input_ids: Any, labels: Any = None) -> Any:
            s = input_ids.shape[1]
            pos = torch.arange(s, device=input_ids.device)
            h = self.tok(input_ids) + self.pos(pos)
            mask = nn.Transformer.generate_square_subsequent_mask(s)
            h = self.blocks(h, mask=mask, is_causal=True)
            logits = self.head(self.norm(h))
            loss = None
            if labels is not None:
                loss = nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
                )
            return _Output(loss, logits)

    return _TinyCausalLM


class _Output:
    def __init__(self, loss: Any, logits: Any) -> None:
        self.loss, self.logits = loss, logits


def TinyCausalLM(args: argparse.Namespace) -> Any:
    return _tiny_model_class()(args)


def make_batches(args: argparse.Namespace, rank: int) -> Any:
    """This rank's token batches for all steps: [steps, batch, seq] int64.

    The language is a fixed random Markov chain: each token has 4 possible successors with
    probabilities 0.55 / 0.25 / 0.15 / 0.05 (entropy 1.1 nats per token, against ln(vocab) for
    a fresh model). The chain depends only on --seed; each (rank, step) shard has its own
    generator, so the data is the same whichever backend runs.
    """
    import torch

    g = torch.Generator().manual_seed(args.seed)
    successors = torch.randint(0, args.vocab, (args.vocab, 4), generator=g)
    probs = torch.tensor([0.55, 0.25, 0.15, 0.05])
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + 7919 * (rank + 1))
    n = args.steps * args.batch
    tokens = torch.empty(n, args.seq, dtype=torch.int64)
    tokens[:, 0] = torch.randint(0, args.vocab, (n,), generator=g)
    choice = torch.multinomial(probs.expand(n, 4), args.seq - 1, replacement=True, generator=g)
    for t in range(1, args.seq):
        tokens[:, t] = successors[tokens[:, t - 1], choice[:, t - 1]]
    return tokens.view(args.steps, args.batch, args.seq)


# --------------------------------------------------------------------------------------------
# Worker (one rank of a torchrun job)


def measure_allreduce_s(numel: int, backend: str) -> float:
    """Median Gloo all_reduce time (slowest rank) of `numel` float32, for the 'auto' delay."""
    import torch
    import torch.distributed as dist

    group = None if backend == "gloo" else dist.new_group(backend="gloo")
    buf = torch.ones(numel)
    samples = []
    for i in range(7):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_reduce(buf, group=group)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=group)
        if i >= 2:
            samples.append(float(dt))
    if group is not None:
        dist.destroy_process_group(group)
    return statistics.median(samples)


def _profiler_summary(stragg: Any) -> dict[str, Any] | None:
    prof = getattr(stragg, "profiler", None)
    if prof is None:
        try:
            import importlib

            prof = importlib.import_module("stragg.profiler")
        except ImportError:
            return None
    try:
        return dict(prof.summary())
    except Exception as e:  # noqa: BLE001 - a demo reports, it does not crash on debug info
        return {"error": f"{type(e).__name__}: {e}"}


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)  # the ranks share the machine's cores
    backend = args.backend_list[0]
    stragg = None
    if backend.startswith("stragg"):
        import stragg  # registers the backend (also autoloaded by torch)
    dist.init_process_group(backend="stragg" if backend.startswith("stragg") else backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    straggler = args.straggler_rank
    if straggler is not None and straggler >= world:
        raise SystemExit(f"--straggler-rank {straggler} is not a rank of {world}")

    model, model_desc = build_model(args)
    n_params = sum(p.numel() for p in model.parameters())
    grad_bytes = 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    # One gradient bucket: the whole gradient is one all_reduce per step, issued when the
    # backward pass ends (a non-default bucket_cap_mb also sets the first bucket's cap).
    bucket_mb = max(1.0, grad_bytes / 2**20 + 1.0)
    ddp = DDP(model, bucket_cap_mb=bucket_mb)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.0)
    batches = make_batches(args, rank)

    if straggler is None:
        delay_s = 0.0
    elif args.delay_s is not None:
        delay_s = args.delay_s
    elif str(args.straggler_delay_ms).strip().lower() == "auto":
        delay_s = AUTO_DELAY_FACTOR * measure_allreduce_s(grad_bytes // 4, backend)
    else:
        delay_s = float(args.straggler_delay_ms) / 1e3

    def stragg_calls() -> int:
        return int(stragg.backend_stats()["allreduce_calls"]) if stragg is not None else 0

    calls_before: list[int] = []  # stragg all_reduce count when each step started (rank 0)
    step_s: list[float] = []
    losses: list[float] = []
    dist.barrier()
    t_prev = time.perf_counter()
    for step in range(args.steps):
        calls_before.append(stragg_calls())
        x = batches[step]
        loss = ddp(input_ids=x, labels=x).loss
        if rank == straggler and delay_s > 0:
            # The persistent straggler: late for every gradient all_reduce.
            if args.straggler_mode == "sleep":
                time.sleep(delay_s)
            else:
                end = time.perf_counter() + delay_s
                while time.perf_counter() < end:
                    pass
        loss.backward()  # DDP all_reduces the gradient bucket at the end of the backward pass
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        t_now = time.perf_counter()
        step_s.append(t_now - t_prev)
        t_prev = t_now
        if rank == 0 and (step + 1) % 20 == 0:
            print(
                f"[{backend}] step {step + 1}/{args.steps}: loss {losses[-1]:.4f}, "
                f"{step_s[-1] * 1e3:.1f} ms",
                file=sys.stderr,
                flush=True,
            )
    calls_end = stragg_calls()

    # Mean loss over ranks per step (all_gather: Gloo on either backend, no stragg all_reduce).
    mine = torch.tensor(losses, dtype=torch.float64)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    mean_losses = torch.stack(gathered).mean(0).tolist()

    result: dict[str, Any] = {
        "backend": backend,
        "ranks": world,
        "model": model_desc,
        "params": n_params,
        "grad_bytes": grad_bytes,
        "steps": args.steps,
        "injected_straggler": straggler,
        "delay_s": delay_s,
        "step_s": step_s,
        "losses": mean_losses,
    }
    if stragg is not None:
        summary = _profiler_summary(stragg)  # on every rank, in case it is collective
        calls = stragg.recent_calls()
        stats = stragg.backend_stats()
        # Which step each recent call belongs to, and the algorithm/straggler it ran with.
        per_step: list[dict[str, Any]] = [
            {"algorithms": [], "stragglers": []} for _ in range(args.steps)
        ]
        first_seq = calls[0]["seq"] if calls else 0
        # recent_calls seq numbering: assume consecutive, ending at calls_end - 1 (0-based).
        offset = (calls_end - len(calls)) - first_seq if calls else 0
        for c in calls:
            idx = c["seq"] + offset  # 0-based call index on this group
            step = _step_of_call(idx, calls_before, calls_end)
            if step is not None:
                per_step[step]["algorithms"].append(str(c.get("algorithm")))
                per_step[step]["stragglers"].append(int(c.get("straggler", -1)))
        result.update(
            {
                "profile": summary,
                "backend_stats": {
                    k: v
                    for k, v in stats.items()
                    if isinstance(v, (int, float, str, bool)) or v is None
                },
                "calls_before_step": calls_before,
                "calls_end": calls_end,
                "per_step_calls": per_step,
            }
        )
    if rank == 0 and args.result:
        with open(args.result, "w") as f:
            json.dump(result, f)
    elif rank == 0:  # started by hand under torchrun: a short report here
        tail = step_s[args.warmup :]
        print(
            f"[{backend}] {args.steps} steps, mean step {statistics.fmean(tail) * 1e3:.1f} ms "
            f"(after {args.warmup} warm-up steps), final loss {mean_losses[-1]:.5f}"
        )
        if stragg is not None:
            import stragg.profiler

            print(stragg.profiler.report())
    # Free DDP (its reducer holds the process group) before the group goes: transformers'
    # models sit in reference cycles, and a DDP reducer left to interpreter shutdown can abort
    # the process ("terminate called without an active exception").
    ddp = model = opt = None
    gc.collect()
    dist.destroy_process_group()


def _step_of_call(idx: int, calls_before: list[int], calls_end: int) -> int | None:
    """The step during which the stragg all_reduce with 0-based index `idx` was issued."""
    if idx < (calls_before[0] if calls_before else 0) or idx >= calls_end:
        return None
    lo, hi = 0, len(calls_before) - 1
    while lo < hi:  # last step whose first call index <= idx
        mid = (lo + hi + 1) // 2
        if calls_before[mid] <= idx:
            lo = mid
        else:
            hi = mid - 1
    return lo


# --------------------------------------------------------------------------------------------
# Launcher


def run_job(
    args: argparse.Namespace, backend: str, delay_s: float | None, result_path: str
) -> dict[str, Any]:
    opts = {
        "--backends": backend,
        "--result": result_path,
        "--steps": args.steps,
        "--warmup": args.warmup,
        "--ranks": args.ranks,
        "--straggler-delay-ms": args.straggler_delay_ms,
        "--straggler-mode": args.straggler_mode,
        "--layers": args.layers,
        "--d-model": args.d_model,
        "--heads": args.heads,
        "--vocab": args.vocab,
        "--seq": args.seq,
        "--batch": args.batch,
        "--lr": repr(args.lr),
        "--seed": args.seed,
        "--model": args.model,
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc-per-node", str(args.ranks), str(Path(__file__).resolve())]
    for key, value in opts.items():
        cmd += [key, str(value)]
    if args.straggler_rank is None:
        cmd.append("--no-straggler")
    else:
        cmd += ["--straggler-rank", str(args.straggler_rank)]
    if delay_s is not None:
        cmd += ["--delay-s", repr(delay_s)]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if backend.startswith("stragg"):
        for item in args.stragg_env:
            key, sep, value = item.partition("=")
            if not sep:
                raise SystemExit(f"--stragg-env {item!r}: expected KEY=VALUE")
            env[key.strip()] = value
    if backend == "stragg-ring":  # baseline: stragg's transport, always the plain Ring
        env["STRAGG_ALGO"] = "ring"
        env.pop("STRAGG_STRAGGLER", None)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, env=env, stdout=sys.stderr if args.json else None)
    if proc.returncode != 0:
        raise SystemExit(f"finetune: the {backend} job failed (exit code {proc.returncode})")
    with open(result_path) as f:
        res = json.load(f)
    res["wall_s"] = time.perf_counter() - t0
    return res


def detection(res: dict[str, Any]) -> dict[str, Any]:
    """The straggler stragg detected, and the call/step at which it started acting on it."""
    out: dict[str, Any] = {
        "detected_straggler": None,
        "detected_at_call": None,
        "detected_at_step": None,
        "first_stragglar_step": None,
        "decisions": None,
    }
    prof = res.get("profile")
    calls_before = res.get("calls_before_step") or []
    if isinstance(prof, dict) and "error" not in prof:
        out["decisions"] = prof.get("decisions")
        out["detected_straggler"] = prof.get("straggler")
        for d in prof.get("decisions") or []:
            if d.get("straggler") is not None:
                out["detected_at_call"] = int(d["call"])
                if out["detected_straggler"] is None:
                    out["detected_straggler"] = d["straggler"]
                break
        if out["detected_at_call"] is not None and calls_before:
            step = _step_of_call(
                out["detected_at_call"], calls_before, int(res.get("calls_end", 0)) + 1
            )
            out["detected_at_step"] = None if step is None else step + 1
    # Independent of the profiler: the first step whose all_reduce ran with a straggler.
    for step, info in enumerate(res.get("per_step_calls") or []):
        known = [s for s in info.get("stragglers", []) if s is not None and s >= 0]
        if known:
            out["first_stragglar_step"] = step + 1
            if out["detected_straggler"] is None and not isinstance(prof, dict):
                out["detected_straggler"] = known[0]
            break
    return out


def _stragg_result(results: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The job on backend "stragg" (else the first stragg-* job)."""
    if "stragg" in results:
        return results["stragg"]
    return next((r for b, r in results.items() if b.startswith("stragg")), None)


def mean_step(res: dict[str, Any], warmup: int, start: int | None = None) -> float:
    times = res["step_s"][max(warmup, start or 0) :]
    return statistics.fmean(times) if times else float("nan")


def _rolling_mean(xs: list[float], width: int) -> list[float]:
    """Centred moving average (shorter windows at the ends)."""
    half = width // 2
    out = []
    for i in range(len(xs)):
        win = xs[max(0, i - half) : i + half + 1]
        out.append(sum(win) / len(win))
    return out


def decision_marks(stragg_res: dict[str, Any] | None, det: dict[str, Any]) -> list[dict[str, Any]]:
    """The profiler's decisions as the figure marks them, in order: {"step" (1-based), "kind"
    ("adopt" or "drop"), "rank", "label"}. The first adoption stands at the first step that ran
    StragglAR (else at its decision's step), the others at their decision's step; a drop's label
    says why, in the profiler's words ("for its gain", "for its share", both)."""
    decisions = det.get("decisions") or []
    res = stragg_res or {}
    calls_before = res.get("calls_before_step") or []
    calls_end = int(res.get("calls_end", 0)) + 1
    marks: list[dict[str, Any]] = []
    previous: int | None = None
    for d in decisions:
        step = _step_of_call(int(d["call"]), calls_before, calls_end) if calls_before else None
        at = None if step is None else step + 1
        rank = d.get("straggler")
        if rank is not None:
            if not any(m["kind"] == "adopt" for m in marks):
                first = det.get("first_stragglar_step")
                at = first if first is not None else at
            label = f"stragg: StragglAR for rank {rank}"
            marks.append({"step": at, "kind": "adopt", "rank": rank, "label": label})
        elif previous is not None:
            why = re.search(r"dropped (for its [a-z ]+?):", str(d.get("reason", "")))
            label = f"stragg: rank {previous} dropped" + (f" ({why.group(1)})" if why else "")
            marks.append({"step": at, "kind": "drop", "rank": previous, "label": label})
        previous = rank
    if not marks and det.get("first_stragglar_step") is not None:
        # StragglAR ran without a profiler decision (a configured straggler).
        marks.append(
            {
                "step": det["first_stragglar_step"],
                "kind": "adopt",
                "rank": det.get("detected_straggler"),
                "label": f"stragg: StragglAR for rank {det.get('detected_straggler')}",
            }
        )
    return [m for m in marks if m["step"] is not None]


def plot_results(
    path: str, args: argparse.Namespace, results: dict[str, dict[str, Any]], det: dict[str, Any]
) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            "finetune: matplotlib is not installed (pip install matplotlib): no figure",
            file=sys.stderr,
        )
        return None
    stragg_res = _stragg_result(results)
    prof = stragg_res.get("profile") if stragg_res else None
    have_prof = isinstance(prof, dict) and "error" not in prof
    rows = 2 if have_prof else 1
    fig, axes = plt.subplots(rows, 2, figsize=(11.0, 3.9 * rows), squeeze=False)
    ax_t, ax_l = axes[0]
    first = results[next(iter(results))]
    colors = {"gloo": "tab:blue", "stragg": "tab:orange", "stragg-ring": "tab:green"}
    for b, res in results.items():
        steps = list(range(1, len(res["step_s"]) + 1))
        c = colors.get(b, "tab:purple")
        ms = [t * 1e3 for t in res["step_s"]]
        ax_t.plot(steps, ms, color=c, lw=0.8, alpha=0.35)
        ax_t.plot(
            steps,
            _rolling_mean(ms, 9),
            color=c,
            lw=1.8,
            label=f"{b}: mean {mean_step(res, args.warmup) * 1e3:.0f} ms",
        )
        ax_l.plot(steps, res["losses"], color=c, lw=1.2, label=b)
    # Each decision of the profiler: an adoption as a red dashed line, a drop as a black dotted
    # one, each in the legend with its rank (and, for a drop, why).
    for mark in decision_marks(stragg_res, det):
        adopt = mark["kind"] == "adopt"
        ax_t.axvline(
            mark["step"],
            color="tab:red" if adopt else "black",
            ls="--" if adopt else ":",
            lw=1,
            label=mark["label"],
        )
    if args.warmup:
        ax_t.axvspan(0.5, args.warmup + 0.5, color="gray", alpha=0.12, lw=0)
    ax_t.set_xlabel("step")
    ax_t.set_ylabel("step time (ms, rank 0; line: 9-step mean)")
    inj = first.get("injected_straggler")
    delay = first.get("delay_s", 0.0)
    ax_t.set_title(
        f"step time, {args.ranks} ranks"
        + (f", rank {inj} late by {delay * 1e3:.1f} ms" if inj is not None else ", no straggler"),
        fontsize="medium",
    )
    ax_t.set_ylim(bottom=0)
    ax_t.legend(fontsize="small", loc="lower right")
    ax_t.grid(True, alpha=0.3)
    ax_l.set_xlabel("step")
    ax_l.set_ylabel("training loss (mean over ranks)")
    ax_l.set_title("loss (the curves coincide)", fontsize="medium")
    ax_l.legend(fontsize="small")
    ax_l.grid(True, alpha=0.3)
    if have_prof:
        from stragg._plot import draw_summary

        draw_summary(axes[1][0], axes[1][1], prof, labels=("stragg profiler:", "stragg profiler:"))
    fig.suptitle(
        f"DDP training of a small causal LM ({first['model']}, "
        f"{first['params'] / 1e6:.1f} M parameters): " + " vs ".join(results),
        fontsize="medium",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def launcher(args: argparse.Namespace) -> int:
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else print
    delay: float | None = None
    if args.straggler_rank is None:
        delay = 0.0
    elif str(args.straggler_delay_ms).strip().lower() != "auto":
        delay = float(args.straggler_delay_ms) / 1e3
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="stragg-finetune-") as tmp:
        for i, backend in enumerate(args.backend_list):
            log(
                f"== job {i + 1}/{len(args.backend_list)}: DDP on backend {backend!r}, "
                f"{args.ranks} ranks, {args.steps} steps"
            )
            res = run_job(args, backend, delay, os.path.join(tmp, f"{i}-{backend}.json"))
            delay = res["delay_s"]  # 'auto' is measured once, by the first job
            results[backend] = res
    first = results[args.backend_list[0]]
    stragg_res = _stragg_result(results)
    gloo_res = results.get("gloo")
    det = detection(stragg_res) if stragg_res else detection({})

    # Per-step table.
    names = list(results)
    log("")
    log(
        f"model: {first['model']}, {first['params'] / 1e6:.2f} M parameters, gradient "
        f"{first['grad_bytes'] / 2**20:.1f} MiB (one DDP bucket = one all_reduce per step)"
    )
    inj = first["injected_straggler"]
    log(
        "injected straggler: "
        + (
            f"rank {inj}, {first['delay_s'] * 1e3:.1f} ms late every step"
            if inj is not None
            else "none"
        )
    )
    every = 1 if args.steps <= 30 else math.ceil(args.steps / 25)
    header = f"{'step':>5}" + "".join(f" {n + ' ms':>11}" for n in names)
    header += "".join(f" {n + ' loss':>12}" for n in names)
    if stragg_res:
        header += "  stragg all_reduce"
    log(header)
    for s in range(args.steps):
        if not (s % every == 0 or s == args.steps - 1 or s + 1 == det.get("first_stragglar_step")):
            continue
        line = f"{s + 1:>5}" + "".join(f" {results[n]['step_s'][s] * 1e3:11.1f}" for n in names)
        line += "".join(f" {results[n]['losses'][s]:12.5f}" for n in names)
        if stragg_res:
            info = (stragg_res.get("per_step_calls") or [{}] * args.steps)[s]
            algos = info.get("algorithms") or []
            strs = [x for x in info.get("stragglers") or [] if x >= 0]
            desc = ",".join(sorted(set(algos))) or "-"
            if strs:
                desc += f" (straggler {strs[0]})"
            line += f"  {desc}"
        log(line)
    if every > 1:
        log(f"(every {every}th step shown; warm-up steps 1-{args.warmup} excluded from means)")

    out: dict[str, Any] = {
        "injected_straggler": inj,
        "detected_straggler": det["detected_straggler"],
        "detected_at_call": det["detected_at_call"],
        "detected_at_step": det["detected_at_step"],
        "first_stragglar_step": det["first_stragglar_step"],
        "steps": args.steps,
        "warmup": args.warmup,
        "ranks": args.ranks,
        "delay_s": first["delay_s"],
        "model": first["model"],
        "params": first["params"],
        "grad_bytes": first["grad_bytes"],
        "backends": names,
    }
    for n, r in results.items():
        out[f"{n}_step_s"] = mean_step(r, args.warmup)
        out[f"{n}_step_times_s"] = r["step_s"]
        out[f"{n}_losses"] = r["losses"]
        out[f"{n}_final_loss"] = r["losses"][-1]
        out[f"{n}_wall_s"] = r["wall_s"]
    for key in (
        "gloo_step_s",
        "stragg_step_s",
        "speedup",
        "speedup_after_detection",
        "loss_rel_diff",
    ):
        out.setdefault(key, None)  # stable keys, also when only one backend ran
    if gloo_res and stragg_res:
        out["gloo_step_s"] = mean_step(gloo_res, args.warmup)
        out["stragg_step_s"] = mean_step(stragg_res, args.warmup)
        out["speedup"] = out["gloo_step_s"] / out["stragg_step_s"]
        after = det["first_stragglar_step"]  # 1-based
        if after is not None and after <= args.steps:
            g = mean_step(gloo_res, args.warmup, after - 1)
            s_ = mean_step(stragg_res, args.warmup, after - 1)
            out["speedup_after_detection"] = g / s_
        else:
            out["speedup_after_detection"] = None
        out["loss_rel_diff"] = max(
            abs(ls - lg) / max(abs(lg), 1e-30)
            for ls, lg in zip(stragg_res["losses"], gloo_res["losses"])
        )
    if stragg_res:
        out["stragg_decisions"] = det["decisions"]
        out["stragg_backend_stats"] = stragg_res.get("backend_stats")
        prof = stragg_res.get("profile")
        out["stragg_profile"] = prof

    log("")
    if stragg_res:
        prof = stragg_res.get("profile")
        if prof is None:
            log("stragg profiler: not available in this stragg build (no stragg.profiler)")
        elif "error" in prof:
            log(f"stragg profiler: {prof['error']}")
        if det["detected_straggler"] is not None:
            where = []
            if det["detected_at_call"] is not None:
                where.append(f"decided at all_reduce call {det['detected_at_call']}")
            if det["first_stragglar_step"] is not None:
                where.append(f"StragglAR from step {det['first_stragglar_step']}")
            log(
                f"stragg detected straggler: rank {det['detected_straggler']} ("
                + ", ".join(where)
                + ")"
            )
        else:
            log("stragg detected straggler: none")
        calls_before = stragg_res.get("calls_before_step") or []
        for d in det["decisions"] or []:
            step = _step_of_call(int(d["call"]), calls_before, int(stragg_res["calls_end"]) + 1)
            who = "none" if d.get("straggler") is None else f"rank {d['straggler']}"
            at = f" (step {step + 1})" if step is not None else ""
            log(
                f"  profiler decision from call {d['call']}{at}: straggler {who}: "
                f"{d.get('reason', '')}"
            )
    for n in names:
        log(
            f"{n:>7}: mean step {out[n + '_step_s'] * 1e3:8.1f} ms, final loss "
            f"{out[n + '_final_loss']:.5f}, job wall time {out[n + '_wall_s']:.1f} s"
        )
    if out["speedup"] is not None:
        extra = ""
        if out.get("speedup_after_detection"):
            extra = f" ({out['speedup_after_detection']:.2f}x after detection)"
        log(f"speedup (gloo step / stragg step): {out['speedup']:.2f}x{extra}")
        log(f"loss curves: max relative difference {out['loss_rel_diff']:.2e}")

    plot = args.plot.strip()
    if plot and plot.lower() != "none":
        saved = plot_results(plot, args, results, det)
        out["plot"] = saved
        if saved:
            log(f"figure: {saved}")
    if args.json:
        print(json.dumps(out), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        worker(args)  # started by torchrun
        return 0
    return launcher(args)


if __name__ == "__main__":
    sys.exit(main())
