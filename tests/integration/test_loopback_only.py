"""A local job listens on loopback only: every TCP socket in LISTEN state held by a process of
`dlu run`'s embedded Ray session (GCS, raylet, its agents, the Ray workers that host the
PrimeMaster and the role actors, the elastic rendezvous gRPC server, the training processes and
their process group, the zygotes) is bound to 127.0.0.1 or ::1, none to 0.0.0.0 or ::."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runs import Box, session_processes, short_dir, wait_until
from listen_sockets import Listener, listeners
from proc_checks import descendants, processes

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

SPEC = """
name: loopback
device_type: CPU
device_per_node: 0
node_num: 1
health: {{monitor_interval_s: 0.2}}
roles:
  - name: trainer
    kind: elastic
    entrypoint: elastic_workloads:allreduce_then_hang
    resources: {{cpu: 0.25}}
    env: {{OUT_DIR: {out}}}
    elastic: {{nnodes: 1, nproc_per_node: 2, node_check: {{enabled: false}}}}
"""


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    made = Box(tmp_path / "home", zygotes=short_dir("dlu-z-"))  # its own: what runs there is the run's
    yield made
    made.end()


def _session_pids(box: Box, run_pid: int) -> set[int]:
    """The run's Ray session and everything this test's zygotes run (the training processes)."""
    table = processes()
    run = next(r for r in box.runs if r.pid == run_pid)
    pids = {p.pid for p in session_processes(run, box.zygotes)} | {run_pid}
    zygotes = {p.pid for p in table.values() if "dlu_prime.zygote" in p.cmdline and box.zygotes in p.cmdline}
    for root in zygotes:
        pids |= descendants(table, root)
    return pids | zygotes


def _describe(found: list[Listener]) -> str:
    return "; ".join(f"{x.name}[{x.pid}] {x.host}:{x.port}" for x in found)


def test_a_local_job_listens_on_loopback_only(box: Box, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC.format(out=out))
    run = box.start(spec)
    wait_until(lambda: len(list(out.glob("ready-*.json"))) == 2, "both ranks past their allreduce", run)
    found = listeners(_session_pids(box, run.pid))
    names = {x.name for x in found}
    assert {"gcs_server", "raylet"} <= names, _describe(found)  # the session was seen
    assert any(x.name.startswith("ray::") for x in found), _describe(found)  # its workers too
    exposed = [x for x in found if not x.loopback]
    assert not exposed, f"listening beyond loopback: {_describe(exposed)} (all: {_describe(found)})"
