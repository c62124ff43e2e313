"""The local metrics endpoint (dlu_prime.local_metrics): JobMetrics recording into files that the
driver's endpoint merges and serves over real HTTP on 127.0.0.1, exact sums, one source per
actor, the port setting; and docs/metrics.md listing exactly the series the code defines."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dlu_api.errors import DLUError
from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStage
from dlu_prime import local_metrics
from dlu_prime.local_metrics import LocalMetricsBackend, render
from dlu_prime.master.manager import new_state
from dlu_prime.master.metrics import SERIES, JobMetrics
from dlu_prime.master.state import JobState

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parents[3]
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def job_state() -> JobState:
    spec = spec_from_dict(
        {
            "name": "m",
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [{"name": "trainer", "entrypoint": "pkg.t:main", "total": 2}],
        }
    )
    return new_state(spec)


def samples(text: str) -> dict[str, float]:
    """`name{labels}` -> value of every sample line."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = SAMPLE.match(line)
        assert match is not None, line
        found[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return found


def test_a_histogram_sum_is_exact_not_a_bucket_midpoint(tmp_path: Path) -> None:
    metrics = JobMetrics("m", LocalMetricsBackend(tmp_path, "m.prime-master"))
    metrics.failover_done("role", 0.5)
    metrics.failover_done("role", 1.25)
    got = samples(render(tmp_path))
    tags = 'dlu_job="m",tier="role"'
    assert got[f"dlu_failover_duration_seconds_sum{{{tags}}}"] == 1.75  # Ray's exporter: 0.75 + 1.25
    assert got[f"dlu_failover_duration_seconds_count{{{tags}}}"] == 2
    assert got[f"dlu_failover_seconds_total{{{tags}}}"] == 1.75
    assert got[f'dlu_failover_duration_seconds_bucket{{{tags},le="0.25"}}'] == 0
    assert got[f'dlu_failover_duration_seconds_bucket{{{tags},le="0.5"}}'] == 1  # le is inclusive
    assert got[f'dlu_failover_duration_seconds_bucket{{{tags},le="1.5"}}'] == 2
    assert got[f'dlu_failover_duration_seconds_bucket{{{tags},le="+Inf"}}'] == 2


def test_every_series_is_listed_before_any_value(tmp_path: Path) -> None:
    JobMetrics("m", LocalMetricsBackend(tmp_path, "m.prime-master"))
    text = render(tmp_path)
    assert {s.name for s in SERIES} == set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    for series in SERIES:
        assert f"# TYPE {series.name} {series.kind}" in text


def test_state_and_sources_merge(tmp_path: Path) -> None:
    """The PrimeMaster's and a SubMaster's files are served as one: counters and histograms
    summed, gauges as written."""
    state = job_state()
    state.stage = JobStage.RUNNING
    state.roles["trainer"].restart_count = 2
    prime_backend = LocalMetricsBackend(tmp_path, "m.prime-master")
    prime = JobMetrics("m", prime_backend)
    prime.observe_state(state, {"m.trainer.0": 3.0, "m.trainer.1": 1.0})
    prime.failover_done("role", 2.0)
    sub_backend = LocalMetricsBackend(tmp_path, "m.trainer.submaster")
    sub = JobMetrics("m", sub_backend)
    sub.failover_done("in_place", 0.5)
    sub.failover_done("role", 1.0)  # not a real case; shows the sum over sources
    sub.node_check_scores({"node-a": 0.125})
    for backend in (prime_backend, sub_backend):
        backend.store.write()  # gauges are written a moment later (the test below waits for it)
    got = samples(render(tmp_path))
    assert got['dlu_job_stage{dlu_job="m",stage="RUNNING"}'] == 1
    assert got['dlu_job_stage{dlu_job="m",stage="INIT"}'] == 0
    assert got['dlu_job_stage_code{dlu_job="m"}'] == 3
    assert got['dlu_role_restarts_total{dlu_job="m",role="trainer"}'] == 2
    assert got['dlu_restarts_total{dlu_job="m",tier="role"}'] == 2
    assert got['dlu_heartbeat_age_seconds{dlu_job="m",role="trainer"}'] == 3.0
    assert got['dlu_failover_duration_seconds_count{dlu_job="m",tier="role"}'] == 2
    assert got['dlu_failover_duration_seconds_sum{dlu_job="m",tier="role"}'] == 3.0
    assert got['dlu_failover_seconds_total{dlu_job="m",tier="in_place"}'] == 0.5
    assert got['dlu_node_check_score_seconds{dlu_job="m",node="node-a"}'] == 0.125


def test_a_rebuilt_actor_takes_its_predecessors_file_over(tmp_path: Path) -> None:
    """A rebuilt PrimeMaster counts from the stored totals again: its file replaces the old one,
    so nothing is counted twice."""
    state = job_state()
    state.roles["trainer"].restart_count = 1
    for _ in range(2):
        JobMetrics("m", LocalMetricsBackend(tmp_path, "m.prime-master")).observe_state(state, {})
    assert samples(render(tmp_path))['dlu_role_restarts_total{dlu_job="m",role="trainer"}'] == 1


def test_gauges_are_written_soon_after_they_change(tmp_path: Path) -> None:
    metrics = JobMetrics("m", LocalMetricsBackend(tmp_path, "m.prime-master"))
    state = new_state(job_state().spec)
    for stage in (JobStage.RUNNING, JobStage.STOPPED):
        state.stage = stage
        metrics.observe_state(state, {})
    deadline = time.monotonic() + 10
    while samples(render(tmp_path)).get('dlu_job_stage_code{dlu_job="m"}') != 5:
        assert time.monotonic() < deadline, render(tmp_path)
        time.sleep(0.05)


def test_label_values_are_escaped(tmp_path: Path) -> None:
    JobMetrics('a"b\\c', LocalMetricsBackend(tmp_path, "x")).failover_done("role", 1.0)
    assert 'dlu_failover_seconds_total{dlu_job="a\\"b\\\\c",tier="role"} 1.0' in render(tmp_path)


def test_the_endpoint_serves_over_http_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(local_metrics.PORT_ENV, raising=False)
    endpoint = local_metrics.start_endpoint()
    assert endpoint is not None
    try:
        assert endpoint.url == f"http://127.0.0.1:{endpoint.port}/metrics"
        backend = local_metrics.backend_from_env()  # what a Ray worker of this driver finds
        assert backend is not None and backend.store.path.parent == endpoint.directory
        JobMetrics("served", backend).failover_done("job", 0.5)
        with urllib.request.urlopen(endpoint.url, timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = response.read().decode()
        assert samples(text)['dlu_failover_duration_seconds_sum{dlu_job="served",tier="job"}'] == 0.5
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/other", timeout=10)
        with pytest.raises(DLUError, match=local_metrics.PORT_ENV):  # the port is taken
            local_metrics.LocalEndpoint(endpoint.port)
    finally:
        endpoint.close()
    assert not endpoint.directory.exists()
    assert local_metrics.backend_from_env() is None


@pytest.mark.parametrize(("raw", "port"), [("", 0), ("0", 0), ("9464", 9464), ("off", None), ("OFF", None)])
def test_the_port_setting(monkeypatch: pytest.MonkeyPatch, raw: str, port: int | None) -> None:
    monkeypatch.setenv(local_metrics.PORT_ENV, raw)
    assert local_metrics.port_from_env() == port


@pytest.mark.parametrize("raw", ["-1", "http", "70000", "٣", "1_0"])
def test_a_bad_port_setting_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(local_metrics.PORT_ENV, raw)
    with pytest.raises(DLUError, match=f"{local_metrics.PORT_ENV}=.*give a port number"):
        local_metrics.port_from_env()


def test_the_metrics_doc_lists_exactly_the_series_defined() -> None:
    """docs/metrics.md's table: one row per series, with its type and labels as the code has them."""
    rows = re.findall(
        r"^\| `(dlu_[a-z_]+)` \| (\w+) \| ([^|]+) \|", (REPO / "docs" / "metrics.md").read_text(), re.M
    )
    documented = {name: (kind, tuple(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}
    assert len(documented) == len(rows), "a series is listed twice"
    assert documented == {s.name: (s.kind, s.labels) for s in SERIES}


def test_soak_an_idle_store_writes_nothing(tmp_path: Path) -> None:
    """The flusher's period passes 10 times with nothing recorded: the file is not written again."""
    backend = LocalMetricsBackend(tmp_path, "m.prime-master")
    metrics = JobMetrics("m", backend)
    metrics.observe_state(job_state(), {})  # a gauge: written by the flusher within a period
    deadline = time.monotonic() + 10
    while 'dlu_job_stage_code{dlu_job="m"}' not in render(tmp_path):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(local_metrics.FLUSH_S * 2)
    written = backend.store.path.stat().st_mtime_ns
    time.sleep(local_metrics.FLUSH_S * 10)
    assert backend.store.path.stat().st_mtime_ns == written
