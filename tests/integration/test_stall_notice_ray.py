"""A job where nothing moves is reported (not failed) on a real local Ray, naming what waits on
what; a healthy job is never reported however many stall timeouts it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlu_api.cli.render import status_text
from dlu_api.spec import spec_from_dict
from dlu_api.status import JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

HERE = Path(__file__).resolve().parent  # workloads.py
ROOT = HERE.parents[1]


def pipeline(name: str, roles: list[str], **extra: Any) -> dict[str, Any]:
    """The pipeline example's roles (`examples.pipeline.roles`), only those named."""
    sizes = {"tokenizer": 2}
    return {
        "name": name,
        "device_type": "CPU",
        "device_per_node": 0,
        "roles": [
            {
                "name": role,
                "entrypoint": f"examples.pipeline.roles:{role}",
                "total": sizes.get(role, 1),
                "is_driver": role == "trainer",
                "resources": {"cpu": 0.1},
            }
            for role in roles
        ],
        **extra,
    }


def test_a_channel_nobody_writes_is_reported_naming_the_channel_and_its_readers(ray_session: Any) -> None:
    """The README's old job, with channel names the static check cannot read (they come from
    the config): tokenizers read "raw", the trainer "batches", and nobody writes either. The
    stall is reported, the job keeps RUNNING (no restart), `dlu status` says it. On a loaded
    machine a first stall may be seen before the workers reach their channels: it is cleared
    when they do, and the next one names the channels."""
    from dlu_prime import launcher

    roles = [
        {"name": "tokenizer", "total": 2, "is_driver": False},
        {"name": "trainer"},
    ]
    spec = spec_from_dict(
        {
            "name": "stall-silent",
            "device_type": "CPU",
            "device_per_node": 0,
            "config": {"inputs": {"tokenizer": "raw", "trainer": "batches"}},
            "roles": [
                {"entrypoint": "workloads:read_configured_channel", "resources": {"cpu": 0.1}, **role}
                for role in roles
            ],
            "health": {"stall_timeout_s": 3},
        }
    )
    seen: list[JobStatus] = []

    def on_update(status: JobStatus) -> None:
        named = [e for e in status.events if e.kind == "stalled" and "channel 'raw'" in e.message]
        if named and not seen:
            seen.append(status)
            launcher.stop_job(spec.name, "test: stall seen")

    launcher.submit_job(spec, str(HERE))
    final = launcher.wait_job(spec, on_update)

    kinds = [e.kind for e in final.events if e.kind in ("stalled", "progress_resumed")]
    assert seen, f"no stall naming the channels: {[(e.kind, e.message) for e in final.events]}"
    assert kinds == ["stalled", "progress_resumed"] * (len(kinds) // 2) + ["stalled"], kinds  # once each
    message = [e for e in final.events if e.kind == "stalled"][-1].message
    assert "tokenizer ranks 0,1 wait(s) on channel 'raw': nobody has written to it" in message, message
    assert "trainer rank 0 wait(s) on channel 'batches': nobody has written to it" in message, message
    assert final.first_failure is None and final.global_restart_count == 0 and final.job_restart_count == 0
    assert all(r.restart_count == 0 for r in final.roles)
    assert final.reason == "test: stall seen"
    # While it stood, `dlu status` showed the notice.
    assert f"stalled: {message}" in status_text(seen[0])


@pytest.mark.parametrize(
    ("records", "timeout_s"), [(96, 3), pytest.param(240, 6, marks=pytest.mark.soak)], ids=["short", "long"]
)
def test_soak_a_progressing_pipeline_is_never_reported(
    ray_session: Any, records: int, timeout_s: int
) -> None:
    """About 12 s (`long`: 30 s) of steady progress through every channel with a 3 s (6 s) stall
    timeout, 4 (5) times over, channels polled every quarter timeout: no stall event."""
    from dlu_prime import launcher

    config = {"records": records, "batch_size": 8, "tokenize_delay_s": 0.25}
    roles = ["source", "tokenizer", "sampler", "trainer"]
    spec = spec_from_dict(
        pipeline(f"stall-soak-{records}", roles, config=config, health={"stall_timeout_s": timeout_s})
    )
    final = launcher.run_job(spec, str(ROOT))
    assert final.exit_code == 0, final.reason
    kinds = [e.kind for e in final.events]
    assert "stalled" not in kinds and "progress_resumed" not in kinds, kinds
