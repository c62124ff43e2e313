"""A local job's owner answers requests from other terminals off its polling loop (issue 27
defect 6: a `dlu scale` answered on the loop froze the job's status file until the resize ended)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dlu_prime.job_files import JobFiles

pytestmark = pytest.mark.timeout(30)


def test_a_slow_request_is_answered_in_the_background_and_taken_once(tmp_path: Path) -> None:
    files = JobFiles(tmp_path)
    release = threading.Event()
    handled: list[dict[str, Any]] = []

    def handle(request: dict[str, Any]) -> dict[str, Any]:
        handled.append(request)
        release.wait(20)
        return {"result": "scaled"}

    answers: list[dict[str, Any]] = []
    asker = threading.Thread(
        target=lambda: answers.append(files.ask("job", {"action": "scale"}, timeout_s=25))
    )
    asker.start()
    with ThreadPoolExecutor(max_workers=2) as pool:
        while not handled:
            files.serve("job", handle, pool.submit)  # returns at once, request or not
        for _ in range(5):
            files.serve("job", handle, pool.submit)  # the request in flight is not taken again
        assert asker.is_alive() and len(handled) == 1
        release.set()
    asker.join(20)
    assert answers == [{"result": "scaled"}] and len(handled) == 1
