"""Root cause and recoveries of a job, read from its event timeline. Pure functions.

`dlu status` answers the questions users ask after a bad night: which actor failed first, on
which node, with what error, and what each rung of the failover ladder did about it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dlu_api.status import JobEvent
from dlu_api.vocabulary import FAILURE_EVENTS, RECOVERY_EVENTS


@dataclass(frozen=True)
class RootCause:
    first_failure: JobEvent | None
    recoveries: tuple[JobEvent, ...]

    def lines(self) -> list[str]:
        out: list[str] = []
        if self.first_failure is not None:
            e = self.first_failure
            node = f" on node {e.node_id[:12]}" if e.node_id else ""
            who = e.actor or e.role or "the job"
            out.append(f"first failure: {who}{node} ({e.kind}): {e.message}")
        for e in self.recoveries:
            tier = f"[{e.tier}] " if e.tier else ""
            took = f" ({e.duration_s:.2f}s)" if e.duration_s is not None else ""
            where = f"{e.role}: " if e.role else ""
            out.append(f"  {tier}{e.kind}{took}: {where}{e.message}")
        return out


def root_cause(events: Sequence[JobEvent], first_failure: JobEvent | None = None) -> RootCause:
    """The job's first failure and every recovery step that followed it.

    `first_failure` is the one the PrimeMaster kept for the whole job; the timeline only holds
    the recent events, so its own first failure is a fallback for older masters.
    """
    first = first_failure or next((e for e in events if e.kind in FAILURE_EVENTS), None)
    after = [e for e in events if e.kind in RECOVERY_EVENTS and (first is None or e.time >= first.time)]
    return RootCause(first, tuple(after))
