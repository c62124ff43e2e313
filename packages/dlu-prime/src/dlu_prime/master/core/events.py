"""The inputs of the decision core, as frozen data: what was observed or asked, and what each
command came to (`Done`). Gathering them is I/O (the PrimeManager's and the executor's);
judging them is `decide`'s."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dlu_prime.autoscale.memory import MemoryView
from dlu_prime.autoscale.policy import RoleView
from dlu_prime.brain_port.models import RolePlan
from dlu_prime.master.core.commands import Command, InPlaceReport, Then
from dlu_prime.master.monitor import Assessment
from dlu_prime.master.stall import ChannelView, StallMemory
from dlu_prime.master.state import FailoverRecord
from dlu_prime.scheduler.base import ActorObservation


@dataclass(frozen=True)
class PassObserved:
    """One monitoring pass, judged by `monitor.assess` on the liveness view it keeps (when each
    actor's beats and steps last moved): its assessment, and which actors the poll found gone."""

    assessment: Assessment
    gone: frozenset[str] = frozenset()
    has_extension: bool = False  # an Extension can relaunch nodes (tier 4)
    gone_since: Mapping[str, float] = field(default_factory=dict[str, float])
    """Elastic roles' workers gone or dead this pass -> the first pass each was seen so (the
    observer's memory, on this clock): the loss judgement's input."""


@dataclass(frozen=True)
class PassApplied:
    """Internal: the pass's observations are recorded; judge its failures on that state."""

    observed: PassObserved


InPlaceReported = InPlaceReport  # the event of a rank's in-place report


@dataclass(frozen=True)
class RestartRequested:
    """A SubMaster asks for these actors to be replaced (during its failover, or on its own)."""

    names: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class StopRequested:
    """Stop the job with this exit code and reason (a user's stop, a limit, an error)."""

    exit_code: int
    reason: str


@dataclass(frozen=True)
class PrepareRequested:
    """INIT -> READY. `stop`: a stop asked for meanwhile, honoured once the actors are placed."""

    stop: str | None = None


@dataclass(frozen=True)
class StartRequested:
    """READY -> RUNNING, unless a stop was asked for (`stop`)."""

    stop: str | None = None


@dataclass(frozen=True)
class MasterRebuilt:
    """Tier 6: a reconstructed PrimeMaster loaded this state."""


@dataclass(frozen=True)
class Tick:
    """The loop looks at the saved state: carry on with what is in flight (a recovery a
    previous PrimeMaster began, a stop it did not finish)."""


@dataclass(frozen=True)
class Done:
    """What a command came to: its value, or the error it raised (`error` set)."""

    command: Command
    value: Any = None
    error: BaseException | None = None
    duration_s: float = 0.0

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def error_text(self) -> str:
        return f"{type(self.error).__name__}: {self.error}" if self.error is not None else ""


@dataclass(frozen=True)
class RecoveryFailed:
    """Internal: the failed recovery `record` was recorded ended; escalate it or stop."""

    record: FailoverRecord
    error: str
    then: Then


@dataclass(frozen=True)
class CarryOn:
    """Internal: a step of a chain ended well; begin what it still has to do (`then`)."""

    then: Then


@dataclass(frozen=True)
class ScaleRequested:
    """`dlu scale` (or an auto-scaling policy): `role` to `size` (a node count for an elastic
    role). The reply is the plan; a refusal is the decision's `ScaleError`."""

    role: str
    size: int
    cause: str = "dlu scale"
    request_id: str | None = None


@dataclass(frozen=True)
class ResizeDue:
    """The loop's turn: carry the saved resize in flight out (also one a previous PrimeMaster
    began), from its first step (every step is idempotent)."""


@dataclass(frozen=True)
class GrowthDue:
    """The loop's turn: grow elastic roles below their target onto nodes Ray placed. `judging`:
    roles whose actors are gone (their loss is judged by the pass, with what Ray placed)."""

    judging: frozenset[str] = frozenset()


@dataclass(frozen=True)
class LossJudged:
    """Internal: an elastic pass's loss, judged one role at a time on the state the previous
    role's decision left (`roles` still to judge; `placed`: the roles whose placed nodes Ray
    was asked for, with its answer)."""

    observed: PassObserved
    dead: frozenset[str]
    roles: tuple[str, ...]
    now: float
    held: frozenset[str] = frozenset()
    placed: Mapping[str, tuple[int, ...]] = field(default_factory=dict[str, "tuple[int, ...]"])


@dataclass(frozen=True)
class StallObserved:
    """After a quiet pass: what the stall judgement needs. `memory` and `announced` are what the
    previous judgement returned (the reply is the new pair)."""

    memory: StallMemory
    announced: bool
    channels: Mapping[str, ChannelView]
    observations: Mapping[str, ActorObservation]
    steps: Mapping[str, tuple[int, float]]
    beats: Mapping[str, tuple[int, float]]


@dataclass(frozen=True)
class AutoscaleObserved:
    """After a monitoring pass of an auto-scaled job: its roles as the statistics see them (each
    with the sizes whose resize failed), seconds since the last resize or recovery ended, and in
    cluster mode the Brain's plans not carried out yet; and the actors at 90% of their memory
    limit now (`memory`). While the Brain answers (`brain_up`) the job only executes its plans;
    otherwise its own policy decides. The reply is an `autoscale_pass.Outcome`, or None when
    nothing was decided."""

    views: tuple[RoleView, ...]
    quiet_for_s: float
    plans: tuple[RolePlan, ...] = ()
    brain_up: bool = False
    memory: tuple[MemoryView, ...] = ()


Event = (
    PassObserved
    | InPlaceReported
    | RestartRequested
    | StopRequested
    | PrepareRequested
    | StartRequested
    | MasterRebuilt
    | Tick
    | Done
    | RecoveryFailed
    | CarryOn
    | PassApplied
    | ScaleRequested
    | ResizeDue
    | GrowthDue
    | LossJudged
    | StallObserved
    | AutoscaleObserved
)
