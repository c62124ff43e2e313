"""Issue 27 defect 8: no write replaces a document of a newer schema than this dlu-prime knows.

An older release's `dlu run` of the same name used to replace such a document without a word,
losing the newer release's job state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlu_api.errors import SpecError
from dlu_prime import launcher
from dlu_prime.master.lost import close_lost_job
from dlu_prime.master.manager import PrimeManager
from dlu_prime.master.schema import SCHEMA_VERSION, SchemaVersionError, refuse_newer
from dlu_prime.state.memory import MemoryStateStore
from dlu_prime.testing.sim_scheduler import SimScheduler

pytestmark = pytest.mark.timeout(30)

FUTURE = (Path(__file__).parent / "state_fixtures" / "future_job_state_v10.json").read_bytes()


def _stored() -> MemoryStateStore:
    store = MemoryStateStore()
    store.put("lm", FUTURE, None)
    return store


def _spec(make_spec: Any) -> Any:
    return make_spec(name="lm")


def test_the_fixture_is_newer_than_this_release() -> None:
    with pytest.raises(
        SchemaVersionError, match=f"schema version 10, newer than this dlu-prime's {SCHEMA_VERSION}"
    ):
        refuse_newer("lm", FUTURE)
    refuse_newer("lm", b"not json")  # not a document of ours: left to whoever replaces it


@pytest.mark.parametrize("entry", ["create", "resume", "self_recover"])
def test_no_prime_manager_entry_replaces_a_newer_document(make_spec: Any, entry: str) -> None:
    store = _stored()
    spec = _spec(make_spec)
    with pytest.raises(SchemaVersionError, match="newer than this dlu-prime's"):
        getattr(PrimeManager, entry)(spec, SimScheduler(spec), store)
    found = store.get("lm")
    assert found is not None and (found.data, found.token) == (FUTURE, 1)


def test_closing_a_lost_job_does_not_replace_a_newer_document() -> None:
    store = _stored()
    with pytest.raises(SchemaVersionError):
        close_lost_job(store, "lm", "the PrimeMaster died")
    found = store.get("lm")
    assert found is not None and (found.data, found.token) == (FUTURE, 1)


@pytest.mark.parametrize("resume", [False, True])
def test_dlu_run_and_resume_refuse_before_creating_anything(
    make_spec: Any, monkeypatch: pytest.MonkeyPatch, resume: bool
) -> None:
    store = _stored()
    monkeypatch.setattr(launcher, "create_state_store", lambda name, options: store)
    monkeypatch.setattr(launcher, "preflight", lambda spec, workdir, code_checked=False: None)
    monkeypatch.setattr(launcher, "get_master", lambda job: pytest.fail("went past the check"))
    with pytest.raises(SpecError, match=r"name: .*schema version 10, newer than"):
        launcher.submit_job(_spec(make_spec), resume=resume)
    found = store.get("lm")
    assert found is not None and found.data == FUTURE
