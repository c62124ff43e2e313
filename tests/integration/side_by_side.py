"""Independent checks of one module run side by side in threads (their time is mostly waits,
which the others fill); each test then raises what its own check raised."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

Outcomes = dict[str, BaseException | None]


def run_checks(
    checks: Mapping[str, Callable[[Path], None]], tmp_path_factory: pytest.TempPathFactory, at_once: int
) -> Outcomes:
    """Run every check, `at_once` at a time, each with a temporary folder named after it."""
    with ThreadPoolExecutor(at_once) as pool:
        running = {name: pool.submit(check, tmp_path_factory.mktemp(name)) for name, check in checks.items()}
        return {name: future.exception() for name, future in running.items()}


def outcome(results: Outcomes, name: str) -> None:
    """Raise what the check `name` raised, if anything."""
    error = results[name]
    if error is not None:
        raise error
