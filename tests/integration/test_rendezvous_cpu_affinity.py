"""The ElasticService's event-loop thread and gRPC's poller thread share one CPU; the threads that
run the master's hooks, and every other thread, keep the process's CPUs; the switch turns it off.

A real server on 127.0.0.1 and a real client; affinities read back from the kernel by thread id."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu_elastic.rendezvous import cpu_affinity
from dlu_elastic.rendezvous.client import ElasticClient
from dlu_elastic.rendezvous.service import ElasticServicer, RunningServer, serve
from dlu_elastic.rendezvous.state import Rendezvous

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
        reason="needs a thread affinity API and at least two CPUs to tell one CPU from all",
    ),
]

TOKEN = "affinity-token"


def _thread_cpus(thread: threading.Thread) -> set[int]:
    assert thread.native_id is not None
    return os.sched_getaffinity(thread.native_id)


def _pollers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if cpu_affinity.POLLER_THREAD_MARK in t.name]


@contextmanager
def _serve_and_beat() -> Iterator[tuple[RunningServer, set[int]]]:
    """A server with one node; one heartbeat runs the master's hook, which records its CPUs."""
    hook_cpus: list[set[int]] = []

    def on_heartbeat(request: pb.HeartbeatRequest) -> int:
        del request
        hook_cpus.append(os.sched_getaffinity(0))
        return pb.ACTION_NONE

    rendezvous = Rendezvous(min_nodes=1, max_nodes=1)
    server = serve(
        "127.0.0.1", 0, token=TOKEN, servicer=ElasticServicer(rendezvous, on_heartbeat=on_heartbeat)
    )
    try:
        with ElasticClient(server.address, TOKEN, 10.0) as client:
            state = client.rendezvous(
                agent_id="a0", node_id="n0", local_ranks=1, host="127.0.0.1", free_port=29500, timeout_s=20
            )
            client.heartbeat(round=state.round, agent_id="a0", step=1)
        assert len(hook_cpus) == 1, "the heartbeat hook ran once"
        yield server, hook_cpus[0]
    finally:
        server.stop(0)


def test_the_loop_thread_and_grpcs_poller_share_one_cpu_and_hooks_keep_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(cpu_affinity.ENABLE_ENV, raising=False)
    everything = os.sched_getaffinity(0)
    with _serve_and_beat() as (server, hook_cpus):
        loop_cpus = _thread_cpus(server.thread)
        assert len(loop_cpus) == 1 and loop_cpus <= everything, loop_cpus
        pollers = _pollers()
        assert pollers, "grpc.aio runs a completion-queue poller thread"
        assert all(_thread_cpus(p) == loop_cpus for p in pollers), "the poller is on the loop's CPU"
        assert hook_cpus == everything, "a hook thread started from the loop got the process's CPUs back"
        assert os.sched_getaffinity(0) == everything, "the thread that called serve() is untouched"


def test_the_switch_leaves_every_thread_free(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_affinity.ENABLE_ENV, "0")
    everything = os.sched_getaffinity(0)
    with _serve_and_beat() as (server, hook_cpus):
        assert _thread_cpus(server.thread) == everything
        assert hook_cpus == everything


def test_no_poller_thread_means_nothing_is_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gRPC whose poller is not found: pinning the loop alone would buy nothing, so it is not."""
    monkeypatch.delenv(cpu_affinity.ENABLE_ENV, raising=False)
    monkeypatch.setattr(cpu_affinity, "POLLER_THREAD_MARK", "no-such-thread")
    everything = os.sched_getaffinity(0)
    with _serve_and_beat() as (server, _):
        assert _thread_cpus(server.thread) == everything
