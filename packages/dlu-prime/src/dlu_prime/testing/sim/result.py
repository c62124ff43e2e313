"""What one seeded run gives back: its counts, its trace and the violation it found, if any
(its own module so that the runner and the code it delegates to share it without a cycle)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Result:
    seed: int
    steps: int = 0
    events: int = 0
    faults: int = 0
    decisions: int = 0  # monitoring passes and commands the manager judged
    violation: str | None = None
    trace: list[str] = field(default_factory=list[str])
    stage: str = ""
    reason: str = ""
