"""The launcher's mailbox: requests taken once and answered by id; what it does when the GCS
calls are gone or a request is not JSON."""

from __future__ import annotations

import pytest

from dlu_api.client import wire
from dlu_prime import mailbox, ray_private

pytestmark = pytest.mark.timeout(30)


def test_requests_are_taken_once_and_answered_by_id(monkeypatch: pytest.MonkeyPatch) -> None:
    store = {
        f"gcs://{wire.mail_package('j', 'a1')}": b'{"action": "get_step", "role": "w"}',
        f"gcs://{wire.mail_package('j', 'b2')}": b"not json",
        f"gcs://{wire.mail_package('other', 'c3')}": b'{"action": "stop"}',  # another job's
    }
    monkeypatch.setattr(ray_private, "kv_keys", lambda p, ns: [k.encode() for k in store if k.startswith(p)])
    monkeypatch.setattr(ray_private, "kv_get", lambda k, ns: store.get(k))
    monkeypatch.setattr(ray_private, "kv_delete", lambda k, ns, by_prefix=False: store.pop(k, None))
    lines: list[str] = []
    box = mailbox.Mailbox("j", lines.append, lambda job, request: {"result": {"job": job, **request}})
    box.poll()
    box.poll()
    box.close()
    answers = wire.parse_log(lines).answers
    assert answers["a1"] == {"id": "a1", "result": {"job": "j", "action": "get_step", "role": "w"}}
    assert "JSONDecodeError" in answers["b2"]["error"]
    assert len(lines) == 2 and list(store) == [f"gcs://{wire.mail_package('other', 'c3')}"]


def test_a_ray_without_the_kv_calls_disables_the_mailbox(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    def gone(prefix: str, ns: str | None) -> list[bytes]:
        calls.append(prefix)
        raise ray_private.RayInternalsChanged("ray.experimental.internal_kv._internal_kv_list is gone")

    monkeypatch.setattr(ray_private, "kv_keys", gone)
    box = mailbox.Mailbox("j", lambda line: None)
    box.poll()
    box.poll()
    assert len(calls) == 1
    assert "requests from remote drivers cannot be read" in caplog.text


def test_an_unknown_request_names_the_known_ones() -> None:
    answer = mailbox.handle("j", {"action": "reboot"})
    assert "unknown request 'reboot'" in answer["error"] and "mark_unhealthy" in answer["error"]
