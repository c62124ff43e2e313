"""The node-check probe in real processes: gloo on 127.0.0.1, one process per node of a group.

One spawned pool for the module: its workers import torch once (seconds on this machine) and
then run probe after probe, which also proves that a probe, failed or not, leaves its process
ready for the next one (round 2, a restart, or the training's own process group). Results are
awaited with generous deadlines: a probe that ignored its own timeout would outlast them.
"""

from __future__ import annotations

import importlib
import multiprocessing
import socket
from collections.abc import Iterator
from multiprocessing.pool import AsyncResult, Pool
from typing import Any

import pytest

from dlu_api.spec.models import NodeCheckSettings
from dlu_elastic.node_check import NodeResult, ProbeError, by_node, judge, measure, run_probe

WORKERS = 3  # enough for a triple


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(WORKERS, initializer=importlib.import_module, initargs=("torch",)) as workers:
        yield workers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def probe_args(rank: int, size: int, port: int, **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "group_rank_in_pair": rank,
        "pair_size": size,
        "master_addr": "127.0.0.1",
        "master_port": port,
        "backend": "gloo",
        "matmul_size": 128,
        "allreduce_mb": 1.0,
        "device": "cpu",
        "timeout_s": 30.0,
    }
    args.update(overrides)
    return args


def run_group(pool: Pool, size: int, per_rank: dict[int, dict[str, Any]] | None = None) -> list[NodeResult]:
    """One group's probes at once, as `measure` reports (a failure becomes an error)."""
    port = free_port()
    pending = [
        pool.apply_async(
            measure, (f"node{rank}",), probe_args(rank, size, port, **(per_rank or {}).get(rank, {}))
        )
        for rank in range(size)
    ]
    return [job.get(timeout=90) for job in pending]


@pytest.mark.timeout(120)
def test_pair_reports_a_time_for_each_node(pool: Pool) -> None:
    results = run_group(pool, 2)
    assert [r.error for r in results] == [None, None]
    assert all(isinstance(r.elapsed_s, float) for r in results), results


@pytest.mark.timeout(120)
def test_triple_reports_a_time_for_each_node(pool: Pool) -> None:
    results = run_group(pool, 3)
    assert all(r.error is None and isinstance(r.elapsed_s, float) for r in results), results


@pytest.mark.timeout(120)
def test_a_delayed_node_is_the_only_straggler_of_its_triple(pool: Pool) -> None:
    """The verdict the master draws from real probes: the untimed barriers keep one node's delay
    out of its partners' times, so it alone is named (were the delay in every time, the median
    would carry it and nobody would stand out)."""
    results = run_group(pool, 3, {1: {"delay_s": 3.0}})
    assert [r.error for r in results] == [None, None, None]
    verdict = judge(by_node(results), None, NodeCheckSettings(timeout_s=30.0))
    assert (verdict.stragglers, verdict.faulty) == (("node1",), ()), verdict.summary()


@pytest.mark.timeout(120)
def test_injected_failure_raises_and_the_partner_fails_within_its_timeout(pool: Pool) -> None:
    port = free_port()
    failing: AsyncResult[float] = pool.apply_async(
        run_probe, (), probe_args(1, 2, port, fail=True, timeout_s=2.0)
    )
    partner: AsyncResult[NodeResult] = pool.apply_async(
        measure, ("node0",), probe_args(0, 2, port, timeout_s=2.0)
    )
    with pytest.raises(ProbeError, match="injected failure"):
        failing.get(timeout=60)
    result = partner.get(timeout=60)
    assert result.elapsed_s is None
    assert result.error is not None and "rendezvous" in result.error


@pytest.mark.timeout(120)
def test_timeout_is_respected_when_the_partner_never_comes(pool: Pool) -> None:
    # rank 0 hosts the store and waits for clients; rank 1 keeps dialling a master that is absent
    lonely = [
        pool.apply_async(measure, (f"node{rank}",), probe_args(rank, 2, free_port(), timeout_s=2.0))
        for rank in (0, 1)
    ]
    results = [job.get(timeout=60) for job in lonely]
    assert all(r.elapsed_s is None and r.error for r in results), results


@pytest.mark.timeout(120)
def test_a_partner_slower_than_the_timeout_fails_both_then_the_next_probe_works(pool: Pool) -> None:
    results = run_group(pool, 2, {0: {"timeout_s": 2.0}, 1: {"timeout_s": 2.0, "delay_s": 3.0}})
    assert [r.elapsed_s for r in results] == [None, None]
    # A failed rendezvous on some ranks only must leave nothing behind that the next group would
    # trip on (torch numbers groups before rendezvous). Two lonely probes at once land on two
    # distinct workers; the triple after them needs all three, failed and clean alike.
    lonely = [
        pool.apply_async(measure, (f"node{i}",), probe_args(0, 2, free_port(), timeout_s=1.0))
        for i in range(2)
    ]
    assert [job.get(timeout=60).elapsed_s for job in lonely] == [None, None]
    again = run_group(pool, 3)
    assert [r.error for r in again] == [None, None, None]


def test_bad_arguments_are_refused_before_any_torch_work() -> None:
    with pytest.raises(ValueError, match="not in a group"):
        run_probe(**probe_args(2, 2, 29500))
    with pytest.raises(ValueError, match="backend"):
        run_probe(**probe_args(0, 2, 29500, backend="mpi"))
    with pytest.raises(ValueError, match="nccl needs a cuda device"):
        run_probe(**probe_args(0, 2, 29500, backend="nccl"))
