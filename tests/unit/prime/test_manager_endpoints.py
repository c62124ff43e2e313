"""Endpoints that SubMasters publish are saved, so a reconstructed PrimeMaster still knows them."""

from __future__ import annotations

from typing import Any

from dlu_prime.master.state import JobState


def test_published_endpoint_is_saved_and_found(make_manager: Any, store: Any) -> None:
    manager, _ = make_manager()
    manager.registry.publish("trainer", {"address": "127.0.0.1:5000", "token": "t"})
    assert manager.registry.lookup("trainer") == {"address": "127.0.0.1:5000", "token": "t"}
    assert manager.registry.lookup("nobody") is None
    stored = store.get(manager.state.job)
    assert stored is not None
    assert JobState.loads(stored.data).endpoints["trainer"]["address"] == "127.0.0.1:5000"


def test_republishing_the_same_endpoint_does_not_write(make_manager: Any, store: Any) -> None:
    manager, _ = make_manager()
    manager.registry.publish("trainer", {"address": "a"})
    token = manager.token
    manager.registry.publish("trainer", {"address": "a"})
    assert manager.token == token
    manager.registry.publish("trainer", {"address": "b"})
    assert manager.token == token + 1
