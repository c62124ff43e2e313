"""A job submitted from inside one of its own processes is refused before anything starts
(the module an entrypoint names starts the job at import); any other submission goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlu_api.client.base import ACTOR_ENV, JOB_ENV, refuse_self_submission
from dlu_api.errors import JobNameTakenError, SubmittedFromItselfError
from dlu_api.spec import spec_from_dict


def test_inside_an_actor_of_the_same_job_the_submission_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JOB_ENV, "lm")
    monkeypatch.setenv(ACTOR_ENV, "lm.trainer.0")
    with pytest.raises(
        SubmittedFromItselfError, match=r'lm\.trainer\.0.*if __name__ == "__main__":'
    ) as caught:
        refuse_self_submission("lm")
    assert isinstance(caught.value, JobNameTakenError)  # callers that catch a taken name still do


def test_another_job_or_a_process_of_no_job_submits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JOB_ENV, "lm")
    monkeypatch.setenv(ACTOR_ENV, "lm.trainer.0")
    refuse_self_submission("eval")  # a role that starts another job may
    monkeypatch.delenv(ACTOR_ENV)
    refuse_self_submission("lm")  # DLU_JOB alone (a user's shell) is no actor
    monkeypatch.delenv(JOB_ENV)
    refuse_self_submission("lm")


def test_the_local_client_refuses_before_any_lock_or_ray(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from dlu_prime.local import LocalJobClient

    monkeypatch.setenv("DLU_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(JOB_ENV, "lm")
    monkeypatch.setenv(ACTOR_ENV, "lm.worker.0")
    spec = spec_from_dict(
        {
            "name": "lm",
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [{"name": "worker", "entrypoint": "nowhere:work"}],
        }
    )
    with pytest.raises(SubmittedFromItselfError):
        LocalJobClient().submit(spec)
    assert not list(tmp_path.glob("home/**/*.lock")), list(tmp_path.glob("home/**/*"))
