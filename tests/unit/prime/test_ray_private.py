"""The private Ray symbols DLU uses still exist with the shape it expects (one test each, which
names the symbol and the Ray version when Ray changed it), and DLU falls back when one does not."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import ray

from dlu_prime import ray_private

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("key", sorted(ray_private.SYMBOLS))
def test_private_symbol_is_still_there(key: str) -> None:
    found = ray_private.problem(key)
    assert found is None, (
        f"Ray {ray.__version__} changed {ray_private.SYMBOLS[key].name}: {found}. "
        f"Without it: {ray_private.SYMBOLS[key].fallback}. Fix dlu_prime/ray_private.py."
    )


def test_nil_job_id_is_rays() -> None:
    assert ray.JobID.nil().hex() == ray_private.NIL_JOB, f"Ray {ray.__version__} has another nil job id"


def test_rays_core_reads_the_job_id_from_the_environment() -> None:
    core = Path(ray.__file__).with_name("_raylet.so")
    assert ray_private.JOB_ENV.encode() in core.read_bytes(), (
        f"Ray {ray.__version__}'s core no longer names {ray_private.JOB_ENV}: the Ray zygote's nil job breaks"
    )


def test_rays_worker_script_is_where_the_zygote_looks() -> None:
    script = ray_private.default_worker_script()
    assert script is not None and os.path.isfile(script), f"Ray {ray.__version__} moved its worker script"


def test_a_changed_symbol_is_reported_with_its_name_and_the_ray_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(
        ray_private.SYMBOLS, "resolve_ip", ray_private.SYMBOLS["resolve_ip"]._replace(params=("host", "gone"))
    )
    found = ray_private.problem("resolve_ip")
    assert found is not None
    assert (
        "ray._private.services.resolve_ip_for_localhost" in found
        and ray.__version__ in found
        and "gone" in found
    )
    missing = ray_private.Private("ray._private.services", "no_such_function")
    monkeypatch.setitem(ray_private.SYMBOLS, "resolve_ip", missing)
    assert "no_such_function is gone in Ray " + ray.__version__ in (ray_private.problem("resolve_ip") or "")


def test_a_missing_symbol_falls_back_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ray._private import services

    monkeypatch.setattr(ray_private, "_checked", {})
    monkeypatch.setitem(
        ray_private.SYMBOLS, "resolve_ip", ray_private.Private("ray._private.services", "gone_fn")
    )
    original = services.resolve_ip_for_localhost
    with caplog.at_level(logging.WARNING, logger=ray_private.__name__):
        for _ in range(2):
            with ray_private.pin_loopback():
                assert services.resolve_ip_for_localhost is original  # plain Ray
    warnings = [r for r in caplog.records if "gone_fn" in r.getMessage()]
    assert len(warnings) == 1 and "falls back" in warnings[0].getMessage()


def test_the_store_fails_loudly_without_the_kv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_private, "_checked", {})
    monkeypatch.setitem(
        ray_private.SYMBOLS, "kv_get", ray_private.Private("ray.experimental.internal_kv", "gone")
    )
    with pytest.raises(ray_private.RayInternalsChanged, match=r"internal_kv\.gone is gone in Ray"):
        ray_private.kv_get("k", "ns")


def test_pin_loopback_keeps_loopback_only_while_it_runs_then_restores_ray() -> None:
    from ray._private import services

    original = services.resolve_ip_for_localhost
    with ray_private.pin_loopback():
        assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"
        assert services.resolve_ip_for_localhost("::1") == "::1"
        assert services.resolve_ip_for_localhost("10.1.2.3") == "10.1.2.3"
        with ray_private.pin_loopback():  # nested: the outer one's stays until the outer ends
            pass
        assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"
    assert services.resolve_ip_for_localhost is original


def test_pin_loopback_restores_ray_after_an_error() -> None:
    from ray._private import services

    original = services.resolve_ip_for_localhost
    with pytest.raises(RuntimeError), ray_private.pin_loopback():
        raise RuntimeError("ray.init failed")
    assert services.resolve_ip_for_localhost is original
