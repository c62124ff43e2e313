"""A rank's agent judges its own process: only what the process reports, on the agent's clock."""

from __future__ import annotations

from dlu_elastic.worker.watchdog import WAITING_GRACE, WAITING_STATES, ProcessWatch, process_state


def test_a_process_that_never_beats_is_never_judged() -> None:
    watch = ProcessWatch(heartbeat_timeout_s=3.0, hang_timeout_s=5.0)
    assert watch.verdict(1_000_000.0) is None


def test_silence_past_the_timeout_is_a_hang_of_this_rank() -> None:
    watch = ProcessWatch(heartbeat_timeout_s=3.0, hang_timeout_s=None)
    watch.beat(1, 10.0)
    assert watch.verdict(13.0) is None  # exactly at the timeout
    found = watch.verdict(13.5)
    assert found is not None and "no heartbeat for 3.5s (timeout 3s)" in found


def test_beats_without_progress_are_a_hang_only_with_a_hang_timeout() -> None:
    watch = ProcessWatch(heartbeat_timeout_s=3.0, hang_timeout_s=5.0)
    for now in range(10, 40):  # a beat every second, the step stuck at 7
        watch.beat(7, float(now))
        found = watch.verdict(float(now))
        if now - 10 <= 5:
            assert found is None
        else:
            assert found is not None and "training step stuck at 7" in found
            break
    else:
        raise AssertionError("the hang was never found")
    off = ProcessWatch(heartbeat_timeout_s=3.0, hang_timeout_s=None)
    for now in range(10, 100):
        off.beat(7, float(now))
        assert off.verdict(float(now)) is None


def test_a_long_healthy_run_is_never_judged() -> None:
    """Soak: 10,000 timeouts' worth of steady beats and steps: no verdict, ever."""
    watch = ProcessWatch(heartbeat_timeout_s=2.0, hang_timeout_s=4.0)
    now = 0.0
    for step in range(20_000):
        now += 1.0  # one step a second, half the heartbeat timeout
        watch.beat(step, now)
        assert watch.verdict(now + 0.99) is None


def test_a_waiting_process_gets_a_grace_so_the_hung_peer_is_blamed_first() -> None:
    """Both ranks went silent together: the stopped one is judged at the timeout, the one
    blocked in its collective (sleeping) only after the grace."""
    hung, blocked = ProcessWatch(2.0, None), ProcessWatch(2.0, None)
    hung.beat(5, 10.0)
    blocked.beat(5, 10.05)
    at = 12.2
    assert hung.suspect(at) and hung.verdict(at, waiting=False) is not None
    assert blocked.suspect(at) and blocked.verdict(at, waiting=True) is None
    assert blocked.verdict(10.05 + 2.0 * (1 + WAITING_GRACE) + 0.01, waiting=True) is not None


def test_a_peer_seen_waiting_keeps_its_grace_when_it_wakes_silent() -> None:
    """Killing the hung rank fails its peers' collectives: a peer seen blocked (sleeping) past
    its timeout, then running and still silent, is not blamed before its grace ends; a beat
    ends that silence and the grace with it."""
    peer = ProcessWatch(2.0, None)
    peer.beat(5, 10.0)
    assert peer.judge(12.1, waiting=True) is None
    assert peer.judge(12.5, waiting=False) is None  # woken by the kill, still silent
    assert peer.judge(10.0 + 2.0 * (1 + WAITING_GRACE) + 0.01, waiting=False) is not None
    peer.beat(6, 20.0)
    assert peer.judge(22.1, waiting=False) is not None  # a new silence: never seen waiting


def test_a_running_process_never_seen_waiting_is_judged_at_its_timeout() -> None:
    hung = ProcessWatch(2.0, None)
    hung.beat(5, 10.0)
    assert hung.judge(12.1, waiting=False) is not None


def test_process_state_reads_the_kernel() -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while process_state(child.pid) not in WAITING_STATES and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process_state(child.pid) in WAITING_STATES
        os.kill(child.pid, signal.SIGSTOP)
        while process_state(child.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process_state(child.pid) == "T"
    finally:
        child.kill()
        child.wait()
    assert process_state(child.pid) is None


def test_a_script_known_to_beat_must_send_its_first_beat_in_time() -> None:
    """A restarted process of a script that beat before, hung in its start-up (e.g. the process
    group's init): silent from its start."""
    watch = ProcessWatch(heartbeat_timeout_s=3.0, hang_timeout_s=None, started_at=100.0)
    assert watch.verdict(106.0) is None  # start-up: FIRST_BEAT_ALLOWANCE (2) x the timeout
    found = watch.verdict(106.5)
    assert found is not None and "no first heartbeat 6.5s after its start" in found
    assert watch.verdict(106.5, waiting=True) is None  # blocked on a peer: the grace first
    assert watch.verdict(109.5, waiting=True) is not None
    watch.beat(0, 105.2)
    assert watch.verdict(107.0) is None


def test_an_unknown_script_is_never_judged_before_its_first_beat() -> None:
    watch = ProcessWatch(heartbeat_timeout_s=3.0, hang_timeout_s=5.0, started_at=None)
    assert watch.verdict(1_000_000.0) is None


def test_a_slow_but_healthy_start_within_the_timeout_is_never_judged() -> None:
    """Soak: 1,000 restarts whose first beat comes just inside the timeout."""
    for start in range(1_000):
        watch = ProcessWatch(heartbeat_timeout_s=2.0, hang_timeout_s=4.0, started_at=float(start * 10))
        for tick in range(20):
            assert watch.verdict(start * 10 + tick * 0.099) is None
        watch.beat(0, start * 10 + 1.99)
        assert watch.verdict(start * 10 + 3.0) is None
