"""accelerate and the transformers Trainer on stragg: a tiny GPT-2 trained on 2 CPU ranks.

    torchrun --nproc-per-node 2 examples/hf_trainer.py                    # Trainer on stragg
    torchrun --nproc-per-node 2 examples/hf_trainer.py --api accelerate   # Accelerator loop
    torchrun --nproc-per-node 2 examples/hf_trainer.py --backend gloo     # the same on Gloo
    torchrun --nproc-per-node 2 examples/hf_trainer.py --json             # last line: JSON

What a user adds for stragg is one call before the Accelerator / TrainingArguments exist:

    import stragg.integrations.hf
    stragg.integrations.hf.use_stragg()

after which `Accelerator(cpu=True)` and `Trainer(..., TrainingArguments(use_cpu=True))` create
their process group on stragg (on GPUs: `Accelerator()` / `use_cpu=False`). The model is a GPT-2
built from a config with random weights on a synthetic token language, so nothing is
downloaded. `--use-cpu 0` on a host without GPUs shows the trap stragg warns about: accelerate
then wraps nothing in DDP and every rank trains alone.

Rank 0 prints the per-step losses (Trainer: the mean over ranks it logs; accelerate: rank 0's)
and how many all_reduces stragg carried (stragg.backend_stats). With the Trainer on stragg,
stragg.integrations.hf.add_straggler_report logs per-rank lateness and the straggler verdict
through `trainer.log` every `--report-every` steps (2; 0: off): the Trainer's printer shows them
with the losses, and rank 0 prints the last report's table. `--late-rank R` makes rank R sleep
20 ms per step (an injected straggler).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

CONFIG = {"vocab_size": 64, "n_positions": 16, "n_embd": 32, "n_layer": 1, "n_head": 2}


def build_model(seed: int) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(
        **CONFIG,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=False,
    )
    return GPT2LMHeadModel(cfg)


class TokenData(torch.utils.data.Dataset):
    """Sequences of a fixed random Markov chain over the vocabulary (learnable, no download)."""

    def __init__(self, samples: int, seed: int) -> None:
        vocab, seq = CONFIG["vocab_size"], CONFIG["n_positions"]
        g = torch.Generator().manual_seed(seed)
        successors = torch.randint(0, vocab, (vocab, 2), generator=g)
        tokens = torch.empty(samples, seq, dtype=torch.int64)
        tokens[:, 0] = torch.randint(0, vocab, (samples,), generator=g)
        pick = torch.randint(0, 2, (samples, seq), generator=g)
        for t in range(1, seq):
            tokens[:, t] = successors[tokens[:, t - 1], pick[:, t]]
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def stragg_stats() -> dict[str, Any] | None:
    if not dist.is_initialized() or "stragg" not in str(dist.get_backend()):
        return None
    import stragg

    stats = stragg.backend_stats()
    return {k: v for k, v in stats.items() if isinstance(v, (int, float, str))}


def run_trainer(args: argparse.Namespace) -> tuple[list[float], bool, Any]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    losses: list[float] = []

    class Losses(TrainerCallback):
        def on_log(self, targs: Any, state: Any, control: Any, logs: Any = None, **kw: Any):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

        def on_step_begin(self, targs: Any, state: Any, control: Any, **kw: Any) -> None:
            if int(os.environ.get("RANK", "0")) == args.late_rank:
                time.sleep(0.02)  # arrives late at the gradient all_reduce

    with tempfile.TemporaryDirectory(prefix="stragg-hf-") as out:
        targs = TrainingArguments(
            output_dir=out,
            use_cpu=bool(args.use_cpu),
            max_steps=args.steps,
            per_device_train_batch_size=args.batch,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            seed=args.seed,
            data_seed=args.seed,
            disable_tqdm=True,
            dataloader_num_workers=0,
            ddp_find_unused_parameters=False,
        )
        trainer = Trainer(
            model=build_model(args.seed),
            args=targs,
            train_dataset=TokenData(args.steps * args.batch * 8, args.seed + 1),
            callbacks=[Losses()],
        )
        report = None
        if args.backend == "stragg" and args.report_every > 0:
            import stragg.integrations.hf

            report = stragg.integrations.hf.add_straggler_report(trainer, args.report_every)
        trainer.train()
        wrapped = isinstance(trainer.model_wrapped, torch.nn.parallel.DistributedDataParallel)
    return losses, wrapped, report


def run_accelerate(args: argparse.Namespace) -> tuple[list[float], bool, Any]:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=bool(args.use_cpu))
    model = build_model(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = TokenData(args.steps * args.batch * 8, args.seed + 1)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=False)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    wrapped = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    losses: list[float] = []
    for step, batch in enumerate(loader):
        if step == args.steps:
            break
        loss = model(**batch).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses, wrapped, None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--api", choices=("trainer", "accelerate"), default="trainer")
    p.add_argument("--backend", choices=("stragg", "gloo"), default="stragg")
    p.add_argument("--use-cpu", type=int, default=1, help="1 (default): cpu=True / use_cpu=True")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report-every", type=int, default=2, help="straggler report period (0: off)")
    p.add_argument("--late-rank", type=int, default=-1, help="this rank sleeps 20 ms per step")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    if args.backend == "stragg":
        import stragg.integrations.hf

        stragg.integrations.hf.use_stragg()  # the one line a user adds

    run = run_trainer if args.api == "trainer" else run_accelerate
    losses, wrapped, report = run(args)
    stats = stragg_stats()
    backend = str(dist.get_backend()) if dist.is_initialized() else None
    if dist.is_initialized():
        dist.barrier()
        # Gloo can abort at interpreter exit ("terminate called without an active exception")
        # when its group outlives main(): tear every group down while Python is still alive.
        dist.destroy_process_group()
    if os.environ.get("RANK", "0") != "0":
        return 0
    result = {
        "api": args.api,
        "backend": backend,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "wrapped_in_ddp": wrapped,
        "losses": losses,
        "stragg_stats": stats,
        "straggler_report": report.last_report.to_dict() if report and report.last_report else None,
        "reported_metrics": None if report is None else report.history,
    }
    print(
        f"{args.api} on {backend}: DDP {'yes' if wrapped else 'NO'}, "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps"
    )
    if stats is not None:
        print(f"stragg carried {stats['allreduce_calls']} all_reduces ({stats['transport']})")
    if report is not None:
        if report.last_report is not None:
            print(report.last_report.table())
    if args.json:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
