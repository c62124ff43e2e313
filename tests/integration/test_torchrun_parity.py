"""One unmodified torchrun script under real torchrun and under DLU: the same environment,
variable by variable (only the differences docs/torchrun.md lists); and after a crash, one
restart count for the whole round, the rank's `@record` error file in the failure, and a
recovery that completes though the script never calls heartbeat()."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlu_api import from_torchrun_cmd
from dlu_api.recovery import recoveries
from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

HERE = Path(__file__).parent
SCRIPT = "torchrun_env_script.py"
FLAGS = "--nnodes=1 --nproc-per-node=2 --max-restarts=3"

# What torchrun sets that DLU sets to another value, on purpose (docs/torchrun.md, "Environment"):
# its own rendezvous address and run id, its error file next to the rank logs, the role's name.
DIFFERENT_VALUE = frozenset(
    {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "ROLE_NAME"}
)


def dlu_job(name: str, command: str, env: dict[str, str]) -> Any:
    spec = from_torchrun_cmd(command, name=name, device_type="CPU")
    data = spec.model_dump(mode="json")
    role = data["roles"][0]
    role["elastic"]["node_check"]["enabled"] = False
    role["resources"]["cpu"] = 0.25
    role["env"] = env
    return spec_from_dict(data)


def run(spec: Any) -> JobStatus:
    from dlu_prime import launcher

    return launcher.run_job(spec, str(HERE))


def envs(out: Path, attempt: int) -> dict[int, dict[str, str]]:
    found = {}
    for path in out.glob(f"env-r*-a{attempt}.json"):
        rank = int(path.name.split("-")[1][1:])
        found[rank] = json.loads(path.read_text())["env"]
    return found


def test_dlu_gives_a_script_torchruns_environment(ray_session: Any, tmp_path: Path) -> None:
    under_torchrun, under_dlu = tmp_path / "torchrun", tmp_path / "dlu"
    under_torchrun.mkdir()
    under_dlu.mkdir()
    launch_env = {**os.environ, "OUT_DIR": str(under_torchrun)}
    launch_env.pop("OMP_NUM_THREADS", None)
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *FLAGS.split(), SCRIPT],
        cwd=HERE,
        env=launch_env,
        check=True,
        timeout=120,
        capture_output=True,
    )
    status = run(dlu_job("parity-env", f"torchrun {FLAGS} {SCRIPT}", {"OUT_DIR": str(under_dlu)}))
    assert status.exit_code == 0, status.reason

    reference, ours = envs(under_torchrun, 0), envs(under_dlu, 0)
    assert sorted(reference) == sorted(ours) == [0, 1]
    for rank in (0, 1):
        # what torchrun sets: every variable its worker has that its launcher did not
        torchrun_sets = {k: v for k, v in reference[rank].items() if launch_env.get(k) != v}
        torchrun_sets.pop("OUT_DIR", None)
        assert {"GROUP_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_ERROR_FILE"} <= set(torchrun_sets)
        missing = sorted(set(torchrun_sets) - set(ours[rank]))
        assert missing == [], f"rank {rank}: DLU does not set {missing}"
        differ = {
            k: (v, ours[rank][k])
            for k, v in torchrun_sets.items()
            if ours[rank][k] != v and k not in DIFFERENT_VALUE
        }
        assert differ == {}, f"rank {rank}: torchrun's value, DLU's: {differ}"
        assert ours[rank]["TORCHELASTIC_ERROR_FILE"], "an error file is given"
        assert ours[rank]["ROLE_NAME"] == "trainer"


def test_a_crash_restarts_one_round_reads_the_error_file_and_recovers(
    ray_session: Any, tmp_path: Path
) -> None:
    """Two nodes of one rank each; rank 1 crashes once through `@record`."""
    env = {"OUT_DIR": str(tmp_path), "CRASH_ONCE": "1", "HOLD_S": "4"}
    status = run(dlu_job("parity-crash", f"torchrun --nnodes=2 --nproc-per-node=1 {SCRIPT}", env))
    assert status.exit_code == 0, status.reason
    assert (tmp_path / "crashed").read_text() == "1"
    first = envs(tmp_path, 0)
    assert sorted(first) == [0, 1]
    later = sorted(tmp_path.glob("env-r*-a*.json"))
    counts = {p.name.split("-a")[1].removesuffix(".json") for p in later if not p.name.endswith("-a0.json")}
    assert len(counts) == 1, f"one restart count for the whole round: {[p.name for p in later]}"
    after = envs(tmp_path, int(counts.pop()))
    assert sorted(after) == [0, 1], "every rank of the new round reads the same count"
    restarts = [e for e in status.events if e.kind == "inplace_restart"]
    assert len(restarts) == 1, [(e.kind, e.message) for e in status.events]
    assert "injected crash of rank 1" in restarts[0].message
    # the script never calls heartbeat(): recovery completes once the new processes run
    done = [e for e in status.events if e.kind == "failover_done"]
    assert [(e.tier, e.role) for e in done] == [("in_place", "trainer")], done
    assert done[0].duration_s is not None and done[0].duration_s > 0
    assert [r.recovered for r in recoveries(status.events)] == [True]


def test_the_error_file_record_wrote_is_the_stop_reason(ray_session: Any, tmp_path: Path) -> None:
    """--max-restarts=0, as torchrun: the crash stops the job, and its reason is what `@record`
    wrote to the rank's error file."""
    env = {"OUT_DIR": str(tmp_path), "CRASH_ONCE": "1"}
    status = run(dlu_job("parity-error-file", f"torchrun --nnodes=2 --max-restarts=0 {SCRIPT}", env))
    assert status.exit_code == 1
    reason = status.reason or ""
    assert "(from the rank's error file " in reason, reason
    assert reason.rstrip().endswith("RuntimeError: injected crash of rank 1"), reason
    path = reason.split("(from the rank's error file ", 1)[1].split(")", 1)[0]
    written = json.loads(Path(path).read_text())  # torch's own format, as @record wrote it
    assert written["message"]["message"] == "RuntimeError: injected crash of rank 1"


def test_a_replaced_rank_reads_the_restart_count_of_its_round(ray_session: Any, tmp_path: Path) -> None:
    """Rank 1's actor is killed while it trains; Ray replaces it. Every rank of the new round,
    the replacement included, reads one restart count, in one process group."""
    import os
    import signal
    import time

    import ray

    from dlu_prime import launcher
    from dlu_prime.naming import NAMESPACE

    env = {"OUT_DIR": str(tmp_path), "HOLD_FIRST_S": "120"}
    spec = dlu_job("parity-replace", f"torchrun --nnodes=2 --nproc-per-node=1 {SCRIPT}", env)
    launcher.submit_job(spec, str(HERE))
    deadline = time.monotonic() + 120
    while len(envs(tmp_path, 0)) < 2:
        assert time.monotonic() < deadline, "the first round never trained"
        time.sleep(0.2)
    victim = ray.get_actor("parity-replace.trainer.1", namespace=NAMESPACE)
    os.kill(int(ray.get(victim.status.remote(), timeout=30)["pid"]), signal.SIGKILL)
    status = launcher.wait_job(spec)
    assert status.exit_code == 0, status.reason
    rounds: dict[str, dict[int, dict[str, Any]]] = {}
    for path in tmp_path.glob("env-r*-a*.json"):
        count = path.stem.split("-a")[1]
        rounds.setdefault(count, {})[int(path.name.split("-")[1][1:])] = json.loads(path.read_text())
    last = max(rounds, key=int)
    assert int(last) > 0 and sorted(rounds[last]) == [0, 1], sorted((c, sorted(r)) for c, r in rounds.items())
    assert {r["env"]["TORCHELASTIC_RESTART_COUNT"] for r in rounds[last].values()} == {last}
    assert [(r["world"], r["sum"]) for r in rounds[last].values()] == [(2, 3.0)] * 2  # one group
    actors = {a.name: a for a in status.roles[0].actors}
    assert actors["parity-replace.trainer.1"].restart_count == 1  # it was replaced, by Ray
    found = recoveries(status.events)
    assert found and all(r.recovered for r in found), [(e.kind, e.message) for e in status.events]


def test_an_error_file_is_read_after_an_exit_without_a_traceback(ray_session: Any, tmp_path: Path) -> None:
    """The rank writes its error file and leaves by os._exit(3): no Python failure to catch, yet
    the stop reason says what the file says."""
    env = {"OUT_DIR": str(tmp_path), "CRASH_ONCE": "1", "CRASH_HARD": "1"}
    status = run(dlu_job("parity-hard-exit", f"torchrun --nnodes=2 --max-restarts=0 {SCRIPT}", env))
    assert status.exit_code == 1
    reason = status.reason or ""
    assert "exited with code 3" in reason and "(from the rank's error file " in reason, reason
    assert "RuntimeError: hard crash of rank 1" in reason, reason
