"""The ElasticService's two busy threads share one CPU.

Every gRPC call the asyncio server handles goes back and forth between two threads: gRPC's
completion-queue poller (one per process, `..._poll_wrapper`) wakes the event loop's thread,
and the loop's thread wakes the poller for each operation it starts. On two different CPUs each
wake-up is an inter-processor interrupt, which is dear in a virtual machine: measured with
`benchmarks/rendezvous_scale.py` on this 2-core VM, a 10,000-agent round took 2.30 to 2.34 s
with the threads free and 1.60 to 1.89 s with both on one CPU (medians of 3, three interleaved
pairs). Pinning gRPC's event-engine threads as well gained nothing. The CPU is the
one the loop's thread runs on when the server starts. Threads started later from the loop's
thread inherit its affinity: the hook pool resets its own (`release_current_thread`).

`DLU_ELASTIC_ONE_CPU=0` leaves every thread free. Anything missing (no `sched_setaffinity` on
this OS, no poller thread in this gRPC version, a CPU set that refuses) leaves them free too.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

ENABLE_ENV = "DLU_ELASTIC_ONE_CPU"
POLLER_THREAD_MARK = "_poll_wrapper"  # grpc.aio's PollerCompletionQueue thread: "Thread-N (_poll_wrapper)"


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _current_cpu() -> int | None:
    """The CPU the calling thread runs on (field 39 of its stat), or None where /proc has none."""
    try:
        with open("/proc/thread-self/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None


def _poller_thread_ids() -> list[int]:
    return [
        thread.native_id
        for thread in threading.enumerate()
        if POLLER_THREAD_MARK in thread.name and thread.native_id is not None
    ]


def pin_with_poller() -> None:
    """Put the calling thread and gRPC's poller thread on the CPU the caller runs on. Call it from
    the event loop's thread once the server runs (the poller exists from the first asyncio server
    or channel on)."""
    if not enabled() or not hasattr(os, "sched_setaffinity"):
        return
    cpu, pollers = _current_cpu(), _poller_thread_ids()
    if cpu is None or not pollers:
        log.debug("gRPC threads left free (cpu %s, poller threads %s)", cpu, pollers)
        return
    try:
        for thread_id in (0, *pollers):  # 0: the calling thread
            os.sched_setaffinity(thread_id, {cpu})
    except OSError as exc:
        log.debug("gRPC threads left free: %s", exc)
        return
    log.debug("gRPC's loop and poller threads on CPU %d", cpu)


def release_current_thread(cpus: frozenset[int]) -> None:
    """Give the calling thread `cpus` (the process's set before any pinning). A ThreadPoolExecutor
    initializer: the pool's threads are started from the pinned loop thread."""
    if hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:
            log.debug("a hook thread kept the loop's CPU: %s", exc)


def allowed_cpus() -> frozenset[int]:
    """The CPUs this thread may run on now (none known where the OS cannot say, and then
    `release_current_thread` has nothing to do either)."""
    return frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
