"""A real local `dlu run` serves its job's metrics at the address it prints: every series of
docs/metrics.md is there, labelled with the job, and a recovery's duration (injected with
`dlu debug mark-unhealthy`, a real actor restart) is summed exactly as the job's event says."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from cli_runs import Box, wait_until

from dlu_prime.master.metrics import SERIES

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

SPEC = """
name: metered
device_type: CPU
device_per_node: 0
health: {monitor_interval_s: 0.2}
roles:
  - name: worker
    entrypoint: workloads:forever
    total: 2
    resources: {cpu: 0.1}
"""
URL = re.compile(r"^metrics: (http://127\.0\.0\.1:\d+/metrics)$", re.M)
SAMPLE = re.compile(r"^([a-z_]+)\{([^}]*)\} (\S+)$", re.M)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def value(text: str, name: str, **labels: str) -> float | None:
    for found, tags, number in SAMPLE.findall(text):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', tags))
        if found == name and all(pairs.get(k) == v for k, v in labels.items()):
            return float(number)
    return None


def test_a_local_run_serves_every_series_with_exact_sums(tmp_path: Path) -> None:
    box = Box(tmp_path / "home")
    try:
        spec = tmp_path / "metered.yaml"
        spec.write_text(SPEC)
        run = box.start(spec)
        wait_until(lambda: box.stage("metered") == "RUNNING", "RUNNING", run)
        wait_until(lambda: URL.search(run.output()) is not None, "the metrics address printed", run)
        match = URL.search(run.output())
        assert match is not None
        url = match.group(1)

        marked = box.dlu("debug", "metered", "mark-unhealthy", "worker", "--rank", "0")
        assert marked.returncode == 0, marked.stdout + marked.stderr

        def recovered() -> list[dict[str, object]]:
            done = box.dlu("status", "metered", "--json")
            assert done.returncode == 0, done.stdout + done.stderr
            status = json.loads(done.stdout)
            ended = [e for e in status["events"] if e["kind"] == "failover_done" and e.get("duration_s")]
            return ended if status["stage"] == "RUNNING" else []

        wait_until(lambda: bool(recovered()), "a recovery with its duration", run)
        (event,) = recovered()
        tier, duration = str(event["tier"]), float(str(event["duration_s"]))

        def exported() -> bool:
            text = scrape(url)
            return value(text, "dlu_failover_duration_seconds_count", dlu_job="metered", tier=tier) == 1.0

        wait_until(exported, f"the {tier} recovery on the endpoint", run, timeout_s=60)
        text = scrape(url)
        print(text)  # what Prometheus would scrape (pytest -rP shows it)
        for series in SERIES:
            assert f"# TYPE {series.name} {series.kind}\n" in text, series.name
        assert value(text, "dlu_failover_duration_seconds_sum", dlu_job="metered", tier=tier) == duration
        assert value(text, "dlu_failover_seconds_total", dlu_job="metered", tier=tier) == duration
        assert value(text, "dlu_restarts_total", dlu_job="metered", tier=tier) == 1.0
        assert value(text, "dlu_job_stage", dlu_job="metered", stage="RUNNING") == 1.0
        age = value(text, "dlu_heartbeat_age_seconds", dlu_job="metered", role="worker")
        assert age is not None and 0.0 <= age < 60.0

        stopped = box.dlu("stop", "metered")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        run.proc.wait(120)
    finally:
        box.end()


ELASTIC = """
name: metered-elastic
device_type: CPU
device_per_node: 0
node_num: 1
health: {{monitor_interval_s: 0.2}}
roles:
  - name: trainer
    kind: elastic
    entrypoint: elastic_workloads:beat_then_fail_on_first_attempt
    resources: {{cpu: 0.25}}
    env: {{OUT_DIR: {out}}}
    elastic: {{nnodes: 1, nproc_per_node: 2, node_check: {{enabled: false}}}}
"""


def test_an_in_place_restart_timed_by_the_submaster_reaches_the_same_endpoint(tmp_path: Path) -> None:
    """The in-place tier is timed by the role's SubMaster, another process than the PrimeMaster:
    its recovery shows on the endpoint `dlu run` printed, beside the PrimeMaster's series."""
    box = Box(tmp_path / "home")
    out = tmp_path / "out"
    out.mkdir()
    try:
        spec = tmp_path / "metered-elastic.yaml"
        spec.write_text(ELASTIC.format(out=out))
        run = box.start(spec)
        wait_until(lambda: URL.search(run.output()) is not None, "the metrics address printed", run)
        match = URL.search(run.output())
        assert match is not None
        url = match.group(1)
        tags = {"dlu_job": "metered-elastic", "tier": "in_place"}

        def in_place_seen() -> bool:
            return value(scrape(url), "dlu_failover_duration_seconds_count", **tags) == 1.0

        wait_until(in_place_seen, "the in-place recovery on the endpoint", run)
        text = scrape(url)
        total = value(text, "dlu_failover_duration_seconds_sum", **tags)
        assert total is not None and 0.0 < total < 60.0, text
        assert value(text, "dlu_failover_seconds_total", **tags) == total
        wait_until(
            lambda: value(scrape(url), "dlu_world_size", dlu_job="metered-elastic", role="trainer") == 2.0,
            "the world size",
            run,
        )
        (out / "go").write_text("")
        assert run.proc.wait(120) == 0, run.output()
    finally:
        box.end()


def test_metrics_off_serves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`DLU_METRICS_PORT=off`: the job runs, no address is printed."""
    monkeypatch.setenv("DLU_METRICS_PORT", "off")
    box = Box(tmp_path / "home")
    try:
        spec = tmp_path / "quiet.yaml"
        spec.write_text(SPEC.replace("metered", "quiet").replace("workloads:forever", "workloads:quick"))
        run = box.start(spec)
        assert run.proc.wait(180) == 0, run.output()
        assert "metrics:" not in run.output()
    finally:
        box.end()


def test_a_bad_port_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLU_METRICS_PORT", "http")
    box = Box(tmp_path / "home")
    try:
        spec = tmp_path / "bad.yaml"
        spec.write_text(SPEC.replace("metered", "bad"))
        run = box.start(spec)
        assert run.proc.wait(120) == 2, run.output()
        assert "DLU_METRICS_PORT='http': give a port number" in run.output()
        assert not list(Path(run.ray_tmpdir).iterdir()), "Ray started"
    finally:
        box.end()
