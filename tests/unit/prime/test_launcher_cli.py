"""`python -m dlu_prime`: the version check against a driver's dlu-api, before any Ray work."""

from __future__ import annotations

import json

import pytest

from dlu_api.client import wire
from dlu_prime import __main__ as prime_main
from dlu_prime import compat


def test_the_declared_range_decides() -> None:
    requirement = compat.api_requirement()
    assert requirement is not None
    assert str(requirement.specifier) == "<0.2,>=0.1.0"
    assert compat.api_version_problem("0.1.0") is None
    assert compat.api_version_problem("0.1.7") is None


@pytest.mark.parametrize("driver", ["0.2.0", "1.0.0", "0.0.9", "not-a-version"])
def test_other_versions_are_refused_with_the_fix(driver: str) -> None:
    problem = compat.api_version_problem(driver)
    assert problem is not None
    assert f"the driver's dlu-api {driver} does not work with this cluster's dlu-prime 0.1.0" in problem
    assert "pip install 'dlu-api<0.2,>=0.1.0'" in problem


def test_without_metadata_major_minor_of_the_local_dlu_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "api_requirement", lambda: None)
    assert compat.api_version_problem("0.1.9") is None
    assert compat.api_version_problem("0.2.0") is not None


def test_launcher_refuses_a_mismatched_driver_before_connecting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dlu_prime import ray_env

    def no_ray(address: str = "auto") -> None:
        raise AssertionError("must not connect to Ray")

    monkeypatch.setattr(ray_env, "connect", no_ray)
    code = prime_main.main(["launch", "--api-version", "0.9.0", "--spec-json", "{}"])
    assert code == prime_main.EXIT_VERSION
    out, err = capsys.readouterr()
    assert "error: the driver's dlu-api 0.9.0 does not work" in err
    report = wire.parse_log(out)
    assert report.error is not None
    assert report.error["kind"] == wire.KIND_VERSION


def test_wire_lines_round_trip() -> None:
    line = wire.line(wire.ERROR, {"kind": "spec", "message": "a\nb", "problems": []})
    assert "\n" not in line
    assert wire.parse_log(f"x\n{line}\nDLU-STATUS not json\n").error == json.loads(line.split(" ", 1)[1])
    assert wire.parse_log("DLU-STATUS not json").other_lines == ["DLU-STATUS not json"]
    assert wire.major_minor("1.2.3rc1") == (1, 2)
    assert wire.major_minor("x") is None


def test_launcher_refuses_a_bad_status_interval_before_connecting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dlu_prime import ray_env

    def no_ray(address: str = "auto") -> None:
        raise AssertionError("must not connect to Ray")

    monkeypatch.setattr(ray_env, "connect", no_ray)
    monkeypatch.setenv("DLU_STATUS_INTERVAL_S", "-1")
    spec = {
        "name": "demo",
        "device_type": "CPU",
        "device_per_node": 0,
        "roles": [{"name": "w", "entrypoint": "examples.hello.workers:main"}],
    }
    code = prime_main.main(["launch", "--spec-json", json.dumps(spec)])
    assert code == prime_main.EXIT_REFUSED
    out, err = capsys.readouterr()
    assert "DLU_STATUS_INTERVAL_S='-1' is not allowed" in err
    assert (wire.parse_log(out).error or {}).get("kind") == wire.KIND_OTHER
