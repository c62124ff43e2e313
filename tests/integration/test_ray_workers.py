"""The embedded Ray's worker processes fork from a zygote with Ray preloaded
(dlu_prime.ray_workers): they do, they die with what the raylet started, the raylet's kill of a
worker gets the actor rebuilt, and a killed zygote stops nothing. Each case runs an embedded
Ray in a fresh interpreter with its own Ray and zygote folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from dlu_prime import ray_env, zygote
from dlu_prime.ray_workers import ENABLE_ENV

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

HERE = Path(__file__).resolve().parent


def _probe(fault: str, **env: str) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="dlu-rw-", dir="/tmp"))
    zygotes = folder / "z"
    zygotes.mkdir()
    try:
        proc = subprocess.run(
            [sys.executable, str(HERE / "ray_worker_probe.py"), fault],
            env={**os.environ, "RAY_TMPDIR": str(folder), zygote.DIR_ENV: str(zygotes), **env},
            capture_output=True,
            text=True,
            timeout=200,
        )
    finally:
        zygote.stop_all(zygotes)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


def test_an_actors_worker_is_forked_and_rebuilt_when_killed() -> None:
    seen = _probe("kill_worker")
    assert seen["forked"], "the actor's process is a child of the Ray zygote"
    # what the raylet passed on to the worker: the raylet itself ran with the short retry
    assert seen["first"]["retry"] == ray_env.FAST_CONNECT_RETRY
    assert seen["entry_gone"], "the process the raylet started exits with its worker"
    assert seen["answers"] and seen["restarted"], "Ray rebuilt the actor and it answers"


def test_a_worker_dies_with_the_process_the_raylet_started() -> None:
    seen = _probe("kill_entry")
    assert seen["forked"]
    assert seen["worker_gone"], "a SIGKILL from the raylet reaches the forked worker"
    assert seen["answers"] and seen["restarted"]


def test_a_killed_zygote_stops_no_worker_and_no_new_one() -> None:
    seen = _probe("kill_zygote")
    assert seen["forked"]
    assert seen["still_answers"], "a running worker outlives its zygote"
    assert seen["new_actor"], "a new worker starts (from a new zygote)"
    assert seen["worker_gone"] and seen["entry_gone"], "ray.kill still ends a worker whose zygote is gone"


def test_the_zygote_can_be_turned_off() -> None:
    seen = _probe("kill_worker", **{ENABLE_ENV: "0"})
    assert not seen["forked"]
    assert seen["answers"] and seen["restarted"]
