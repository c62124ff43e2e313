"""The node-check measurement that runs inside one process per node of a pair or triple.

Torch is imported inside the functions so that the master, which only plans and judges, never
pays for it. A probe owns the process's default process group while it runs, so call it in a
process that has none (a fresh or freshly forked one); it always destroys the group again, so
the same process can probe again in round 2 or after a restart.

What is timed: the node's own compute (matmul, plus any injected delay) and, after an untimed
barrier, the allreduce over the link. The barrier keeps a slow partner's compute out of this
node's time, so a compute straggler shows up alone in round 1 while a bad link slows or fails
both ends and is sorted out by round 2 (see `plan`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from dlu_elastic.node_check.plan import NodeResult

if TYPE_CHECKING:
    import torch

Backend = Literal["gloo", "nccl"]

DELAY_ENV = "DLU_NODE_CHECK_DELAY_S"
FAIL_ENV = "DLU_NODE_CHECK_FAIL"
MATMUL_ITERS = 3
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


class ProbeError(RuntimeError):
    """The probe did not finish (rendezvous, collective, timeout, wrong result or injected fault)."""


def injected_faults(env: Mapping[str, str] | None = None) -> tuple[float, bool]:
    """`(delay_s, fail)` from DLU_NODE_CHECK_DELAY_S / DLU_NODE_CHECK_FAIL (default os.environ).

    These are test knobs, so a malformed value raises instead of silently testing nothing.
    """
    source: Mapping[str, str] = os.environ if env is None else env
    raw_delay = source.get(DELAY_ENV, "").strip()
    try:
        delay_s = float(raw_delay) if raw_delay else 0.0
    except ValueError:
        raise ValueError(f"{DELAY_ENV}={raw_delay!r} is not a number of seconds") from None
    if not delay_s >= 0.0:  # also refuses NaN
        raise ValueError(f"{DELAY_ENV}={raw_delay!r} must be >= 0")
    raw_fail = source.get(FAIL_ENV, "").strip().lower()
    if raw_fail not in _TRUE | _FALSE:
        raise ValueError(f"{FAIL_ENV}={raw_fail!r} is not a boolean (1/0, true/false, yes/no, on/off)")
    return delay_s, raw_fail in _TRUE


def run_probe(
    group_rank_in_pair: int,
    pair_size: int,
    master_addr: str,
    master_port: int,
    backend: Backend,
    matmul_size: int,
    allreduce_mb: float,
    device: str,
    timeout_s: float,
    delay_s: float = 0.0,
    fail: bool = False,
) -> float:
    """Join the pair's temporary process group, time matmul + allreduce, return seconds.

    Every blocking step (rendezvous, barrier, allreduce) is bounded by `timeout_s` through
    torch's own timeouts; a TCP store whose master never comes may take a few times that to
    give up, so callers should still keep a hard deadline on the process. NCCL may abort the
    process on a timeout instead of raising. Raises `ProbeError` when the probe did not finish,
    `ValueError` on bad arguments.
    """
    _check_args(
        group_rank_in_pair, pair_size, master_port, backend, device, matmul_size, allreduce_mb, timeout_s
    )
    if fail:
        raise ProbeError(f"injected failure ({FAIL_ENV})")
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        raise ProbeError("this process already has a default process group; probe in a fresh process")
    dev = torch.device(device)
    if backend == "nccl":
        torch.cuda.set_device(dev)
    host = f"[{master_addr}]" if ":" in master_addr and not master_addr.startswith("[") else master_addr
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{host}:{master_port}",
            rank=group_rank_in_pair,
            world_size=pair_size,
            timeout=timedelta(seconds=timeout_s),
        )
    except Exception as exc:
        _forget_failed_init()
        raise ProbeError(f"rendezvous at {host}:{master_port} failed: {_brief(exc)}") from exc
    try:
        return _measure(dev, pair_size, matmul_size, allreduce_mb, delay_s)
    except ProbeError:
        raise
    except Exception as exc:
        raise ProbeError(f"probe failed: {_brief(exc)}") from exc
    finally:
        dist.destroy_process_group()


def measure(node: str, **probe_args: Any) -> NodeResult:
    """`run_probe(**probe_args)` as a report: a `ProbeError` becomes a failed `NodeResult`."""
    try:
        return NodeResult(node, run_probe(**probe_args))
    except ProbeError as exc:
        return NodeResult(node, None, str(exc))


def _measure(
    dev: torch.device, pair_size: int, matmul_size: int, allreduce_mb: float, delay_s: float
) -> float:
    import torch as torch_
    import torch.distributed as dist

    a = torch_.randn(matmul_size, matmul_size, device=dev)
    b = torch_.randn(matmul_size, matmul_size, device=dev)
    payload = torch_.ones(max(1, int(allreduce_mb * 2**20) // 4), dtype=torch_.float32, device=dev)
    token = torch_.ones(1, device=dev)

    product = a @ b  # warm-up: allocator, BLAS / cuBLAS handles
    dist.all_reduce(token)  # barrier: the pair's start skew is not this node's time
    _sync(dev)

    start = time.perf_counter()
    if delay_s > 0:
        time.sleep(delay_s)
    for _ in range(MATMUL_ITERS):
        product = a @ b
    _sync(dev)
    compute_s = time.perf_counter() - start

    dist.all_reduce(token)  # barrier again: keep the partner's compute out of our allreduce time
    _sync(dev)
    start = time.perf_counter()
    dist.all_reduce(payload)
    _sync(dev)
    comm_s = time.perf_counter() - start

    if not bool(torch_.isfinite(product).all()):
        raise ProbeError("matmul produced non-finite values")
    if not bool(payload.eq(pair_size).all()):
        raise ProbeError(f"allreduce returned a wrong sum (expected {pair_size} everywhere)")
    return compute_s + comm_s


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        import torch as torch_

        torch_.cuda.synchronize(dev)


def _check_args(
    rank: int,
    size: int,
    port: int,
    backend: str,
    device: str,
    matmul_size: int,
    allreduce_mb: float,
    timeout_s: float,
) -> None:
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and not device.startswith("cuda"):
        raise ValueError(f"backend nccl needs a cuda device, got {device!r}")
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in a group of {size}")
    if not 0 < port < 65536:
        raise ValueError(f"bad master port {port}")
    if matmul_size < 1 or allreduce_mb <= 0 or timeout_s <= 0:
        raise ValueError("matmul_size, allreduce_mb and timeout_s must be positive")


def _forget_failed_init() -> None:
    """Undo what a failed `init_process_group` leaves behind.

    It numbers the group before the rendezvous, and only `destroy_process_group` resets that
    counter; a failed attempt left on one rank only would make the next group of this process
    (the next probe, or the training's own group) wait on store keys its peers never write.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    if dist.is_initialized():
        dist.destroy_process_group()
    else:
        distributed_c10d._world.group_count = 0  # pyright: ignore[reportPrivateUsage]


def _brief(exc: BaseException) -> str:
    """Torch errors can carry a C++ backtrace; the first line says what happened."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return f"{type(exc).__name__}: {line[:300]}"
