"""The shared words live in one module at the bottom of the layering; the stored strings are
unchanged, every failure kind is an event kind, and a misspelt kind is refused."""

from __future__ import annotations

import json

import pytest

from dlu_api.vocabulary import (
    FAILURE_EVENTS,
    RECOVERED_EVENTS,
    RECOVERY_EVENTS,
    RECOVERY_OPENERS,
    ActorStage,
    EventKind,
    FailureKind,
    InPlaceVerdict,
    Tier,
)

pytestmark = pytest.mark.timeout(30)


def test_stored_strings_are_unchanged() -> None:
    assert json.dumps([ActorStage.RUNNING, Tier.SUB_MASTER, EventKind.INPLACE_RESTART]) == (
        '["RUNNING", "sub_master", "inplace_restart"]'
    )
    assert InPlaceVerdict("join") is InPlaceVerdict.JOIN


def test_every_failure_kind_is_an_event_kind_and_every_set_holds_event_kinds() -> None:
    assert {EventKind(k.value) for k in FailureKind} <= set(EventKind)
    for kinds in (FAILURE_EVENTS, RECOVERY_OPENERS, RECOVERED_EVENTS, RECOVERY_EVENTS):
        assert all(EventKind(k) for k in kinds)


def test_a_misspelt_kind_is_refused_where_it_enters() -> None:
    with pytest.raises(ValueError, match="node_chek"):
        EventKind("node_chek")
