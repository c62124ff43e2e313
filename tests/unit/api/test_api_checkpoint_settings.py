"""The elastic role's `checkpoint` section: validated before anything starts."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from dlu_api.spec import spec_from_dict


def job(checkpoint: Any) -> Any:
    return spec_from_dict(
        {
            "name": "ck",
            "device_type": "CPU",
            "device_per_node": 0,
            "node_num": 1,
            "roles": [
                {
                    "name": "trainer",
                    "kind": "elastic",
                    "entrypoint": "train.py",
                    "elastic": {"nnodes": 1, "checkpoint": checkpoint},
                }
            ],
        }
    )


def test_a_valid_section_and_its_absence() -> None:
    spec = job({"persist_every": 5, "dir": "/mnt/ck"})
    settings = spec.roles[0].elastic.checkpoint
    assert settings is not None and (settings.persist_every, settings.dir) == (5, "/mnt/ck")
    assert settings.replicas == 0  # replicas on a buddy node: opt in
    assert job(None).roles[0].elastic.checkpoint is None
    with_replica = job({"persist_every": 5, "dir": "/mnt/ck", "replicas": 1}).roles[0].elastic.checkpoint
    assert with_replica is not None and with_replica.replicas == 1


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ({"persist_every": 0, "dir": "/mnt/ck"}, "persist_every"),
        ({"persist_every": 5, "dir": "relative/ck"}, "checkpoint.dir must be an absolute path"),
        ({"dir": "/mnt/ck"}, "persist_every"),
        ({"persist_every": 5}, "dir"),
        ({"persist_every": 5, "dir": "/mnt/ck", "replicas": 2}, "replicas"),
        ({"persist_every": 5, "dir": "/mnt/ck", "replicas": -1}, "replicas"),
    ],
)
def test_bad_sections_name_the_field(section: dict[str, Any], words: str) -> None:
    with pytest.raises((ValidationError, ValueError), match=words):
        job(section)
