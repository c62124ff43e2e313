"""The `dlu` CLI, driven by typer's CliRunner against an in-memory JobClient."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import dlu_api.cli
from dlu_api.cli import app
from dlu_api.cli.gpu import gpu_visible
from dlu_api.cli.render import ProgressPrinter
from dlu_api.client import JobClient, StatusCallback
from dlu_api.errors import DLUError, JobNotFoundError
from dlu_api.spec.models import DeviceType, JobSpec, RoleKind
from dlu_api.spec.rules import ensure_valid
from dlu_api.status import ActorStatus, JobEvent, JobStage, JobStatus, JobSummary, RoleStatus

SPEC_DATA: dict[str, Any] = {
    "name": "demo",
    "device_type": "CPU",
    "device_per_node": 0,
    "roles": [{"name": "worker", "entrypoint": "pkg.mod:main", "total": 2}],
}

runner = CliRunner()


def event(t: float, kind: str, message: str, role: str | None = None) -> JobEvent:
    return JobEvent(time=t, kind=kind, message=message, role=role)


def worker_role(stage: str, restarts: int = 0) -> RoleStatus:
    return RoleStatus(
        name="worker",
        kind="simple",
        restart_count=restarts,
        actors=[ActorStatus(name=f"worker-{i}", role="worker", rank=i, stage=stage) for i in (0, 1)],
    )


def script(name: str, exit_code: int) -> list[JobStatus]:
    """A job's life as the client reports it: INIT, RUNNING (twice, unchanged), STOPPED."""
    e1 = event(100.0, "JOB_STARTED", "job accepted")
    e2 = event(101.5, "ROLE_RUNNING", "all 2 actors up", role="worker")
    e3 = event(109.0, "JOB_STOPPED", f"exit code {exit_code}")
    running = JobStatus(name=name, stage=JobStage.RUNNING, roles=[worker_role("RUNNING")], events=[e1, e2])
    return [
        JobStatus(name=name, stage=JobStage.INIT, events=[e1]),
        running,
        running.model_copy(),
        JobStatus(
            name=name,
            stage=JobStage.STOPPED,
            exit_code=exit_code,
            reason="finished" if exit_code == 0 else "worker failed",
            roles=[worker_role("STOPPED")],
            events=[e1, e2, e3],
        ),
    ]


class FakeClient(JobClient):
    """In memory: records calls, replays a scripted status sequence to `wait`'s callback."""

    def __init__(self, statuses: list[JobStatus] | None = None) -> None:
        self.statuses = statuses or script("demo", 0)
        self.submitted: list[JobSpec] = []
        self.calls: list[tuple[str, Any]] = []
        self.addresses: list[str | None] = []  # what `connect` was given, per call
        self.connected_for: list[JobSpec | None] = []  # the job `connect` was told is coming
        self.quiet: list[bool] = []  # whether `connect` was asked for a quiet embedded Ray

    def submit(self, spec: JobSpec) -> str:
        ensure_valid(spec)
        self.submitted.append(spec)
        self.calls.append(("submit", spec.name))
        return spec.name

    def resume(self, spec: JobSpec) -> str:
        ensure_valid(spec)
        self.submitted.append(spec)
        self.calls.append(("resume", spec.name))
        return spec.name

    def wait(self, name: str, on_update: StatusCallback | None = None) -> JobStatus:
        self.calls.append(("wait", name))
        for status in self.statuses:
            if on_update is not None:
                on_update(status)
        return self.statuses[-1]

    def status(self, name: str) -> JobStatus:
        self.calls.append(("status", name))
        if name == "ghost":
            raise JobNotFoundError("no job named 'ghost'")
        return self.statuses[-1].model_copy(update={"name": name})

    def stop(self, name: str) -> None:
        self.calls.append(("stop", name))

    def logs(
        self, name: str, follow: bool = False, role: str | None = None, rank: int | None = None
    ) -> Iterator[str]:
        self.calls.append(("logs", (name, follow, role, rank)))
        yield from ["first line", "second line"]

    def timeline(self, name: str, follow: bool = False) -> Iterator[str]:
        self.calls.append(("timeline", (name, follow)))
        yield from ["10:00:00 job_created job x created"]

    def scale(self, name: str, role: str, size: int) -> dict[str, object]:
        self.calls.append(("scale", (name, role, size)))
        if role == "nope":
            raise DLUError(f"dlu scale {name} {role} {size}: job {name} has no role 'nope'")
        message = f"resize 2 -> {size} (dlu scale) done in 1.00s"
        return {
            "role": role,
            "old_size": 2,
            "new_size": size,
            "done": True,
            "failed": False,
            "message": message,
        }

    def list_jobs(self) -> list[JobSummary]:
        self.calls.append(("list", None))
        return [
            JobSummary(name="newer", stage=JobStage.RUNNING, where="local"),
            JobSummary(name="older", stage=JobStage.STOPPED, exit_code=3, where="local"),
        ]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    client = FakeClient()

    def connect(
        address: str | None = None,
        workdir: str | None = None,
        spec: JobSpec | None = None,
        quiet: bool = False,
    ) -> JobClient:
        client.addresses.append(address)
        client.connected_for.append(spec)
        client.quiet.append(quiet)
        return client

    monkeypatch.delenv("DLU_ADDRESS", raising=False)
    monkeypatch.setattr(dlu_api.cli, "connect", connect)  # run, resume, submit
    monkeypatch.setattr(dlu_api.cli.job_commands, "connect_existing", connect)  # status, logs, stop, ...
    return client


def write_spec(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


# --- help, schema, validate -----------------------------------------------------------------


def test_help_lists_every_command() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    # the first word of each row of the "Commands:" section (two spaces in, plain text)
    section = result.output.split("Commands:", 1)[1]
    listed = [line.split()[0] for line in section.splitlines() if line.startswith("  ") and line.strip()]
    for command in ("run", "submit", "status", "stop", "logs", "list", "validate", "schema"):
        assert command in listed, result.output


def test_schema_to_stdout_and_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.stdout)
    assert schema["title"] == "JobSpec"
    assert "roles" in schema["properties"]

    out = tmp_path / "schema.json"
    result = runner.invoke(app, ["schema", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text()) == schema


def test_validate_good_spec(tmp_path: Path) -> None:
    good = write_spec(tmp_path / "good.yaml", SPEC_DATA)
    result = runner.invoke(app, ["validate", str(good)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"{good}: ok"


def test_validate_bad_specs_prints_every_problem_of_every_file(tmp_path: Path) -> None:
    # Shape problems (pydantic) in one file...
    bad = write_spec(
        tmp_path / "bad.yaml",
        {
            "name": "Bad Name",
            "device_type": "TPU",
            "roles": [{"name": "worker", "entrypoint": "pkg.mod:main", "bogus": 1}],
        },
    )
    # ...rule problems (across fields) in the other.
    other = write_spec(
        tmp_path / "other_bad.yaml",
        {
            **SPEC_DATA,
            "roles": [
                {"name": "worker", "entrypoint": "pkg.mod:main", "total": 0},
                {"name": "worker", "entrypoint": "pkg.mod:main", "is_driver": False},
            ],
        },
    )
    good = write_spec(tmp_path / "good.yaml", SPEC_DATA)
    result = runner.invoke(app, ["validate", str(bad), str(good), str(other)])
    assert result.exit_code == 1, result.output
    out = result.output

    assert f"{bad}: 3 problem(s)" in out
    assert "  - name:" in out
    assert "  - device_type:" in out
    assert "  - roles[worker].bogus:" in out
    assert f"{good}: ok" in out
    assert f"{other}: 2 problem(s)" in out
    other_section = out.split(f"{other}: ", 1)[1]
    assert "  - roles[worker]: 2 roles are named 'worker'." in other_section
    assert "  - roles[worker].total: must be >= 1, got 0." in other_section
    # every problem line names its fix
    problem_lines = [line for line in out.splitlines() if line.startswith("  - ")]
    assert len(problem_lines) >= 5
    assert all("Fix:" in line for line in problem_lines)


def test_validate_missing_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 1
    assert "cannot read" in result.output


# --- submit ---------------------------------------------------------------------------------


def test_submit_without_address_is_a_usage_error(fake: FakeClient, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "spec.yaml", SPEC_DATA)
    result = runner.invoke(app, ["submit", str(spec)])
    assert result.exit_code == 2
    assert "--address" in result.output
    assert fake.calls == []


def test_submit_with_address(fake: FakeClient, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "spec.yaml", SPEC_DATA)
    result = runner.invoke(app, ["submit", str(spec), "--address", "http://head:8265", "--name", "other"])
    assert result.exit_code == 0, result.output
    assert fake.addresses == ["http://head:8265"]
    assert fake.submitted[0].name == "other"
    assert "submitted other to http://head:8265" in result.output
    for hint in ("events -f", "logs -f", "status", "stop"):  # each hint copies as it is printed
        assert f"`dlu {hint} other --address http://head:8265`" in result.output
    assert ("wait", "other") not in fake.calls


def test_submit_address_from_environment(
    fake: FakeClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLU_ADDRESS", "http://env-head:8265")
    spec = write_spec(tmp_path / "spec.yaml", SPEC_DATA)
    result = runner.invoke(app, ["submit", str(spec)])
    assert result.exit_code == 0, result.output
    assert fake.addresses == ["http://env-head:8265"]


# --- run ------------------------------------------------------------------------------------


def test_a_local_torchrun_command_defaults_to_cpu_without_a_gpu(
    fake: FakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dlu_api.cli.gpu.gpu_visible", lambda: False)
    monkeypatch.delenv("DLU_ADDRESS", raising=False)
    result = runner.invoke(app, ["run", "--", "torchrun", "--nnodes=2", "--nproc-per-node=2", "train.py"])
    assert result.exit_code == 0, result.output
    assert fake.submitted[0].device_type is DeviceType.CPU


def test_gpu_visible_reads_device_files_and_cuda_visible_devices(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    assert not gpu_visible({}, tmp_path)
    (tmp_path / "dev" / "nvidia0").touch()
    assert gpu_visible({}, tmp_path)
    assert not gpu_visible({"CUDA_VISIBLE_DEVICES": ""}, tmp_path)
    assert gpu_visible({"CUDA_VISIBLE_DEVICES": "0"}, tmp_path)


def test_run_torchrun_command(fake: FakeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dlu_api.cli.gpu.gpu_visible", lambda: True)
    result = runner.invoke(app, ["run", "--", "torchrun", "--nnodes=2", "--nproc-per-node=2", "train.py"])
    assert result.exit_code == 0, result.output
    (spec,) = fake.submitted
    assert spec.device_type is DeviceType.GPU
    (role,) = spec.roles
    assert role.kind is RoleKind.ELASTIC
    assert role.entrypoint == "train.py"
    assert role.elastic is not None
    assert role.elastic.nnodes == "2"
    assert role.elastic.nproc_per_node == 2
    assert role.total == 4
    assert fake.addresses == [None]


def test_run_torchrun_command_on_cpu(fake: FakeClient) -> None:
    result = runner.invoke(
        app,
        ["run", "--device-type", "cpu", "--name", "cpu-run", "--", "torchrun", "--nnodes=2",
         "--nproc-per-node=2", "train.py", "--lr", "1e-3"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (spec,) = fake.submitted
    assert spec.name == "cpu-run"
    assert spec.device_type is DeviceType.CPU
    assert spec.roles[0].resources.gpu == 0
    assert spec.roles[0].entrypoint == "train.py --lr 1e-3"


def test_run_prints_progress_and_exits_with_the_jobs_code(fake: FakeClient, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "spec.yaml", SPEC_DATA)
    result = runner.invoke(app, ["run", str(spec)])
    assert result.exit_code == 0, result.output
    assert fake.submitted[0] == JobSpec.model_validate(SPEC_DATA)
    assert fake.calls == [("submit", "demo"), ("wait", "demo")]
    assert fake.connected_for == fake.submitted  # a local run warms the node up before Ray starts
    lines = result.output.splitlines()
    stage_lines = [line for line in lines if line.startswith("[demo] stage ")]
    assert stage_lines == ["[demo] stage INIT", "[demo] stage RUNNING", "[demo] stage STOPPED"]
    # events are printed once each, relative to the first
    assert sum("job accepted" in line for line in lines) == 1
    assert sum("all 2 actors up" in line for line in lines) == 1
    assert any("+   1.50s" in line and "ROLE_RUNNING" in line for line in lines)
    # the final summary
    assert "job demo: STOPPED (exit code 0)" in result.output


def test_run_is_quiet_unless_verbose(
    fake: FakeClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --verbose the local client is asked for a quiet embedded Ray; -v, --verbose and
    DLU_VERBOSE=1 ask for Ray's and the job's own output; `resume` the same."""
    monkeypatch.setattr(dlu_api.cli, "quiet_python_warnings", lambda: None)  # this process' filters
    monkeypatch.delenv("DLU_VERBOSE", raising=False)
    spec = str(write_spec(tmp_path / "spec.yaml", SPEC_DATA))
    for args, env in (
        (["run", spec], {}),
        (["run", "-v", spec], {}),
        (["run", "--verbose", spec], {}),
        (["run", spec], {"DLU_VERBOSE": "1"}),
        (["resume", spec], {}),
        (["resume", "--verbose", spec], {}),
    ):
        result = runner.invoke(app, args, env=env)
        assert result.exit_code == 0, result.output
    assert fake.quiet == [True, False, False, False, True, False]


def test_run_exit_code_is_the_jobs(fake: FakeClient, tmp_path: Path) -> None:
    fake.statuses = script("demo", 3)
    spec = write_spec(tmp_path / "spec.yaml", SPEC_DATA)
    result = runner.invoke(app, ["run", str(spec)])
    assert result.exit_code == 3, result.output
    assert "reason: worker failed" in result.output


def test_run_without_exit_code_exits_1(fake: FakeClient, tmp_path: Path) -> None:
    fake.statuses = [JobStatus(name="demo", stage=JobStage.STOPPED)]
    spec = write_spec(tmp_path / "spec.yaml", SPEC_DATA)
    result = runner.invoke(app, ["run", str(spec)])
    assert result.exit_code == 1, result.output


def test_run_invalid_spec_is_a_usage_error(fake: FakeClient, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "spec.yaml", {**SPEC_DATA, "name": "Bad Name"})
    result = runner.invoke(app, ["run", str(spec)])
    assert result.exit_code == 2
    assert "error: invalid job spec" in result.output
    assert "name:" in result.output
    assert fake.submitted == []


def test_run_needs_something_to_run(fake: FakeClient, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "spec.yaml", SPEC_DATA)
    result = runner.invoke(app, ["run", str(spec), "extra"])
    assert result.exit_code == 2
    assert "expected one spec file" in result.output
    assert fake.submitted == []


def test_run_spec_file_with_overrides(fake: FakeClient, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "spec.yaml", SPEC_DATA)
    result = runner.invoke(app, ["run", "--name", "renamed", str(spec)])
    assert result.exit_code == 0, result.output
    assert fake.submitted[0].name == "renamed"


def test_run_gpu_spec_file_on_cpu(fake: FakeClient, tmp_path: Path) -> None:
    # An elastic role of a GPU job gets 1 GPU per rank by default; run on CPU, it gets none.
    gpu_spec = {
        "name": "gpu-job",
        "device_per_node": 2,
        "roles": [
            {
                "name": "trainer",
                "kind": "elastic",
                "entrypoint": "pkg.train:main",
                "elastic": {"nnodes": 1, "nproc_per_node": 2},
            }
        ],
    }
    spec = write_spec(tmp_path / "gpu.yaml", gpu_spec)
    result = runner.invoke(app, ["run", "--device-type", "cpu", str(spec)])
    assert result.exit_code == 0, result.output
    (submitted,) = fake.submitted
    assert submitted.device_type is DeviceType.CPU
    assert submitted.roles[0].resources.gpu == 0


def test_run_bad_name_override_lists_the_problem(fake: FakeClient, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "spec.yaml", SPEC_DATA)
    result = runner.invoke(app, ["run", "--name", "Bad Name", str(spec)])
    assert result.exit_code == 2
    assert "invalid job spec" in result.output
    assert "name:" in result.output
    assert fake.submitted == []


# --- status, stop, logs, list ---------------------------------------------------------------


def test_status_text(fake: FakeClient) -> None:
    fake.statuses = script("x", 3)
    fake.statuses[-1] = fake.statuses[-1].model_copy(
        update={"job_restart_count": 2, "roles": [worker_role("STOPPED", restarts=1)]}
    )
    result = runner.invoke(app, ["status", "x"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert fake.calls == [("status", "x")]
    assert "job x: STOPPED (exit code 3)" in out
    assert "reason: worker failed" in out
    assert "restarts: job restarts 2" in out
    assert "roles:" in out
    assert "worker (simple): 2 STOPPED, 1 restart(s)" in out
    assert "last 3 event(s):" in out
    for text in ("job accepted", "all 2 actors up", "exit code 3"):
        assert text in out


def test_status_limits_events(fake: FakeClient) -> None:
    result = runner.invoke(app, ["status", "x", "--events", "1"])
    assert result.exit_code == 0, result.output
    assert "last 1 event(s):" in result.output
    assert "job accepted" not in result.output
    assert "JOB_STOPPED" in result.output


def test_status_json(fake: FakeClient) -> None:
    result = runner.invoke(app, ["status", "x", "--json"])
    assert result.exit_code == 0, result.output
    parsed = JobStatus.model_validate(json.loads(result.stdout))
    assert parsed == fake.statuses[-1].model_copy(update={"name": "x"})


def test_status_unknown_job(fake: FakeClient) -> None:
    result = runner.invoke(app, ["status", "ghost"])
    assert result.exit_code == 2
    assert "error: no job named 'ghost'" in result.output


def test_stop_waits_until_the_job_has_stopped(fake: FakeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    running, stopped = fake.statuses[1], fake.statuses[-1]
    seen = iter([running, running, running, stopped])  # before the stop, then while it stops
    monkeypatch.setattr(fake, "status", lambda name: next(seen).model_copy(update={"name": name}))
    monkeypatch.setattr(dlu_api.cli.job_commands, "_STOP_POLL_S", 0.0)
    result = runner.invoke(app, ["stop", "x", "-a", "http://head:8265"])
    assert result.exit_code == 0, result.output
    assert fake.calls == [("stop", "x")]
    assert fake.addresses == ["http://head:8265"]
    assert "stopping job x (was RUNNING)" in result.output
    assert "job x stopped: STOPPED (exit code 0)" in result.output


def test_stop_of_a_stopped_job_says_so_and_stops_nothing(fake: FakeClient) -> None:
    result = runner.invoke(app, ["stop", "x"])
    assert result.exit_code == 0, result.output
    assert ("stop", "x") not in fake.calls
    assert "job x is already stopped: STOPPED (exit code 0)" in result.output


def test_stop_that_does_not_move_the_job_fails_clearly(
    fake: FakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = fake.statuses[1]
    monkeypatch.setattr(fake, "status", lambda name: running.model_copy(update={"name": name}))
    result = runner.invoke(app, ["stop", "x", "--timeout", "0.2"])
    assert result.exit_code == 1, result.output
    assert ("stop", "x") in fake.calls
    assert "error: job x is still RUNNING after 0s" in result.output
    assert "`dlu stop x` asks again" in result.output


@pytest.mark.parametrize(
    ("flags", "call"),
    [
        ([], ("x", False, None, None)),
        (["--follow"], ("x", True, None, None)),
        (["-f", "--rank", "1"], ("x", True, None, 1)),
        (["--role", "trainer", "--rank", "0"], ("x", False, "trainer", 0)),
        (["-r", "worker"], ("x", False, "worker", None)),
    ],
)
def test_logs(fake: FakeClient, flags: list[str], call: tuple[object, ...]) -> None:
    result = runner.invoke(app, ["logs", "x", *flags])
    assert result.exit_code == 0, result.output
    assert fake.calls == [("logs", call)]
    assert result.output.splitlines() == ["first line", "second line"]


def test_events_follow_prints_the_timeline(fake: FakeClient) -> None:
    result = runner.invoke(app, ["events", "x", "-f"])
    assert result.exit_code == 0, result.output
    assert fake.calls == [("timeline", ("x", True))]
    assert result.output.splitlines() == ["10:00:00 job_created job x created"]


def test_list_has_a_header_times_and_json(fake: FakeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    jobs = [
        JobSummary(name="newer", stage=JobStage.RUNNING, where="local", start_time=86400.0),
        JobSummary(
            name="older", stage=JobStage.STOPPED, exit_code=3, where="local", start_time=0.0, end_time=61.0
        ),
    ]
    monkeypatch.setattr(fake, "list_jobs", lambda: jobs)
    result = runner.invoke(app, ["list"])
    monkeypatch.delenv("TZ")
    time.tzset()
    assert result.exit_code == 0, result.output
    assert [line.split() for line in result.output.splitlines()] == [
        ["NAME", "STAGE", "EXIT", "STARTED", "ENDED", "WHERE"],
        ["newer", "RUNNING", "-", "1970-01-02", "00:00:00", "-", "local"],
        ["older", "STOPPED", "3", "1970-01-01", "00:00:00", "1970-01-01", "00:01:01", "local"],
    ]
    as_json = runner.invoke(app, ["list", "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert [JobSummary.model_validate(j) for j in json.loads(as_json.output)] == jobs


def test_list_of_no_jobs_says_so(fake: FakeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake, "list_jobs", list)
    assert runner.invoke(app, ["list"]).output.strip() == "no jobs"
    assert json.loads(runner.invoke(app, ["list", "--json"]).output) == []


# --- ProgressPrinter ------------------------------------------------------------------------


def test_progress_printer_prints_only_changes() -> None:
    lines: list[str] = []
    printer = ProgressPrinter(lines.append)
    first, running, running_again, stopped = script("demo", 0)

    printer(first)
    assert lines[0] == "[demo] stage INIT"
    assert len(lines) == 2 and "job accepted" in lines[1]

    printer(running)
    after_running = list(lines)
    assert "[demo] stage RUNNING" in after_running
    assert any("worker (simple): 2 RUNNING" in line for line in after_running)
    assert sum("all 2 actors up" in line for line in after_running) == 1

    printer(running_again)
    printer(running)
    assert lines == after_running  # identical statuses add nothing

    printer(stopped)
    new = lines[len(after_running) :]
    assert new[0] == "[demo] stage STOPPED"
    assert any("2 STOPPED" in line for line in new)
    assert sum("JOB_STOPPED" in line for line in new) == 1
    assert sum("job accepted" in line for line in lines) == 1  # never repeated

    printer(stopped)
    assert len(lines) == len(after_running) + len(new)


def test_progress_printer_role_change_without_stage_change() -> None:
    lines: list[str] = []
    printer = ProgressPrinter(lines.append)
    printer(JobStatus(name="j", stage=JobStage.RUNNING, roles=[worker_role("RUNNING")]))
    printer(JobStatus(name="j", stage=JobStage.RUNNING, roles=[worker_role("RUNNING", restarts=1)]))
    assert lines == [
        "[j] stage RUNNING",
        "  worker (simple): 2 RUNNING",
        "  worker (simple): 2 RUNNING, 1 restart(s)",
    ]


def test_progress_printer_event_times_are_relative_to_the_first() -> None:
    lines: list[str] = []
    printer = ProgressPrinter(lines.append)
    printer(JobStatus(name="j", stage=JobStage.INIT, events=[event(50.0, "A", "first")]))
    printer(
        JobStatus(
            name="j",
            stage=JobStage.INIT,
            events=[event(50.0, "A", "first"), event(52.25, "B", "second", role="r")],
        )
    )
    assert lines[1].startswith("  +   0.00s A")
    assert lines[2].startswith("  +   2.25s B")
    assert lines[2].endswith("r: second")
    assert len(lines) == 3


def test_resume_uses_the_client_and_waits_for_the_job(fake: FakeClient, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "spec.yaml", SPEC_DATA)
    result = runner.invoke(app, ["resume", str(spec)])
    assert ("resume", SPEC_DATA["name"]) in fake.calls
    assert any(call[0] == "wait" for call in fake.calls)
    assert result.exit_code == fake.statuses[-1].exit_code


# --- events, recoveries ---------------------------------------------------------------------


def test_events_prints_the_timeline_as_json_lines(fake: FakeClient) -> None:
    result = runner.invoke(app, ["events", "x"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert [JobEvent.model_validate_json(line) for line in lines] == fake.statuses[-1].events
    assert fake.calls == [("status", "x")]  # the ABC's default reads the status


def test_events_of_an_unknown_job_is_an_error(fake: FakeClient) -> None:
    result = runner.invoke(app, ["events", "ghost"])
    assert result.exit_code == 2
    assert "no job named 'ghost'" in result.output


def test_status_shows_recovery_durations(fake: FakeClient) -> None:
    died = event(200.0, "died", "actor died", role="worker")
    done = event(202.5, "actors_restarted", "1 actor(s) replaced and ready")
    last = fake.statuses[-1]
    fake.statuses[-1] = last.model_copy(update={"events": [*last.events, died, done]})
    result = runner.invoke(app, ["status", "x"])
    assert result.exit_code == 0, result.output
    assert "recoveries:" in result.output
    assert "recovered in 2.50 s: worker died -> actors_restarted" in result.output


def test_scale_prints_the_resize_and_refusals_name_the_fix(fake: FakeClient) -> None:
    result = runner.invoke(app, ["scale", "demo", "workers", "6"])
    assert result.exit_code == 0, result.output
    assert "workers: resize 2 -> 6 (dlu scale) done" in result.output
    assert fake.calls[-1] == ("scale", ("demo", "workers", 6))
    refused = runner.invoke(app, ["scale", "demo", "nope", "3"])
    assert refused.exit_code == 2 and "no role 'nope'" in refused.output
    calls = len(fake.calls)
    too_small = runner.invoke(app, ["scale", "demo", "workers", "0"])
    assert too_small.exit_code == 2 and "size 0 is not allowed: give a whole number >= 1" in too_small.output
    too_big = runner.invoke(app, ["scale", "demo", "workers", "1000000"])
    assert too_big.exit_code == 2 and "at most 10000 actors" in too_big.output
    assert len(fake.calls) == calls  # refused before it reaches the job


def test_status_shows_each_roles_size() -> None:
    from dlu_api.cli.render import role_line

    line = role_line(RoleStatus(name="workers", kind="simple", size=3, resize_count=2))
    assert line == "  workers (simple): size 3, no actors, 2 resize(s)"


def test_status_shows_an_elastic_roles_nodes_min_max_and_pending() -> None:
    from dlu_api.cli.render import role_line

    pending = RoleStatus(name="t", kind="elastic", size=2, nodes=1, min_nodes=1, max_nodes=2, pending_nodes=1)
    assert role_line(pending) == "  t (elastic): nodes 1 (min 1, max 2, 1 pending), no actors"
    full = RoleStatus(name="t", kind="elastic", size=4, nodes=2, min_nodes=1, max_nodes=2, pending_nodes=0)
    assert role_line(full) == "  t (elastic): nodes 2 (min 1, max 2), no actors"


def test_stop_of_a_lost_job_says_it_is_not_running(fake: FakeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    lost = JobStatus(name="x", stage=JobStage.LOST, reason="its process is gone")
    monkeypatch.setattr(fake, "status", lambda name: lost)
    result = runner.invoke(app, ["stop", "x"])
    assert result.exit_code == 2
    assert "error: job x is not running (LOST): its process is gone" in result.output
    assert ("stop", "x") not in fake.calls
