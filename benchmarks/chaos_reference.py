"""The fault-free final loss of the reference training, computed in this process.

train_lm.py sums the ranks' gradients (and losses) in rank order, so its result does not depend
on the processes, the network or the restarts: one process that computes every rank's batch in
turn and sums the same way gets the same bits, without Ray and without the step padding. The
campaign's final loss is compared with this (tests/chaos compares it with a fault-free run of
the job itself).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from typing import Any

from chaos_jobs import ROOT

BATCH = 8
CONTEXT = 64


def _train_lm() -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("examples.elastic.train_lm")


def reference_loss(steps: int, world: int, lr: float = 3e-3) -> str:
    """The final loss train_lm.py prints after `steps` steps on `world` ranks, as it writes it
    to final_loss.txt ('%.6f')."""
    import torch
    from torch import nn

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
            x, y = lm.batches(data, step, rank, batch=BATCH, context=CONTEXT)
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, len(vocab)), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            grads.append([p.grad.clone() for p in params])  # type: ignore[union-attr]
            losses.append(loss.detach().reshape(1))
        for index, param in enumerate(params):
            param.grad = lm.ordered_sum([g[index] for g in grads]).div_(world)
        opt.step()
        loss_value = lm.ordered_sum(losses).item() / world
    return f"{loss_value:.6f}"


def start(steps: int, world: int, nice: int = 0) -> subprocess.Popen[str]:
    """Compute the reference loss in a child process (one core, `nice` lowers its priority)
    while the campaign runs; read it with `result`. Sharing the CPU slows the job's steps a
    little, which changes no loss and no accounting."""
    return subprocess.Popen(
        [sys.executable, __file__, str(steps), str(world)],
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


if __name__ == "__main__":
    print(reference_loss(int(sys.argv[1]), int(sys.argv[2])), flush=True)
