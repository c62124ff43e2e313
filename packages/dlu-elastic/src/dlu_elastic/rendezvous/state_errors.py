"""The refusals the rendezvous state raises, and the id check every request goes through.

Free of gRPC like `state`: the gRPC layer (`service`) maps each refusal to a status code.
"""

from __future__ import annotations

MAX_ID_LENGTH = 256  # agent, node and host names; longer is garbage, not an id


class RendezvousStateError(Exception):
    """Base of the refusals the rendezvous raises; the gRPC layer maps each to a status code."""


class InvalidRequestError(RendezvousStateError, ValueError):
    """A malformed agent description or request (INVALID_ARGUMENT)."""


class StaleRoundError(RendezvousStateError):
    """A request names a round that is not the current one (FAILED_PRECONDITION)."""

    def __init__(self, requested: int, current: int) -> None:
        super().__init__(
            f"round {requested} is not the current rendezvous round {current}; join the rendezvous again"
        )
        self.requested = requested
        self.current = current


class NotMemberError(RendezvousStateError):
    """An agent asks about a round it did not join (FAILED_PRECONDITION)."""

    def __init__(self, agent_id: str, round_: int) -> None:
        super().__init__(f"agent {agent_id!r} is not a member of rendezvous round {round_}; join it first")
        self.agent_id = agent_id
        self.round = round_


def check_id(name: str, value: str) -> None:
    """Ids must be non-empty and of sane length: they key maps and sort ranks."""
    if not value:
        raise InvalidRequestError(f"{name} is empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidRequestError(f"{name} is {len(value)} characters long; the limit is {MAX_ID_LENGTH}")
