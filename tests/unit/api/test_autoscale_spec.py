"""The `autoscale:` switch of the job spec: its default, its bounds, and the errors that name the
field and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from dlu_api.errors import SpecError
from dlu_api.spec import AutoscaleMode, job_schema, spec_from_dict
from dlu_api.spec.autoscale_settings import BrainUrlMissing, brain_url


def spec(autoscale: dict[str, Any] | None = None, **prep: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "job",
        "device_type": "CPU",
        "device_per_node": 0,
        "roles": [
            {
                "name": "trainer",
                "kind": "elastic",
                "entrypoint": "m:train",
                "resizable": True,
                "elastic": {"nnodes": "1:4"},
            },
            {
                "name": "prep",
                "entrypoint": "m:prep",
                "resizable": True,
                "max_total": 8,
                "is_driver": False,
                **prep,
            },
        ],
    }
    if autoscale is not None:
        data["autoscale"] = autoscale
    return data


def problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as caught:
        spec_from_dict(data)
    return [str(p) for p in caught.value.problems]


def test_off_by_default_so_sizes_change_only_when_asked() -> None:
    settings = spec_from_dict(spec()).autoscale
    assert settings.mode is AutoscaleMode.OFF and not settings.on
    assert settings.marginal_threshold == 0.3 and settings.backlog_roles == {}


def test_the_switch_is_in_the_json_schema() -> None:
    schema = job_schema()
    assert "autoscale" in schema["properties"]
    modes = schema["$defs"]["AutoscaleMode"]["enum"]
    assert modes == ["off", "single-job", "cluster"]


def test_a_full_switch_parses() -> None:
    settings = spec_from_dict(
        spec(
            {
                "mode": "single-job",
                "marginal_threshold": 0.5,
                "backlog_roles": {"prep": "samples"},
                "backlog_target_s": 10,
                "settle_s": 5,
            }
        )
    ).autoscale
    assert settings.mode is AutoscaleMode.SINGLE_JOB and settings.backlog_roles == {"prep": "samples"}


@pytest.mark.parametrize("threshold", [0, -0.1, 1.5])
def test_a_threshold_outside_zero_one_is_refused_with_the_field(threshold: float) -> None:
    (problem,) = problems(spec({"mode": "single-job", "marginal_threshold": threshold}))
    assert problem.startswith("autoscale.marginal_threshold:") and "outside (0, 1]" in problem


def test_a_threshold_of_one_is_linear_scaling_exactly() -> None:
    assert (
        spec_from_dict(spec({"mode": "single-job", "marginal_threshold": 1})).autoscale.marginal_threshold
        == 1
    )


def test_a_backlog_role_that_is_not_simple_is_refused() -> None:
    (problem,) = problems(spec({"mode": "single-job", "backlog_roles": {"trainer": "samples"}}))
    assert problem.startswith("autoscale.backlog_roles.trainer:") and "only a simple role" in problem


def test_a_backlog_role_needs_a_bound_and_resizable() -> None:
    found = problems(
        spec({"mode": "single-job", "backlog_roles": {"prep": "samples"}}, resizable=False, max_total=None)
    )
    assert any("not resizable" in p and "resizable: true" in p for p in found)
    assert any("no max_total" in p and "roles[prep].max_total" in p for p in found)


def test_an_unknown_backlog_role_names_the_known_ones() -> None:
    (problem,) = problems(spec({"mode": "single-job", "backlog_roles": {"nope": "samples"}}))
    assert "no role 'nope'" in problem and "prep, trainer" in problem


def test_an_autoscaled_job_with_nothing_to_size_is_refused() -> None:
    data = spec({"mode": "single-job"})
    data["roles"][0]["resizable"] = False
    (problem,) = problems(data)
    assert problem.startswith("autoscale.mode:") and "nothing to size" in problem
    assert "resources.memory" in problem


def test_a_role_with_a_memory_limit_is_something_to_size() -> None:
    data = spec({"mode": "single-job"})
    data["roles"][0]["resizable"] = False
    data["roles"][0]["resources"] = {"memory": "2GiB"}  # an actor near it is relaunched with more
    assert spec_from_dict(data).autoscale.on


def test_a_brain_url_that_is_not_a_url_is_refused() -> None:
    (problem,) = problems(spec({"mode": "cluster", "brain_url": "brain:8470"}))
    assert problem.startswith("autoscale.brain_url:") and "http://HOST:PORT" in problem


def test_cluster_mode_takes_the_url_from_the_spec_then_the_environment() -> None:
    named = spec_from_dict(spec({"mode": "cluster", "brain_url": "http://head:8470"})).autoscale
    assert brain_url(named, {}) == "http://head:8470"
    unnamed = spec_from_dict(spec({"mode": "cluster"})).autoscale
    assert brain_url(unnamed, {"DLU_BRAIN_URL": "http://other:1"}) == "http://other:1"
    assert brain_url(spec_from_dict(spec({"mode": "single-job"})).autoscale, {}) is None


def test_cluster_mode_with_no_url_anywhere_says_where_to_put_one() -> None:
    unnamed = spec_from_dict(spec({"mode": "cluster"})).autoscale
    with pytest.raises(BrainUrlMissing) as caught:
        brain_url(unnamed, {})
    assert "autoscale.brain_url" in str(caught.value) and "DLU_BRAIN_URL" in str(caught.value)


def test_preflight_refuses_cluster_mode_with_no_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from dlu_prime.preflight import brain_problems

    monkeypatch.delenv("DLU_BRAIN_URL", raising=False)
    (problem,) = brain_problems(spec_from_dict(spec({"mode": "cluster"})))
    assert problem.field == "autoscale.brain_url"
    monkeypatch.setenv("DLU_BRAIN_URL", "http://head:8470")
    assert brain_problems(spec_from_dict(spec({"mode": "cluster"}))) == []


def test_the_launcher_hands_its_brain_url_to_the_primemaster(monkeypatch: pytest.MonkeyPatch) -> None:
    from dlu_prime.launcher import with_brain_url

    monkeypatch.setenv("DLU_BRAIN_URL", "http://head:8470")
    passed = with_brain_url(spec_from_dict(spec({"mode": "cluster"})))
    assert passed.autoscale.brain_url == "http://head:8470"  # in the spec the PrimeMaster is given
    named = spec_from_dict(spec({"mode": "cluster", "brain_url": "http://mine:1"}))
    assert with_brain_url(named).autoscale.brain_url == "http://mine:1"
    single = spec_from_dict(spec({"mode": "single-job"}))
    assert with_brain_url(single) is single
