"""The agent-hosted TCPStore across an in-place restart: the last round's store is ended once
the next round trains (not during its start, where its exit would take CPU from the new
processes), and nothing of either round's store is left when the job ends. Real processes:
a store that serves is one whose port accepts connections."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from lm_jobs import status_of, wait_until
from test_elastic import elastic_job

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

HERE = Path(__file__).parent
ENTRY = "elastic_workloads:beat_then_fail_on_first_attempt"


def _serves(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _port(out: Path, attempt: int) -> int:
    return int(json.loads((out / f"ran-0-{attempt}.json").read_text())["master_port"])


def test_the_last_rounds_store_ends_once_the_next_round_trains(ray_session: Any, tmp_path: Path) -> None:
    from dlu_prime import launcher

    spec = elastic_job("el-store-rounds", ENTRY, 1, 2, env={"OUT_DIR": str(tmp_path)})
    launcher.submit_job(spec, str(HERE))
    try:
        wait_until("the first round", lambda: (tmp_path / "ran-0-0.json").exists(), timeout_s=60)
        first = _port(tmp_path, 0)
        wait_until("the second round", lambda: (tmp_path / "ran-0-1.json").exists(), timeout_s=60)
        second = _port(tmp_path, 1)
        assert first != second
        # The second round trains (it beats until told to finish): its store serves, the
        # first round's is gone.
        wait_until("the first round's store to end", lambda: not _serves(first), timeout_s=30)
        assert _serves(second)
        (tmp_path / "go").write_text("")
        wait_until("the job to stop", lambda: (s := status_of(spec.name)) is not None and s.stage.value == "STOPPED",
                   timeout_s=60)  # fmt: skip
    finally:
        launcher.stop_job(spec.name, "test over")
        status = launcher.wait_job(spec)
    assert status.exit_code == 0, status.reason
    (role,) = status.roles
    assert role.inplace_restart_count == 1 and role.restart_count == 0
    wait_until("the second round's store to end", lambda: not _serves(second), timeout_s=30)
