"""A rank's agent watches its own training process: silence and hangs, judged on its clock.

The agent is the one that can tell a hung process from a busy one (it sees every beat the
process sends) and the one that can act at once: it kills the process and reports the failure
as its own, so the in-place restart is blamed on this rank, not on the peers whose collectives
then fail. Only what the process reports is judged: a script that never calls `heartbeat()` is
never found silent, and one that reports no step never hangs. Once an agent has seen its script
beat, it knows the script does: a later process of it (an in-place restart) that sends no first
beat within FIRST_BEAT_ALLOWANCE heartbeat timeouts of its start is silent too (hung in its start-up, e.g. in
the process group's init).

Blame: when one rank hangs, its peers stop beating too, blocked in their next collective, at
about the same moment. So a process that is *waiting* (sleeping in the kernel, as a blocked
collective is) gets a grace on top of the timeout, while one that is stopped or spinning is
judged at once: the hung rank is found and restarted first, and the round it opens releases the
waiting peers without blaming them. If every rank waits (a true distributed deadlock) the first
one past its grace is blamed. A process seen waiting once past its timeout keeps its grace until
it beats again: when the hung rank is killed, the peers' collectives fail and their processes
wake up running, still silent, an instant before their own failure or the new round reaches them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

WAITING_GRACE = 0.5  # a waiting process is judged after (1 + this) x the timeout
# A restarted process's first beat comes after its start-up (script imports, model, checkpoint,
# the process group's init), which takes longer than a step and longest on a loaded machine: it
# is due within this many heartbeat timeouts. Seen: 5 s timeouts, load 20 on 2 cores, healthy
# survivors of an actor failover judged silent 5.0 s after their start, again and again.
FIRST_BEAT_ALLOWANCE = 2.0
WAITING_STATES = frozenset({"S", "D", "I"})  # sleeping, in uninterruptible I/O, idle


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of a process (R, S, D, T, ...), None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ')'.
    rest = stat[stat.rfind(")") + 1 :].split()
    return rest[0] if rest else None


@dataclass
class ProcessWatch:
    """What one training process has shown of its liveness; `verdict` is a pure judgement."""

    heartbeat_timeout_s: float | None
    hang_timeout_s: float | None
    started_at: float | None = None  # set when this script is known to beat: its first beat is due
    last_beat_at: float | None = None
    step: int | None = None
    step_moved_at: float | None = None
    waited: bool = False  # seen waiting since its last beat, once past a timeout: it keeps the grace

    def beat(self, step: int | None, now: float) -> None:
        self.last_beat_at = now
        self.waited = False
        if step is not None and step != self.step:
            self.step = step
            self.step_moved_at = now

    def verdict(self, now: float, waiting: bool = False) -> str | None:
        """Why the process counts as hung now, or None while it is fine. `waiting`: the process
        sleeps in the kernel (maybe blocked on a hung peer), so it gets the grace."""
        grace = 1.0 + WAITING_GRACE if waiting or self.waited else 1.0
        timeout = self.heartbeat_timeout_s
        if self.last_beat_at is None:
            due = None if timeout is None else timeout * FIRST_BEAT_ALLOWANCE * grace
            if due is None or self.started_at is None or now - self.started_at <= due:
                return None
            return (
                f"training process sent no first heartbeat {now - self.started_at:.1f}s after its start "
                f"(due within {FIRST_BEAT_ALLOWANCE:g} x the heartbeat timeout {timeout:g}s; "
                "its earlier processes beat)"
            )
        if timeout is not None and now - self.last_beat_at > timeout * grace:
            return f"training process sent no heartbeat for {now - self.last_beat_at:.1f}s (timeout {timeout:g}s)"
        hang = self.hang_timeout_s
        if hang is not None and self.step_moved_at is not None and now - self.step_moved_at > hang * grace:
            return f"training step stuck at {self.step} for {now - self.step_moved_at:.1f}s (hang timeout {hang:g}s)"
        return None

    def judge(self, now: float, waiting: bool) -> str | None:
        """`verdict` for a suspect process whose state was just read: one seen waiting keeps its
        grace for the rest of this silence."""
        self.waited = self.waited or waiting
        return self.verdict(now, waiting)

    def suspect(self, now: float) -> bool:
        """Past a timeout without the grace: worth reading the process' state to judge it."""
        return self.verdict(now) is not None
