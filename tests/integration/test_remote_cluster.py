"""A driver with only the dlu-api wheel, a real multi-node Ray cluster with a job server.

The cluster (conftest `ray_cluster`) runs from an environment built from our wheels alone:
one head offering `dlu_head`, two worker nodes offering `dlu_worker`. The driver is another
environment holding dlu-api and its light dependencies; every step goes through its `dlu`
command, as a user on a laptop would: submit, status, list, logs, stop, and the errors a
driver meets (name taken, version mismatch, unreachable cluster, no job server, no dlu-prime).
The cluster environment has Ray's metrics agent, so a job's DLU metrics are read here from the
nodes' Prometheus endpoints, as a Prometheus server would scrape them.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from side_by_side import outcome, run_checks
from terminal import ANSI, ERASE_LINE, final_screen, run_in_terminal
from wheel_envs import RayCluster, Venv, make_venv, run_ok

from dlu_api.client import remote_errors
from dlu_api.client.launcher_feed import open_feed
from dlu_api.client.remote import RemoteJobClient
from dlu_api.errors import ClusterSetupError

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

CPU_JOB: dict[str, Any] = {"device_type": "CPU", "device_per_node": 0}
ISOLATION = {"cpu": 0.1, "isolation_resource": "dlu_head", "worker_isolation_resource": "dlu_worker"}


def dlu(
    driver: Venv, *args: str, cwd: Path, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env = {**base, **(env or {})}
    env["PATH"] = f"{driver.bin}{os.pathsep}/usr/bin{os.pathsep}/bin"  # no workspace, no uv
    return subprocess.run(
        [str(driver.bin / "dlu"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def status_json(driver: Venv, job: str, cluster: RayCluster) -> dict[str, Any]:
    done = dlu(driver, "status", job, "--address", cluster.address, "--json", cwd=cluster.workdir)
    assert done.returncode == 0, done.stderr
    value: dict[str, Any] = json.loads(done.stdout)
    return value


def write_spec(directory: Path, data: dict[str, Any]) -> Path:
    path = directory / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_driver_environment_has_no_ray_torch_or_grpc(driver_venv: Venv, uv_bin: str) -> None:
    listed = run_ok(uv_bin, "pip", "list", "--python", driver_venv.python, "--format", "json")
    names = {p["name"].lower() for p in json.loads(listed)}
    assert "dlu-api" in names
    assert not names & {"ray", "torch", "grpcio", "dlu-prime", "dlu-elastic", "protobuf"}, sorted(names)


def _reference(driver_venv: Venv, ray_cluster: RayCluster, tmp_path: Path) -> None:
    """examples/elastic (2 nodes x 2 processes, node check) across the two worker nodes; the
    PrimeMaster on the head (isolation scheduling); followed with `dlu events -f`."""
    spec = yaml.safe_load((ray_cluster.workdir / "examples/elastic/job.yaml").read_text())
    spec.update(name="lm-remote", placement_strategy="STRICT_SPREAD", master=ISOLATION)
    role = spec["roles"][0]
    role["entrypoint"] = f"examples/elastic/train_lm.py --steps 4 --checkpoint-dir {tmp_path / 'ckpt'}"
    role["elastic"]["node_check"] = {"matmul_size": 64, "allreduce_mb": 0.5, "timeout_s": 90}
    path = write_spec(tmp_path, spec)

    done = dlu(driver_venv, "submit", str(path), "--address", ray_cluster.address, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "submitted lm-remote" in done.stdout

    follow = dlu(driver_venv, "events", "lm-remote", "-f", "--address", ray_cluster.address, cwd=tmp_path)
    assert follow.returncode == 0, follow.stderr
    assert "[lm-remote] stage RUNNING" in follow.stdout
    assert "job lm-remote: STOPPED (exit code 0)" in follow.stdout
    assert "DLU-STATUS" not in follow.stdout  # wire lines are for the client, not for people

    final = status_json(driver_venv, "lm-remote", ray_cluster)
    assert (final["stage"], final["exit_code"]) == ("STOPPED", 0), final["reason"]
    assert any(e["kind"] == "node_check" for e in final["events"])
    ranks = [a for a in final["roles"][0]["actors"] if a["rank"] >= 0]
    assert len(ranks) == 4
    assert {a["stage"] for a in ranks} == {"FINISH"}
    # isolation: every training rank on a worker node, two ranks on each, none on the head
    nodes = sorted(a["node_id"] for a in ranks)
    assert set(nodes) == set(ray_cluster.worker_nodes)
    assert nodes.count(ray_cluster.worker_nodes[0]) == 2
    assert (tmp_path / "ckpt" / "final_loss.txt").exists()

    listed = dlu(driver_venv, "list", "--json", "--address", ray_cluster.address, cwd=tmp_path)
    jobs = {j["name"]: j for j in json.loads(listed.stdout)}
    assert (jobs["lm-remote"]["stage"], jobs["lm-remote"]["exit_code"]) == ("STOPPED", 0), listed.stdout
    assert "probe" not in listed.stdout


def _logs(driver_venv: Venv, ray_cluster: RayCluster, tmp_path: Path) -> None:
    """Each rank's output in its file under its node's Ray log dir, read by a dlu-api-only driver
    with `dlu logs` (whole, one rank, one role, followed), as it is and while it grows."""
    spec = {
        **CPU_JOB,
        "name": "ranks-remote",
        "master": ISOLATION,
        "placement_strategy": "STRICT_SPREAD",
        "config": {"steps": 3},
        "roles": [
            {"name": "trainer", "kind": "elastic", "entrypoint": "examples/elastic/allreduce.py",
             "resources": {"cpu": 0.1},
             "elastic": {"nnodes": 2, "nproc_per_node": 1, "node_check": {"enabled": False}}},
            {"name": "worker", "entrypoint": "examples.hello.workers:main", "resources": {"cpu": 0.1}},
        ],
    }  # fmt: skip
    path = write_spec(tmp_path, spec)
    address = ("--address", ray_cluster.address)
    done = dlu(driver_venv, "submit", str(path), *address, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    followed = dlu(driver_venv, "logs", "ranks-remote", "-f", "--role", "trainer", *address, cwd=tmp_path)
    assert followed.returncode == 0, followed.stderr
    lines = followed.stdout.splitlines()
    assert any(line.startswith("[trainer/rank0] rank 0/2 (local 0, node 0): sum 3") for line in lines), lines
    assert any(line.startswith("[trainer/rank1] rank 1/2 (local 0, node 1): sum 3") for line in lines), lines
    assert not any("[worker/" in line for line in lines), lines

    final = status_json(driver_venv, "ranks-remote", ray_cluster)
    assert (final["stage"], final["exit_code"]) == ("STOPPED", 0), final["reason"]
    assert final["run_id"] and final["log_dir"] is None  # the Ray session's log dir on each node

    one = dlu(driver_venv, "logs", "ranks-remote", "--rank", "1", *address, cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    ranks = {line.split("]")[0] + "]" for line in one.stdout.splitlines()}
    assert ranks <= {"[trainer/rank1]", "[trainer/rank1:err]"}, one.stdout
    assert "[trainer/rank1] rank 1/2 (local 0, node 1): sum 3" in one.stdout.splitlines()
    every = dlu(driver_venv, "logs", "ranks-remote", *address, cwd=tmp_path)
    assert "[worker/rank0] ranks-remote.worker.0: rank 0/1 did 3 steps" in every.stdout.splitlines(), (
        every.stdout
    )
    assert "DLU-STATUS" not in every.stdout and "stage RUNNING" not in every.stdout  # ranks only
    timeline = dlu(driver_venv, "events", "ranks-remote", "-f", *address, cwd=tmp_path)
    assert "job ranks-remote: STOPPED (exit code 0)" in timeline.stdout, timeline.stdout


def _tee(driver_venv: Venv, ray_cluster: RayCluster, tmp_path: Path) -> None:
    """`dlu run --address` with `logs.tee` prints the ranks' lines, prefixed, read through Ray's
    log API (not Ray's forwarding of worker output)."""
    spec = {
        **CPU_JOB,
        "name": "tee-remote",
        "master": ISOLATION,
        "config": {"steps": 2},
        "logs": {"tee": 1},
        "roles": [{"name": "worker", "entrypoint": "examples.hello.workers:main", "total": 2,
                   "resources": {"cpu": 0.1}}],
    }  # fmt: skip
    path = write_spec(tmp_path, spec)
    done = dlu(driver_venv, "run", str(path), "--address", ray_cluster.address, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for rank in (0, 1):
        line = f"[worker/rank{rank}] tee-remote.worker.{rank}: rank {rank}/2 did 2 steps"
        assert line in lines, done.stdout


def _hold(driver_venv: Venv, ray_cluster: RayCluster, tmp_path: Path) -> None:
    spec = {
        **CPU_JOB,
        "name": "hold",
        "master": ISOLATION,
        "config": {"steps": 100_000, "step_seconds": 0.1},
        "health": {"monitor_interval_s": 0.2},
        "roles": [{"name": "worker", "entrypoint": "examples.hello.workers:main", "total": 2,
                   "resources": {"cpu": 0.1}}],
    }  # fmt: skip
    path = write_spec(tmp_path, spec)
    address = ("--address", ray_cluster.address)
    done = dlu(driver_venv, "submit", str(path), *address, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr

    deadline = time.monotonic() + 120
    while True:  # DLU's own status (stage, roles, actors) of a running job, through a probe job
        current = status_json(driver_venv, "hold", ray_cluster)
        if current["stage"] == "RUNNING":
            break
        assert time.monotonic() < deadline, current
        time.sleep(1)
    (role,) = current["roles"]
    assert role["name"] == "worker"
    assert [a["stage"] for a in role["actors"]] == ["RUNNING", "RUNNING"]
    assert {a["node_id"] for a in role["actors"]} <= set(ray_cluster.worker_nodes)
    assert [e["kind"] for e in current["events"]][:1] == ["job_created"]
    human = dlu(driver_venv, "status", "hold", *address, cwd=tmp_path)
    assert "worker (custom): 2 RUNNING" in human.stdout or "2 RUNNING" in human.stdout, human.stdout

    # Ray's dashboard serves the launcher's log by submission id, whole and as a stream: what a
    # driver follows instead of reading the whole log at every poll (launcher_feed.py).
    client = RemoteJobClient(ray_cluster.address)
    sid = client._sid("hold")  # pyright: ignore[reportPrivateUsage]
    info = client._job_info_by_id(sid, "hold")  # pyright: ignore[reportPrivateUsage]
    feed = open_feed(client._log_api(), sid, info)  # pyright: ignore[reportPrivateUsage]
    assert feed is not None, f"no stream of the launcher's log from Ray's log API: {info}"
    head = feed.report()
    assert head.accepted is not None and head.status is not None and head.status.stage.value == "RUNNING"

    again = dlu(driver_venv, "submit", str(path), *address, cwd=tmp_path)
    assert again.returncode == 2
    assert "a job named 'hold' is still RUNNING" in again.stderr
    assert "dlu stop hold" in again.stderr

    stopped = dlu(driver_venv, "stop", "hold", *address, cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    deadline = time.monotonic() + 90
    while (final := status_json(driver_venv, "hold", ray_cluster))["stage"] != "STOPPED":
        assert time.monotonic() < deadline, final
        time.sleep(1)
    assert "stopped by user request" in final["reason"]
    streamed = feed.wait_for(lambda r: r.status is not None and r.status.finished, 60)  # appended lines
    feed.close()
    assert streamed is not None and streamed.current is not None
    assert "stopped by user request" in streamed.current.reason
    assert [e.kind for e in streamed.current.events] == [e["kind"] for e in final["events"]]
    assert [p for p in dlu(driver_venv, "list", *address, cwd=tmp_path).stdout.splitlines() if "hold" in p]

    # the name is free again once the job ended: the old Ray job record is replaced
    spec["config"]["steps"] = 1
    write_spec(tmp_path, spec)
    rerun = dlu(driver_venv, "run", str(path), *address, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "job hold: STOPPED (exit code 0)" in rerun.stdout


def _live(driver_venv: Venv, ray_cluster: RayCluster, tmp_path: Path) -> None:
    """`dlu run --address` with a terminal: the steps move on screen while the job runs (the
    launcher's status lines between stage changes, once per DLU_STATUS_INTERVAL_S: the default
    5 s here, so the job runs for about 16 s), and the final screen stays."""
    spec = {
        **CPU_JOB,
        "name": "live",
        "master": ISOLATION,
        "config": {"steps": 80, "step_seconds": 0.2},
        "health": {"monitor_interval_s": 0.2},
        "roles": [{"name": "worker", "entrypoint": "examples.hello.workers:main", "total": 2,
                   "resources": {"cpu": 0.1}}],
    }  # fmt: skip
    path = write_spec(tmp_path, spec)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "DLU_VERBOSE")}
    env.update(PATH=f"{driver_venv.bin}{os.pathsep}/usr/bin{os.pathsep}/bin", COLUMNS="120", TERM="xterm")
    args = [str(driver_venv.bin / "dlu"), "run", str(path), "--address", ray_cluster.address]
    code, output = run_in_terminal(args, env, tmp_path, timeout_s=300)
    plain = ANSI.sub("", output)
    assert code == 0, plain[-4000:]
    frames = [ANSI.sub("", frame) for frame in output.split(ERASE_LINE)]
    running = re.compile(r"^worker simple\s+2 RUNNING\s+(\d+)", re.M)
    steps = {int(m.group(1)) for frame in frames for m in running.finditer(frame)}
    assert len(steps) >= 2, f"the steps never moved on screen ({steps}):\n{plain[-4000:]}"
    screen = final_screen(output)
    assert "job live  STOPPED (exit code 0)" in screen, screen
    row = next((line for line in screen.splitlines() if line.startswith("worker")), "")
    assert "2 FINISH" in row and " 79 " in row, screen


METRIC_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
METRIC_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
Sample = tuple[str, dict[str, str], float]


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""  # the agent is not serving yet


def dlu_samples(text: str, job: str) -> dict[str, Sample]:
    """The job's DLU samples of a Prometheus text exposition (line -> sample), names without the
    `ray_` prefix Ray adds to every application metric (`ray_dlu_job_stage`)."""
    found: dict[str, Sample] = {}
    for line in text.splitlines():
        match = METRIC_LINE.match(line)
        if match is None or line.startswith("#"):
            continue
        name = match.group(1).removeprefix("ray_")
        labels = dict(METRIC_LABEL.findall(match.group(2) or ""))
        if name.startswith("dlu_") and labels.get("dlu_job") == job:
            found[line] = (name, labels, float(match.group(3)))
    return found


def value_of(samples: list[Sample], name: str, **labels: str) -> float | None:
    for found, tags, value in samples:
        if found == name and all(tags.get(k) == v for k, v in labels.items()):
            return value
    return None


def _metered(driver_venv: Venv, ray_cluster: RayCluster, tmp_path: Path) -> None:
    """A running job takes one role failover (`dlu debug mark-unhealthy`); its PrimeMaster's
    JobMetrics then show on the nodes' Prometheus endpoints (each node's metrics agent serves
    what the Ray workers on it record): the stage, the restart counters, the failover duration
    histogram and the heartbeat age, all labelled with the job."""
    assert len(ray_cluster.metrics_ports) == 3, ray_cluster.metrics_ports
    spec = {
        **CPU_JOB,
        "name": "metered",
        "master": ISOLATION,
        "config": {"steps": 100_000, "step_seconds": 0.1},
        "health": {"monitor_interval_s": 0.2},
        "roles": [{"name": "worker", "entrypoint": "examples.hello.workers:main", "total": 2,
                   "resources": {"cpu": 0.1}, "recovery": "in_place"}],
    }  # fmt: skip
    address = ("--address", ray_cluster.address)
    done = dlu(driver_venv, "submit", str(write_spec(tmp_path, spec)), *address, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    try:
        deadline = time.monotonic() + 120
        while (current := status_json(driver_venv, "metered", ray_cluster))["stage"] != "RUNNING":
            assert time.monotonic() < deadline, current
            time.sleep(1)
        marked = dlu(driver_venv, "debug", "metered", "mark-unhealthy", "worker", "--rank", "0", *address,
                     cwd=tmp_path)  # fmt: skip
        assert marked.returncode == 0, marked.stdout + marked.stderr
        deadline = time.monotonic() + 120
        while True:
            current = status_json(driver_venv, "metered", ray_cluster)
            tiers = [e["tier"] for e in current["events"] if e["kind"] == "failover_done"]
            if tiers and current["stage"] == "RUNNING":
                break
            assert time.monotonic() < deadline, current
            time.sleep(1)
        assert len(tiers) == 1, current["events"]
        (tier,) = tiers

        def exported() -> dict[str, Sample]:
            return {
                k: v
                for p in ray_cluster.metrics_ports.values()
                for k, v in dlu_samples(scrape(p), "metered").items()
            }

        wanted = {  # name, labels -> what the value must satisfy
            ("dlu_job_stage", ("stage", "RUNNING")): lambda v: v == 1.0,
            ("dlu_job_stage", ("stage", "INIT")): lambda v: v == 0.0,
            ("dlu_job_stage_code", ()): lambda v: v == 3.0,
            ("dlu_restarts_total", ("tier", tier)): lambda v: v >= 1.0,
            ("dlu_failover_duration_seconds_count", ("tier", tier)): lambda v: v >= 1.0,
            ("dlu_failover_duration_seconds_sum", ("tier", tier)): lambda v: 0.0 < v < 120.0,
            # the exact sum (Ray's `_sum` above is built from bucket midpoints)
            ("dlu_failover_seconds_total", ("tier", tier)): lambda v: 0.0 < v < 120.0,
            ("dlu_failover_duration_seconds_bucket", ("le", "+Inf")): lambda v: v >= 1.0,
            ("dlu_heartbeat_age_seconds", ("role", "worker")): lambda v: 0.0 <= v < 30.0,
        }
        if tier == "role":
            wanted["dlu_role_restarts_total", ("role", "worker")] = lambda v: v >= 1.0
        deadline = time.monotonic() + 60  # Ray's agent exports on its report interval (seconds)
        while True:
            lines = exported()
            samples = list(lines.values())
            values = {k: value_of(samples, k[0], **dict([k[1]] if k[1] else [])) for k in wanted}
            if all(v is not None and wanted[k](v) for k, v in values.items()):
                break
            assert time.monotonic() < deadline, (values, "\n".join(lines))
            time.sleep(1)
        print("\n".join(lines))  # what Prometheus would scrape (pytest -rP shows it)
    finally:
        dlu(driver_venv, "stop", "metered", *address, cwd=tmp_path)
    deadline = time.monotonic() + 90
    while (final := status_json(driver_venv, "metered", ray_cluster))["stage"] != "STOPPED":
        assert time.monotonic() < deadline, final
        time.sleep(1)


@pytest.fixture(scope="module")
def future_driver(
    tmp_path_factory: pytest.TempPathFactory, repo_root: Path, uv_bin: str, lock_constraints: Path
) -> Venv:
    """A driver with a dlu-api from a later release (9.0.0) than the cluster's dlu-prime knows."""
    source = tmp_path_factory.mktemp("api-9") / "dlu-api"
    shutil.copytree(repo_root / "packages" / "dlu-api", source, ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = source / "pyproject.toml"
    pyproject.write_text(re.sub(r'(?m)^version = ".*"$', 'version = "9.0.0"', pyproject.read_text()))
    dist = source.parent / "dist"
    run_ok(uv_bin, "build", "--wheel", "-q", "-o", dist, source)
    (wheel,) = dist.glob("dlu_api-9.0.0-*.whl")
    return make_venv(uv_bin, source.parent / "venv", lock_constraints, wheel)


def test_version_mismatch_is_refused_with_the_versions_named(
    future_driver: Venv, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    spec = {
        **CPU_JOB,
        "name": "too-new",
        "roles": [{"name": "w", "entrypoint": "examples.hello.workers:main"}],
    }
    path = write_spec(tmp_path, spec)
    done = dlu(future_driver, "submit", str(path), "--address", ray_cluster.address, cwd=tmp_path)
    assert done.returncode == 2
    assert "the driver's dlu-api 9.0.0 does not work with this cluster's dlu-prime 0.1.0" in done.stderr
    assert "dlu-api<0.2,>=0.1.0" in done.stderr


def test_unreachable_cluster(driver_venv: Venv, tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = dlu(driver_venv, "list", "--address", f"http://127.0.0.1:{port}", cwd=tmp_path)
    assert done.returncode == 2
    assert f"cannot reach the Ray cluster at http://127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


class _NotRay(BaseHTTPRequestHandler):
    """Some other web server where the job server was expected."""

    def do_GET(self) -> None:
        self.send_error(404)

    do_POST = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@pytest.fixture
def not_a_job_server() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _NotRay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_no_job_server_points_at_ray_default(
    driver_venv: Venv, not_a_job_server: str, tmp_path: Path
) -> None:
    spec = {**CPU_JOB, "name": "nowhere", "roles": [{"name": "w", "entrypoint": "pkg.mod:main"}]}
    done = dlu(
        driver_venv, "submit", str(write_spec(tmp_path, spec)), "--address", not_a_job_server, cwd=tmp_path
    )
    assert done.returncode == 2
    assert "is not a Ray job server" in done.stderr
    assert "ray[default]" in done.stderr


def test_missing_dlu_prime_is_named(driver_venv: Venv, tmp_path: Path) -> None:
    """What a cluster without dlu-prime writes to the job log when it runs our entrypoint (here
    the driver's own Python, which has no dlu_prime) becomes a plain error naming the fix."""
    done = subprocess.run(
        [str(driver_venv.python), "-m", "dlu_prime", "launch", "--api-version", "0.1.0", "--spec-json", "{}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    error = remote_errors.launch_failure("http://head:8265", "job", done.stdout + done.stderr)
    assert isinstance(error, ClusterSetupError)
    assert "dlu-prime is not installed on the Ray cluster at http://head:8265" in str(error)


def _lm_metered(driver_venv: Venv, ray_cluster: RayCluster, tmp_path: Path) -> None:
    """The documented metrics of an elastic job while it runs: each node's node-check score
    (still exported long after the one check that set it), a failover duration for the
    in-place tier (a rank's process crashes at step 8) and for the role tier (`dlu debug
    mark-unhealthy`), and the heartbeat age of the ranks, which stays small while they beat."""
    spec = yaml.safe_load((ray_cluster.workdir / "examples/elastic/job.yaml").read_text())
    spec.update(name="lm-metered", placement_strategy="SPREAD", master=ISOLATION)
    role = spec["roles"][0]
    role["entrypoint"] = (
        f"examples/elastic/train_lm.py --steps 100000 --step-seconds 0.1 --crash-at-step 8 "
        f"--crash-rank 1 --checkpoint-dir {tmp_path / 'ckpt'}"
    )
    role["elastic"]["node_check"] = {"matmul_size": 64, "allreduce_mb": 0.5, "timeout_s": 90}
    address = ("--address", ray_cluster.address)
    done = dlu(driver_venv, "submit", str(write_spec(tmp_path, spec)), *address, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr

    def kinds() -> list[str]:
        """Event kinds, a recovery's with its tier (`failover_done/role`)."""
        events = status_json(driver_venv, "lm-metered", ray_cluster)["events"]
        return [e["kind"] + (f"/{e['tier']}" if e["kind"] == "failover_done" else "") for e in events]

    try:
        deadline = time.monotonic() + 240
        while "inplace_restart" not in (seen := kinds()):
            assert time.monotonic() < deadline, seen
            time.sleep(1)
        while True:  # every rank past the crash: the in-place restart is over (and timed)
            current = status_json(driver_venv, "lm-metered", ray_cluster)
            steps = [a["step"] or 0 for a in current["roles"][0]["actors"] if a["rank"] >= 0]
            if len(steps) == 4 and min(steps) >= 12:
                break
            assert time.monotonic() < deadline, current
            time.sleep(1)
        marked = dlu(driver_venv, "debug", "lm-metered", "mark-unhealthy", "trainer", "--rank", "0", *address,
                     cwd=tmp_path)  # fmt: skip
        assert marked.returncode == 0, marked.stdout + marked.stderr
        deadline = time.monotonic() + 240
        while "failover_done/role" not in (seen := kinds()):
            assert time.monotonic() < deadline, seen
            time.sleep(1)
        wanted = {
            ("dlu_node_check_score_seconds", "node", "node-0"): lambda v: v > 0.0,
            ("dlu_node_check_score_seconds", "node", "node-1"): lambda v: v > 0.0,
            ("dlu_failover_duration_seconds_count", "tier", "in_place"): lambda v: v == 1.0,
            ("dlu_failover_duration_seconds_sum", "tier", "in_place"): lambda v: 0.0 < v < 120.0,
            ("dlu_failover_duration_seconds_count", "tier", "role"): lambda v: v == 1.0,
            ("dlu_heartbeat_age_seconds", "role", "trainer"): lambda v: 0.0 <= v < 15.0,
        }
        deadline = time.monotonic() + 90  # Ray's agents export on their report interval
        while True:
            samples = [
                s
                for p in ray_cluster.metrics_ports.values()
                for s in dlu_samples(scrape(p), "lm-metered").values()
            ]
            values = {k: value_of(samples, k[0], **{k[1]: k[2]}) for k in wanted}
            if all(v is not None and wanted[k](v) for k, v in values.items()):
                break
            assert time.monotonic() < deadline, values
            time.sleep(1)
    finally:
        dlu(driver_venv, "stop", "lm-metered", *address, cwd=tmp_path)
    deadline = time.monotonic() + 90
    while (final := status_json(driver_venv, "lm-metered", ray_cluster))["stage"] != "STOPPED":
        assert time.monotonic() < deadline, final
        time.sleep(1)


Check = Callable[[Venv, RayCluster, Path], None]
# longest first (the figures of one run here); the two with four training ranks each (`lm_*`,
# `reference`) start apart, so that they seldom train at the same time on the machine's cores
SIDE_BY_SIDE: dict[str, Check] = {
    "hold": _hold,
    "live": _live,
    "lm_metered": _lm_metered,
    "metered": _metered,
    "logs": _logs,
    "reference": _reference,
    "tee": _tee,
}


@pytest.fixture(scope="module")
def side_by_side(
    driver_venv: Venv, ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, BaseException | None]:
    """The checks that each run their own job on the cluster, run side by side, three at a time
    (each its own job, as before, named apart): their time is mostly waits (a job placed and
    polled, a 16 s job watched, Ray's metrics agents' report interval), which the others fill.
    What each check raised, its test raises."""
    checks = {
        name: functools.partial(check, driver_venv, ray_cluster) for name, check in SIDE_BY_SIDE.items()
    }
    return run_checks(checks, tmp_path_factory, at_once=3)


def test_reference_job_across_nodes_from_a_dlu_api_only_driver(
    side_by_side: dict[str, BaseException | None],
) -> None:
    outcome(side_by_side, "reference")


def test_rank_logs_of_a_cluster_job_through_the_dashboard(
    side_by_side: dict[str, BaseException | None],
) -> None:
    outcome(side_by_side, "logs")


def test_remote_run_tees_rank_output(side_by_side: dict[str, BaseException | None]) -> None:
    outcome(side_by_side, "tee")


def test_status_name_taken_and_stop_of_a_running_job(side_by_side: dict[str, BaseException | None]) -> None:
    outcome(side_by_side, "hold")


def test_remote_run_draws_the_live_view_in_a_terminal(side_by_side: dict[str, BaseException | None]) -> None:
    outcome(side_by_side, "live")


def test_job_metrics_reach_prometheus_through_ray(side_by_side: dict[str, BaseException | None]) -> None:
    outcome(side_by_side, "metered")


def test_elastic_metrics_node_scores_in_place_and_role_durations_and_rank_heartbeats(
    side_by_side: dict[str, BaseException | None],
) -> None:
    outcome(side_by_side, "lm_metered")
