"""The ElasticMaster's process makes full garbage collections rarer, never more frequent."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from dlu_elastic.rendezvous.gc_policy import YOUNG_COLLECTIONS_PER_FULL, defer_full_collections

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def restore_thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def test_full_collections_are_deferred_and_the_younger_thresholds_kept() -> None:
    gc.set_threshold(700, 10, 10)  # CPython's defaults
    defer_full_collections()
    assert gc.get_threshold() == (700, 10, YOUNG_COLLECTIONS_PER_FULL)


def test_a_rarer_setting_already_there_is_kept() -> None:
    gc.set_threshold(1000, 20, 5 * YOUNG_COLLECTIONS_PER_FULL)
    defer_full_collections()
    assert gc.get_threshold() == (1000, 20, 5 * YOUNG_COLLECTIONS_PER_FULL)
