"""The fault-free final loss of the reference training, computed in this process.

train_lm.py sums the ranks' gradients (and losses) in rank order, so its result does not depend
on the processes, the network or the restarts: one process that computes every rank's share of
the global batch in turn and sums the same way gets the same bits, without Ray and without the step padding. The
campaign's final loss is compared with this (tests/chaos compares it with a fault-free run of
the job itself).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chaos_jobs import ROOT

GLOBAL_BATCH = 32  # train_lm.py's --global-batch default: the chaos jobs leave it so
CONTEXT = 64


def _train_lm() -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("examples.elastic.train_lm")


def reference_loss(steps: int, world: int, lr: float = 3e-3, each_step: Any = None) -> str:
    """The final loss train_lm.py prints after `steps` steps on `world` ranks, as it writes it
    to final_loss.txt ('%.6f'). `each_step(step, loss)` sees every step's loss on the way.

    Each rank's share of the fixed global batch (`batch_share`, one micro-batch), its sum of
    per-sample losses scaled by `loss_scale` before backward, the gradients summed in rank order
    and divided by the world (train_lm's DDP hook), the loss as the global batch's mean."""
    import torch
    from torch import nn

    from dlu_prime.runtime import batch_share

    lm = _train_lm()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    text = lm.corpus(20_000)
    vocab = sorted(set(text))
    data = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    model = lm.CharLM(len(vocab))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    params = [p for p in model.parameters() if p.requires_grad]
    loss_value = float("nan")
    for step in range(steps):
        grads: list[list[torch.Tensor]] = []
        losses: list[torch.Tensor] = []
        for rank in range(world):
            share = batch_share(GLOBAL_BATCH, world_size=world, rank=rank)
            (rows,) = share.micro_batches()
            x, y = lm.batches(data, step, rows, GLOBAL_BATCH, context=CONTEXT)
            per_token = nn.functional.cross_entropy(
                model(x).reshape(-1, len(vocab)), y.reshape(-1), reduction="none"
            )
            sample_sum = per_token.reshape(len(x), -1).mean(dim=1).sum()
            opt.zero_grad()
            (sample_sum * share.loss_scale).backward()
            grads.append([p.grad.clone() for p in params])  # type: ignore[union-attr]
            losses.append(torch.zeros(1) + sample_sum.detach())
        for index, param in enumerate(params):
            param.grad = lm.ordered_sum([g[index] for g in grads]).div_(world)
        opt.step()
        loss_value = lm.ordered_sum(losses).item() / GLOBAL_BATCH
        if each_step is not None:
            each_step(step + 1, f"{loss_value:.6f}")
    return f"{loss_value:.6f}"


RAY_WORKER_NICENESS = 15  # Ray's default for its workers (RAY_worker_niceness), the job's actors included


def start(
    steps: int, world: int, nice: int = RAY_WORKER_NICENESS, losses: Path | None = None
) -> subprocess.Popen[str]:
    """Compute the reference loss in a child process (one core) while the campaign runs; read it
    with `result`. It runs at the niceness of the job's own processes, so it shares the CPU with
    them as one more rank would (at 0 it would starve them). `losses`: a file where it writes
    each step's loss ('step loss' lines), for `loss_at`."""
    return subprocess.Popen(
        [sys.executable, __file__, str(steps), str(world), *([str(losses)] if losses else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.nice(nice) if nice else None,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def result(process: subprocess.Popen[str], timeout_s: float) -> str:
    """The loss the child printed.

    Raises:
        RuntimeError: it failed (its stderr's last lines) or took longer than `timeout_s`.
    """
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise RuntimeError(f"the reference loss was not computed within {timeout_s:.0f} s") from None
    if process.returncode != 0 or not out.strip():
        raise RuntimeError(f"the reference loss computation failed: {err.strip()[-2000:]}")
    return out.strip().splitlines()[-1]


def loss_at(process: subprocess.Popen[str], losses: Path, step: int, timeout_s: float) -> str:
    """The loss after `step` steps, from the file a child of `start(..., losses=...)` writes; the
    child is stopped once it is there.

    Raises:
        RuntimeError: the child ended or took longer than `timeout_s` before that step.
    """
    deadline = time.monotonic() + timeout_s
    prefix = f"{step} "
    try:
        while time.monotonic() < deadline:
            if losses.exists():
                with open(losses, encoding="utf-8") as lines:
                    for line in lines:
                        if line.startswith(prefix) and line.endswith("\n"):
                            return line.split()[1]
            if process.poll() is not None and not _has(losses, prefix):
                err = process.stderr.read() if process.stderr else ""
                raise RuntimeError(
                    f"the reference computation ended before step {step}: {err.strip()[-2000:]}"
                )
            time.sleep(1.0)
        raise RuntimeError(f"the reference loss at step {step} was not computed within {timeout_s:.0f} s")
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _has(path: Path, prefix: str) -> bool:
    return path.exists() and any(line.startswith(prefix) for line in path.read_text().splitlines())


def _main(argv: list[str]) -> None:
    steps, world = int(argv[0]), int(argv[1])
    if len(argv) > 2:
        with open(argv[2], "a", encoding="utf-8") as out:

            def write(step: int, loss: str) -> None:
                out.write(f"{step} {loss}\n")
                out.flush()

            print(reference_loss(steps, world, each_step=write), flush=True)
    else:
        print(reference_loss(steps, world), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
