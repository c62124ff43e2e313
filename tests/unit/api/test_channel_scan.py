"""The pre-flight's channel scan reads a role's source without walking it when the source never
names a channel (dlu_api.spec.channels.role_use): what it finds must be what the walk finds."""

from __future__ import annotations

from pathlib import Path

from dlu_api.spec import spec_from_dict
from dlu_api.spec.channels import channel_problems, role_use
from dlu_api.spec.models import JobSpec


def _job(*entrypoints: str) -> JobSpec:
    roles = [{"name": f"r{i}", "entrypoint": e, "resources": {"cpu": 0.1}} for i, e in enumerate(entrypoints)]
    return spec_from_dict({"name": "scan", "device_type": "CPU", "device_per_node": 0, "roles": roles})


def test_a_script_that_names_no_channel_uses_none(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text("def main():\n    print('no data here')\n\nmain()\n")
    found = role_use("plain.py", [str(tmp_path)])
    assert found is not None
    use, path = found
    assert (use.reads, use.writes, use.unknown) == ({}, {}, False)
    assert path == tmp_path / "plain.py"


def test_a_reader_beside_a_role_that_names_no_channel_is_reported(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text("print('no data here')\n")
    (tmp_path / "reader.py").write_text(
        "from dlu_prime.runtime import channel as ch\n\nfor item in ch('raw').iterate():\n    pass\n"
    )
    spec = _job("plain.py", "reader.py")
    [problem] = channel_problems(spec, str(tmp_path))
    assert problem.field == "roles[r1].entrypoint" and "'raw'" in problem.message


def test_a_script_that_cannot_be_parsed_is_still_unknown(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def main(:\n")
    assert role_use("broken.py", [str(tmp_path)]) is None
