"""The example pipeline under SIGKILL: every record reaches the trainer exactly once.

`examples/pipeline` (source -> tokenizer x2 -> sampler -> trainer) with a slowed tokenizer runs
under each recovery policy while the test kills, one after another and mid-stream, by PID: the
source (a producer), a tokenizer (a consumer and a producer) and the trainer (a stateful
consumer). Each kill is one recovery; the job exits 0 and the ids the trainer saw are exactly
0..records-1, each once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlu_api.spec import load_spec, spec_from_dict
from dlu_api.status import JobStage, JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.timeout(360)]

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 160

# recovery per role: every role alone ("in_place": the role tier restarts the killed actor),
# the whole job ("global": the job tier), and the mix (a tokenizer restarted alone,
# anything else restarting the job).
POLICIES: dict[str, dict[str, str | None]] = {
    "in_place": dict.fromkeys(("source", "tokenizer", "sampler", "trainer"), "in_place"),
    "global": dict.fromkeys(("source", "tokenizer", "sampler", "trainer"), "global"),
    "mixed": {"source": None, "tokenizer": "in_place", "sampler": None, "trainer": None},
}


def _spec(name: str, policy: dict[str, str | None], report: Path) -> Any:
    data = load_spec(ROOT / "examples/pipeline/job.yaml").model_dump(mode="json", exclude_unset=True)
    data["name"] = name
    # Small channels: a stage being recovered soon stalls the others (back-pressure), so the
    # stream is still under way when the next kill is due, however slow the machine.
    config = {"records": RECORDS, "capacity": 4, "tokenize_delay_s": 0.1, "report": str(report)}
    data["config"] = {**data["config"], **config}
    data["health"] = {"monitor_interval_s": 0.2}
    data["limits"] = {"global_restart_budget": 5, "job_max_restart": 5}
    for role in data["roles"]:
        if policy[role["name"]] is not None:
            role["recovery"] = policy[role["name"]]
    return spec_from_dict(data)


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class Pipeline:
    """The running job seen from the test: its status, its actors' PIDs, its channels."""

    def __init__(self, job: str) -> None:
        self.job = job

    def status(self) -> JobStatus:
        from dlu_prime import launcher

        status = launcher.job_status(self.job, events=500)
        assert status is not None, "the job's PrimeMaster is gone"
        return status

    def actor(self, name: str) -> dict[str, Any]:
        import ray

        from dlu_prime.naming import NAMESPACE

        return ray.get(ray.get_actor(name, namespace=NAMESPACE).status.remote(), timeout=10)

    def progress(self, channel: str) -> int:
        """Items the channel's consumers acknowledged (0 until the channel exists)."""
        from dlu_prime.runtime.data_channel import ChannelNotFoundError, DataChannel

        try:
            return int(DataChannel.open(self.job, channel).stats()["acked"])
        except ChannelNotFoundError:
            return 0

    def recovered(self, name: str, old_pid: int, done_before: int) -> bool:
        """The recovery of `name` is over: a failover finished, the job runs, so does a new
        process of `name`."""
        status = self.status()
        done = sum(e.kind == "failover_done" for e in status.events)
        if done <= done_before or status.stage is not JobStage.RUNNING:
            return False
        try:
            now = self.actor(name)
        except Exception:
            return False
        return now["stage"] == "RUNNING" and now["pid"] != old_pid

    def kill(self, name: str, channel: str, at_least: int) -> None:
        """SIGKILLs `name` once `channel` moved `at_least` items further, then waits out the recovery."""
        start = self.progress(channel)
        _wait(lambda: self.progress(channel) >= start + at_least, f"{channel} to move before killing {name}")
        seen = self.actor(name)
        assert seen["stage"] == "RUNNING", f"{name} is {seen['stage']}: the kill would not land mid-stream"
        done_before = sum(e.kind == "failover_done" for e in self.status().events)
        os.kill(int(seen["pid"]), signal.SIGKILL)
        _wait(lambda: self.recovered(name, int(seen["pid"]), done_before), f"{name} to be recovered")


def _timeline(status: JobStatus) -> str:
    start = status.events[0].time if status.events else 0.0
    return "\n".join(
        f"{e.time - start:7.2f} {e.kind} {e.tier or ''} {e.message[:120]}" for e in status.events
    )


@pytest.mark.parametrize(
    "policy", ["in_place", "global", pytest.param("mixed", marks=pytest.mark.soak)], ids=str
)
def test_every_record_reaches_the_trainer_exactly_once_through_kills(
    ray_session: Any, tmp_path: Path, policy: str
) -> None:
    from dlu_prime import launcher

    report = tmp_path / "seen.json"
    spec = _spec(f"eo-{policy.replace('_', '-')}", POLICIES[policy], report)
    launcher.submit_job(spec, str(ROOT))
    job = Pipeline(spec.name)
    try:
        # The tokenizer first: while it is recovered alone the other one goes on, at half speed.
        job.kill(f"{spec.name}.tokenizer.1", "raw", at_least=10)  # a consumer and producer
        job.kill(f"{spec.name}.source.0", "raw", at_least=10)  # a producer
        job.kill(f"{spec.name}.trainer.0", "batches", at_least=1)  # a stateful consumer
    finally:
        final = launcher.wait_job(spec)

    timeline = _timeline(final)
    assert final.exit_code == 0, f"{final.reason}\n{timeline}"
    seen = json.loads(report.read_text())
    assert Counter(seen) == Counter(range(RECORDS)), "each record exactly once at the trainer"
    tiers = [e.tier for e in final.events if e.kind == "failover_started"]
    expected = {"in_place": ["role"] * 3, "global": ["job"] * 3, "mixed": ["role", "job", "job"]}
    assert tiers == expected[policy], f"one recovery per kill, at the policy's tier\n{timeline}"
    assert final.global_restart_count == tiers.count("job")
