"""A `dlu scale` of a local job from another terminal waits for its answer as long as the job's
state shows the resize in flight, not a fixed 60 s, which a long scale plus a PrimeMaster rebuilt
meanwhile can outlast (the owner's scale_job itself waits up to SCALE_WAIT_S + MASTER_REBUILD_S).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dlu_api.errors import JobNotFoundError
from dlu_api.status import JobEvent, JobStage, JobStatus
from dlu_prime import job_files
from dlu_prime.job_files import JobFiles
from dlu_prime.local_records import resize_in_flight

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def quick_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_files, "FOLLOW_CHECK_S", 0.02)
    monkeypatch.setattr(job_files, "FOLLOW_GRACE_S", 5.0)


def test_a_taken_request_is_waited_for_past_its_timeout_while_its_resize_is_in_flight(
    tmp_path: Path,
) -> None:
    files = JobFiles(tmp_path)
    followed = threading.Semaphore(0)
    ended = threading.Event()

    def resizing() -> bool:
        followed.release()  # asked only once the asker's own timeout has passed
        return not ended.is_set()

    def handle(request: dict[str, Any]) -> dict[str, Any]:
        for _ in range(3):  # the asker is past its 0.2 s and still waiting
            assert followed.acquire(timeout=20)
        ended.set()  # the resize ends; its answer follows a moment later
        return {"result": {"new_size": 2}}

    answers: list[dict[str, Any]] = []
    asker = threading.Thread(
        target=lambda: answers.append(files.ask("job", {"action": "scale"}, 0.2, in_progress=resizing))
    )
    asker.start()
    with ThreadPoolExecutor(max_workers=1) as pool:
        while asker.is_alive() and not answers:
            files.serve("job", handle, pool.submit)
            asker.join(0.05)
    assert answers == [{"result": {"new_size": 2}}]


def test_a_request_nobody_took_is_not_followed(tmp_path: Path) -> None:
    """The owner is gone or not serving: the state's resize says nothing of this request."""
    with pytest.raises(JobNotFoundError, match="did not answer"):
        JobFiles(tmp_path).ask("job", {"action": "scale"}, 0.1, in_progress=lambda: True)


def test_a_taken_request_whose_resize_ended_without_an_answer_gives_up(tmp_path: Path) -> None:
    files = JobFiles(tmp_path)
    release = threading.Event()
    asked: list[bool] = []

    def ended() -> bool:
        asked.append(False)
        return False

    with ThreadPoolExecutor(max_workers=1) as pool:
        asking = pool.submit(files.ask, "job", {"action": "scale"}, 2.0, ended)
        while not asking.done():  # taken at once, never answered
            files.serve("job", lambda _: {"result": release.wait(30)}, in_background)
            time.sleep(0.01)
        release.set()
        with pytest.raises(JobNotFoundError):
            asking.result()
    assert asked == [False]  # looked once past its timeout, then gave up


def in_background(work: Any) -> None:
    threading.Thread(target=work, daemon=True).start()


def event(kind: str, role: str | None = "trainer") -> JobEvent:
    return JobEvent(time=0.0, kind=kind, message="", role=role)


def status(*events: JobEvent, stage: JobStage = JobStage.RUNNING) -> JobStatus:
    return JobStatus(name="job", stage=stage, events=list(events))


def test_a_resize_is_in_flight_from_its_start_to_its_end() -> None:
    assert not resize_in_flight(status(), "trainer")
    assert resize_in_flight(status(event("resize_started")), "trainer")
    assert resize_in_flight(status(event("resize_started"), event("failover_done", None)), "trainer")
    assert resize_in_flight(status(event("resize_started"), event("resize_started", "reward")), "trainer")
    assert not resize_in_flight(status(event("resize_started"), event("resize_done")), "trainer")
    assert not resize_in_flight(status(event("resize_started"), event("resize_failed")), "trainer")
    assert not resize_in_flight(status(event("resize_started")), "reward")
    assert not resize_in_flight(status(event("resize_started"), stage=JobStage.STOPPED), "trainer")
