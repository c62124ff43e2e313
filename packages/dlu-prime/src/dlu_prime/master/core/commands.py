"""The closed set of commands the decision core asks for, as data. The executor
(`master/executor.py`) runs each one and answers with a `Done` event; nothing here acts.

A command that is one step of a longer recovery says which chain it belongs to (`Purpose`), and
what the chain still has to do after it (`then`: the recoveries of the same pass still waiting,
the stop reason a node relaunch must end with), so the outcome is decided where the chain is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dlu_prime.extension import NodeInfo
from dlu_prime.master.failover import Recovery
from dlu_prime.master.monitor import Failure
from dlu_prime.scheduler.base import ActorObservation


@dataclass(frozen=True)
class InPlaceReport:
    """A SubMaster's rank `agent` failed its training process (see `failover.judge_inplace`)."""

    role: str
    agent: str | None
    message: str
    error: str = ""
    recovered: bool = False
    report_id: str | None = None  # the same on every retry: judged and counted once


class Purpose(StrEnum):
    """Which chain a command is a step of: its outcome is decided there."""

    PREPARE = "prepare"  # INIT -> READY
    START = "start"  # READY -> RUNNING
    FAILOVER = "failover"  # the saved recovery in flight (`state.failover`)
    RESTART_REQUEST = "restart_request"  # a SubMaster asked for actors to be replaced
    SELF_RECOVER = "self_recover"  # a rebuilt PrimeMaster carries on
    STOP = "stop"  # STOPPING -> STOPPED
    RESIZE = "resize"  # the saved resize in flight (`state.resize`)
    ELASTIC_LOSS = "elastic_loss"  # a pass's elastic roles whose nodes may be lost
    GROW = "grow"  # an elastic role below its target, onto nodes Ray placed
    MEMORY = "memory"  # the saved memory relaunch in flight (`state.relaunch`)


@dataclass(frozen=True)
class Then:
    """What a chain does once this step is done: start the waiting recoveries, or stop."""

    recoveries: tuple[Recovery, ...] = ()
    stop: str | None = None


@dataclass(frozen=True)
class PlaceActors:
    """Place and create every actor of the job (placement groups first)."""

    purpose: Purpose = Purpose.PREPARE


@dataclass(frozen=True)
class RunChecks:
    """Self checks of `names`, then the SubMasters' checks. `counted`: actor -> the incarnation
    whose death was counted already (a failed call while Ray still rebuilds it is the same death)."""

    names: tuple[str, ...]
    purpose: Purpose
    counted: Mapping[str, str | None] = field(default_factory=dict[str, "str | None"])
    then: Then = Then()
    wait_s: float = 0.0  # how long to wait for a rebuilt incarnation of an actor that died under them


@dataclass(frozen=True)
class ReplaceActors:
    """Fresh actors for `names`, set up; the outcome's value is their nodes."""

    names: tuple[str, ...]
    purpose: Purpose
    then: Then = Then()


@dataclass(frozen=True)
class StartActors:
    names: tuple[str, ...]
    purpose: Purpose
    then: Then = Then()


@dataclass(frozen=True)
class SubMasterFailover:
    """Tier 2 through the role's SubMaster: it replaces the actors (calling `restart_actors`
    back) and restarts training; bounded by the executor's SubMaster timeout."""

    sub: str
    actors: tuple[str, ...]
    reason: str
    then: Then = Then()
    purpose: Purpose = Purpose.FAILOVER


@dataclass(frozen=True)
class RecoverSubMasters:
    """Tier 5, after the SubMasters were replaced: each sets its role up again to RUNNING."""

    names: tuple[str, ...]
    then: Then = Then()
    purpose: Purpose = Purpose.FAILOVER


@dataclass(frozen=True)
class RelaunchNodes:
    """Tier 4: the Extension replaces these nodes (marked removed, saved, before it runs)."""

    nodes: tuple[NodeInfo, ...]
    then: Then = Then()
    purpose: Purpose = Purpose.FAILOVER


@dataclass(frozen=True)
class FindDeadNodes:
    """Which of these nodes Ray marks dead (a view a decision needs, not an action); then the
    pass's `failures` are judged with it (`gone`: actors its poll found dead or restarting)."""

    nodes: tuple[str, ...]
    failures: tuple[Failure, ...]
    gone: frozenset[str]
    has_extension: bool
    purpose: Purpose = Purpose.FAILOVER


@dataclass(frozen=True)
class FindDeadPeers:
    """Which of a reporting rank's peers are dead: on a node Ray marks dead, or gone in a poll.
    `report` is the rank's report, judged once the answer is in."""

    peers: Mapping[str, str | None]  # actor -> its node
    report: InPlaceReport


@dataclass(frozen=True)
class SeeReplaced:
    """A rebuilt PrimeMaster resuming a saved failover: how the replacements its dead predecessor
    had already placed are now (a view, not an action). One that died since is a new fault, judged
    and counted before the failover goes on; the value is `ReplacedSeen`."""

    names: tuple[str, ...]
    nodes: tuple[str, ...] = ()  # the nodes of the actors it has yet to replace: which Ray marks dead


@dataclass(frozen=True)
class ReplacedSeen:
    """`SeeReplaced`'s answer: each name's poll, whether an Extension can relaunch nodes, and
    which of the nodes asked about Ray marks dead."""

    observations: Mapping[str, ActorObservation]
    has_extension: bool
    dead_nodes: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ForgetLiveness:
    """A job-level restart: what the old actors showed says nothing of the new ones."""


@dataclass(frozen=True)
class AdoptResized:
    """A rebuilt PrimeMaster tells the scheduler about the actors earlier resizes added."""

    ranks: Mapping[str, tuple[tuple[int, ...], int]]  # role -> (ranks, world size)
    purpose: Purpose = Purpose.SELF_RECOVER


@dataclass(frozen=True)
class SetMemory:
    """The memory (bytes) the next incarnations of these actors ask Ray for; their role's own
    amount puts an actor back in its role's bundle."""

    memory: Mapping[str, int]


@dataclass(frozen=True)
class SetSeats:
    """The bundle (`group#index`) of its role's group each named actor's next incarnation sits
    in instead of its planned place or a group of its own (None: no seat any more)."""

    seats: Mapping[str, str | None]


@dataclass(frozen=True)
class StopActors:
    names: tuple[str, ...]
    purpose: Purpose = Purpose.STOP


@dataclass(frozen=True)
class Cleanup:
    """Remove every actor and placement group of the job."""

    purpose: Purpose = Purpose.STOP


@dataclass(frozen=True)
class AskStop:
    """Ask the job's loop to stop (a limit reached on another thread): it stops at its next pass."""

    reason: str
    failed: bool = True


@dataclass(frozen=True)
class Wake:
    """Monitor now instead of at the next tick (a dead peer's failover starts at once)."""


@dataclass(frozen=True)
class KnowActors:
    """Tell the scheduler of a simple role's ranks a resize is adding, before they exist (a
    failover that replaces one of them before the resize runs can)."""

    role: str
    ranks: tuple[int, ...]
    world: int
    purpose: Purpose = Purpose.RESIZE


@dataclass(frozen=True)
class AddActors:
    """Create and set up a resize's new actors (ranks of `role`, at world `world`); the
    outcome's value is their nodes."""

    role: str
    ranks: tuple[int, ...]
    world: int
    purpose: Purpose = Purpose.RESIZE


@dataclass(frozen=True)
class RemoveActors:
    """Stop and remove actors a resize drops (leaving ones, or with `undo` the added ones of a
    resize that failed with that error)."""

    names: tuple[str, ...]
    undo: str | None = None
    purpose: Purpose = Purpose.RESIZE


@dataclass(frozen=True)
class DropActors:
    """Forget actors gone with their node (no stop call: nobody would answer)."""

    names: tuple[str, ...]
    purpose: Purpose = Purpose.RESIZE


@dataclass(frozen=True)
class RemoveNodeGroups:
    """Release the placement groups of an elastic role's leaving nodes."""

    role: str
    nodes: tuple[int, ...]
    purpose: Purpose = Purpose.RESIZE


@dataclass(frozen=True)
class RequeueShards:
    """Hand the shards the removed actors held back to their queues' todo (value: queue -> ids)."""

    queues: tuple[str, ...]
    names: tuple[str, ...]
    purpose: Purpose = Purpose.RESIZE


@dataclass(frozen=True)
class FindPlacedNodes:
    """Which of a role's node indexes Ray placed (waiting up to `wait_s`): a view a decision
    needs. `purpose` says which chain asks; `then` is what that chain judges with the answer
    (the pass's loss judgement, or the roles a growth still looks at)."""

    role: str
    nodes: tuple[int, ...]
    purpose: Purpose
    wait_s: float = 0.0
    then: Any = None


@dataclass(frozen=True)
class AskNodeNeeds:
    """What one node of `role` needs against what the cluster has free (for a stop's reason)."""

    role: str
    culprit: str
    message: str
    stop: str
    forgiven: int = 0
    purpose: Purpose = Purpose.ELASTIC_LOSS


@dataclass(frozen=True)
class FindLostNodes:
    """Which Ray nodes of an elastic pass's gone actors Ray marks dead; then the loss is judged."""

    nodes: tuple[str, ...]
    then: Any
    purpose: Purpose = Purpose.ELASTIC_LOSS


@dataclass(frozen=True)
class CheckNodes:
    """The role's SubMaster checks the new nodes' ranks. The SubMaster must be its set-up
    incarnation: one dead or being rebuilt fails it with `SubMasterAway` (the resize waits)."""

    sub: str
    ranks: tuple[int, ...]
    timeout_s: float
    purpose: Purpose = Purpose.RESIZE


@dataclass(frozen=True)
class ReformTraining:
    """The role's SubMaster re-forms training at `ranks` (the `added` ones joining) and waits up
    to `reform_s` for the round at the new world; the value is that world (None: not re-formed).
    `SubMasterAway` as for `CheckNodes`."""

    sub: str
    ranks: tuple[int, ...]
    added: tuple[int, ...]
    reform_s: float
    timeout_s: float
    purpose: Purpose = Purpose.RESIZE


Command = (
    PlaceActors
    | RunChecks
    | ReplaceActors
    | StartActors
    | SubMasterFailover
    | RecoverSubMasters
    | RelaunchNodes
    | FindDeadNodes
    | FindDeadPeers
    | SeeReplaced
    | ForgetLiveness
    | AdoptResized
    | SetMemory
    | SetSeats
    | StopActors
    | Cleanup
    | AskStop
    | Wake
    | KnowActors
    | AddActors
    | RemoveActors
    | DropActors
    | RemoveNodeGroups
    | RequeueShards
    | FindPlacedNodes
    | AskNodeNeeds
    | FindLostNodes
    | CheckNodes
    | ReformTraining
)
