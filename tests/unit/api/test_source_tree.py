"""Sources are parsed one at a time: CPython 3.11's parser state is per interpreter (see
dlu_api.source_tree). The lock is checked, not the race, which is too rare to provoke."""

from __future__ import annotations

import threading

import pytest

from dlu_api import source_tree


def test_a_parse_waits_for_the_one_in_progress() -> None:
    source_tree._PARSE.acquire()  # a parse in progress in another thread
    done = threading.Event()
    thread = threading.Thread(target=lambda: (source_tree.parse_source("x = 1"), done.set()), daemon=True)
    thread.start()
    try:
        assert not done.wait(0.3)
    finally:
        source_tree._PARSE.release()
    assert done.wait(30)


def test_parse_errors_pass_through_and_free_the_lock() -> None:
    with pytest.raises(SyntaxError):
        source_tree.parse_source("def (", "bad.py")
    assert not source_tree._PARSE.locked()
    assert source_tree.parse_source("y = 2").body
