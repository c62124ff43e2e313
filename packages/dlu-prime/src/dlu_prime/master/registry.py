"""What a job's actors find through the PrimeMaster: endpoints SubMasters publish (a restarted
worker finds a restarted SubMaster) and the data channels and shard queues of the job. Both are
saved with the state, through the manager's one apply."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlu_prime.master.changes import ChannelRegistered, EndpointPublished

if TYPE_CHECKING:
    from dlu_prime.master.manager import PrimeManager


class Registry:
    def __init__(self, manager: PrimeManager) -> None:
        self._manager = manager

    def register_channel(self, name: str, kind: str, actor_name: str) -> None:
        if name not in self._manager.state.channels:
            self._manager.apply(ChannelRegistered(name, kind, actor_name))

    def publish(self, key: str, value: dict[str, str]) -> None:
        if self._manager.state.endpoints.get(key) != value:
            self._manager.apply(EndpointPublished(key, dict(value)))

    def lookup(self, key: str) -> dict[str, str] | None:
        with self._manager.lock:
            found = self._manager.state.endpoints.get(key)
            return dict(found) if found is not None else None
