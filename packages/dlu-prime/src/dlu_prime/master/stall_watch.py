"""The PrimeMaster's side of stall detection: it asks the job's data channels how they stand
(at most every few seconds), keeps the stall memory between passes, and records what the pure
judgement decides (`core/stall_notice.py`: a "stalled" or "progress_resumed" event)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from dlu_api.status import JobStage
from dlu_prime.master.core.events import Event, StallObserved
from dlu_prime.master.liveness import Liveness
from dlu_prime.master.stall import ChannelView, StallMemory
from dlu_prime.master.state import JobState
from dlu_prime.scheduler.base import ActorObservation

logger = logging.getLogger(__name__)

CHANNEL_POLL_S = 5.0
"""Channels are asked at most this often (and at most a quarter of the stall timeout)."""

CHANNEL_CALL_S = 5.0
"""How long one poll of the channels may take; a channel that does not answer keeps its last view."""


def poll_channels(
    state_channels: Mapping[str, Any], known: Mapping[str, ChannelView]
) -> dict[str, ChannelView]:
    """Each data channel's `watch()` answer, asked of all at once (Ray only when there are any)."""
    names = {name: record.actor_name for name, record in state_channels.items() if record.kind == "channel"}
    if not names:
        return {}
    import ray

    from dlu_prime.naming import NAMESPACE

    out = {name: known[name] for name in names if name in known}
    refs: dict[Any, str] = {}
    for name, actor_name in names.items():
        try:
            actor: Any = ray.get_actor(actor_name, namespace=NAMESPACE)  # pyright: ignore[reportUnknownMemberType]
            refs[actor.watch.remote()] = name
        except Exception as exc:  # removed, or being rebuilt by Ray: keep its last view
            logger.debug("channel %s not watched: %s", name, exc)
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=CHANNEL_CALL_S)  # pyright: ignore[reportUnknownMemberType]
    for ref in ready:
        try:
            out[refs[ref]] = ChannelView.from_watch(refs[ref], ray.get(ref))  # pyright: ignore[reportUnknownMemberType]
        except Exception as exc:
            logger.debug("channel %s not watched: %s", refs[ref], exc)
    return out


class StallWatch:
    """One per PrimeMaster; `check` runs once per quiet monitoring pass. It keeps what the
    judgement needs between passes (its memory, the channels' last views); the core judges."""

    def __init__(self) -> None:
        self.memory = StallMemory()
        self.channels: dict[str, ChannelView] = {}
        self._polled_at: float | None = None
        self._announced = False  # the stall judged now was named in a "stalled" event

    def check(
        self,
        state: JobState,
        live: Liveness,
        handle: Callable[[Event], Any],
        observations: Mapping[str, ActorObservation],
        now: float,
    ) -> None:
        timeout = state.spec.health.stall_timeout_s
        if timeout is None or state.stage is not JobStage.RUNNING:
            self.memory = StallMemory()
            self._announced = False
            return
        every = min(CHANNEL_POLL_S, timeout / 4)
        # Due to be reported: the channels are asked now, so a stall is never named from an old view.
        due = (
            not self.memory.reported and self.memory.marks is not None and now - self.memory.since >= timeout
        )
        if state.channels and (due or self._polled_at is None or now - self._polled_at >= every):
            self._polled_at = now
            self.channels = poll_channels(state.channels, self.channels)
        event = StallObserved(
            self.memory, self._announced, self.channels, observations, live.steps, live.beats
        )
        self.memory, self._announced = handle(event)
