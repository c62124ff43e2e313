"""`Job` and `JobHandle`: validation at construction, loading from files, run/submit via a client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import dlu_api.job
from dlu_api import Job, JobHandle
from dlu_api.client import JobClient, StatusCallback
from dlu_api.errors import SpecError
from dlu_api.spec.models import JobSpec
from dlu_api.status import JobStage, JobStatus, JobSummary

SPEC_DATA: dict[str, Any] = {
    "name": "demo",
    "device_type": "CPU",
    "device_per_node": 0,
    "roles": [{"name": "worker", "entrypoint": "pkg.mod:main", "total": 2}],
}

STATUSES = [
    JobStatus(name="demo", stage=JobStage.INIT),
    JobStatus(name="demo", stage=JobStage.RUNNING),
    JobStatus(name="demo", stage=JobStage.STOPPED, exit_code=0, reason="done"),
]


class FakeClient(JobClient):
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.quiet: list[bool] = []
        self.interrupts = 0  # how many waits a Ctrl-C ends

    def submit(self, spec: JobSpec) -> str:
        self.calls.append(("submit", spec))
        return spec.name

    def resume(self, spec: JobSpec) -> str:
        self.calls.append(("resume", spec))
        return spec.name

    def wait(self, name: str, on_update: StatusCallback | None = None) -> JobStatus:
        self.calls.append(("wait", name))
        if self.interrupts:
            self.interrupts -= 1
            raise KeyboardInterrupt
        for status in STATUSES:
            if on_update is not None:
                on_update(status)
        return STATUSES[-1]

    def status(self, name: str) -> JobStatus:
        self.calls.append(("status", name))
        return STATUSES[1]

    def stop(self, name: str) -> None:
        self.calls.append(("stop", name))

    def logs(
        self, name: str, follow: bool = False, role: str | None = None, rank: int | None = None
    ) -> Iterator[str]:
        self.calls.append(("logs", (name, follow)))
        return iter(["a line"])

    def list_jobs(self) -> list[JobSummary]:
        return []

    def scale(self, name: str, role: str, size: int) -> dict[str, object]:
        self.calls.append(("scale", (name, role, size)))
        return {"role": role, "new_size": size, "done": True}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeClient, list[str | None]]:
    client = FakeClient()
    addresses: list[str | None] = []

    def connect(address: str | None = None, workdir: str | None = None, quiet: bool = False) -> JobClient:
        addresses.append(address)
        client.quiet.append(quiet)
        return client

    monkeypatch.setattr(dlu_api.job, "connect", connect)
    return client, addresses


def test_valid_spec_is_kept() -> None:
    spec = JobSpec.model_validate(SPEC_DATA)
    assert Job(spec).spec is spec


def test_invalid_spec_is_refused_at_construction() -> None:
    # model_validate checks shapes only; the cross-field rules run in Job's constructor
    spec = JobSpec.model_validate(
        {
            **SPEC_DATA,
            "roles": [
                {"name": "worker", "entrypoint": "pkg.mod:main", "total": 0},
                {"name": "worker", "entrypoint": "pkg.mod:main"},
            ],
        }
    )
    with pytest.raises(SpecError) as info:
        Job(spec)
    fields = [p.field for p in info.value.problems]
    assert "roles[worker].total" in fields
    assert len(info.value.problems) >= 2  # every problem, not only the first


def test_invalid_spec_never_reaches_a_client(
    fake: tuple[FakeClient, list[str | None]],
) -> None:
    client, addresses = fake
    spec = JobSpec.model_validate(
        {**SPEC_DATA, "roles": [{"name": "worker", "entrypoint": "pkg.mod:main", "total": 0}]}
    )
    with pytest.raises(SpecError):
        Job(spec).run()
    assert client.calls == []
    assert addresses == []


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_from_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"spec{suffix}"
    path.write_text(json.dumps(SPEC_DATA) if suffix == ".json" else yaml.safe_dump(SPEC_DATA))
    job = Job.from_file(path)
    assert job.spec == JobSpec.model_validate(SPEC_DATA)
    assert Job.from_file(str(path)).spec == job.spec


def test_from_file_with_an_invalid_spec(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**SPEC_DATA, "name": "Bad Name"}))
    with pytest.raises(SpecError) as info:
        Job.from_file(path)
    assert [p.field for p in info.value.problems] == ["name"]


def test_from_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        Job.from_file(tmp_path / "missing.yaml")


def test_run_returns_the_final_status(fake: tuple[FakeClient, list[str | None]]) -> None:
    client, addresses = fake
    job = Job(JobSpec.model_validate(SPEC_DATA))
    seen: list[JobStatus] = []
    final = job.run("http://head:8265", on_update=seen.append)
    assert final == STATUSES[-1]
    assert final.exit_code == 0
    assert seen == STATUSES
    assert addresses == ["http://head:8265"]
    assert client.calls == [("submit", job.spec), ("wait", "demo")]


def test_run_locally_by_default(fake: tuple[FakeClient, list[str | None]]) -> None:
    _, addresses = fake
    assert Job(JobSpec.model_validate(SPEC_DATA)).run().stage is JobStage.STOPPED
    assert addresses == [None]


def test_submit_returns_a_handle_bound_to_the_client(
    fake: tuple[FakeClient, list[str | None]],
) -> None:
    client, _ = fake
    handle = Job(JobSpec.model_validate(SPEC_DATA)).submit()
    assert isinstance(handle, JobHandle)
    assert handle.name == "demo"
    assert handle.client is client
    assert [c[0] for c in client.calls] == ["submit"]  # submit does not wait

    assert handle.status() == STATUSES[1]
    assert list(handle.logs(follow=True)) == ["a line"]
    handle.stop()
    assert handle.wait() == STATUSES[-1]
    assert client.calls[1:] == [
        ("status", "demo"),
        ("logs", ("demo", True)),
        ("stop", "demo"),
        ("wait", "demo"),
    ]


def test_scale_goes_to_the_jobs_client_by_name(fake: tuple[FakeClient, list[str | None]]) -> None:
    client, addresses = fake
    job = Job(JobSpec.model_validate(SPEC_DATA))
    assert job.scale("worker", 3, address="http://head:8265")["new_size"] == 3
    assert addresses == ["http://head:8265"]
    handle = job.submit()
    handle.scale("worker", 1)
    assert [c for c in client.calls if c[0] == "scale"] == [
        ("scale", ("demo", "worker", 3)),
        ("scale", ("demo", "worker", 1)),
    ]


def spec() -> JobSpec:
    return JobSpec.model_validate(SPEC_DATA)


def test_run_is_quiet_unless_verbose(
    fake: tuple[FakeClient, list[str | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _ = fake
    monkeypatch.delenv("DLU_VERBOSE", raising=False)
    Job(spec()).run()
    Job(spec()).run(verbose=True)
    monkeypatch.setenv("DLU_VERBOSE", "1")
    Job(spec()).run()
    assert client.quiet == [True, False, False]


def test_ctrl_c_in_run_stops_the_job_then_raises(fake: tuple[FakeClient, list[str | None]]) -> None:
    client, _ = fake
    client.interrupts = 1
    with pytest.raises(KeyboardInterrupt):
        Job(spec()).run()
    name = spec().name
    assert [c for c in client.calls if c[0] != "submit"] == [("wait", name), ("stop", name), ("wait", name)]
