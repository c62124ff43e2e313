"""Requests a remote driver leaves for a running job, answered by the job's launcher.

A driver with only the Ray Jobs REST API uploads a request as a small "package" (the Jobs API's
package upload stores it in the GCS key-value store under `gcs://<name>`, see
`dlu_api.client.wire.mail_package`). The launcher lists its job's keys on every poll, deletes
each request it takes, runs it in a worker thread (a `dlu scale` waits for its resize; the
job is followed meanwhile) and writes the answer into its log as a `DLU-ANSWER` line.
The GCS is reached through `dlu_prime.ray_private`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dlu_api.client import wire
from dlu_prime import launcher, ray_private

logger = logging.getLogger(__name__)

PACKAGE_NAMESPACE: str | None = None  # where Ray's package upload writes (ray_constants.KV_NAMESPACE_PACKAGE)
_NEEDED = ("kv_get", "kv_del", "kv_list")


def supported() -> bool:
    """Whether this Ray lets the launcher read its mailbox (else the driver is told so)."""
    return all(ray_private.available(key) for key in _NEEDED)


def handle(job: str, request: dict[str, Any]) -> dict[str, Any]:
    """Run one request on the job's PrimeMaster: {"result": ...} or {"error": "..."}."""
    action = str(request.get("action"))
    try:
        if action == "stop":
            found = launcher.stop_job(job, str(request.get("reason") or "stopped by user request"))
            return {"result": {"stopped": found}}
        if action == "scale":
            return {"result": launcher.scale_job(job, str(request["role"]), int(request["size"]))}
        if action in ("mark_unhealthy", "get_step", "set_step"):
            rank, step = request.get("rank"), request.get("step")
            result = launcher.debug_job(
                job,
                action,
                str(request["role"]),
                None if rank is None else int(rank),
                None if step is None else int(step),
            )
            return {"result": result}
    except (LookupError, ValueError) as exc:
        return {"error": str(exc)}
    return {
        "error": f"unknown request {action!r}: this dlu-prime answers stop, scale, mark_unhealthy, get_step, set_step"
    }


class Mailbox:
    """The job's mailbox as its launcher sees it; `poll` is called on every poll of the job."""

    def __init__(
        self,
        job: str,
        emit: Callable[[str], None],
        answer: Callable[[str, dict[str, Any]], dict[str, Any]] = handle,
    ) -> None:
        self.job = job
        self._emit = emit
        self._answer = answer
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"dlu-mailbox-{job}")
        self._broken = False

    def poll(self) -> None:
        """Take every waiting request; a GCS that does not answer is tried again next poll."""
        if self._broken:
            return
        prefix = wire.mail_prefix(self.job)
        try:
            keys = [k.decode() for k in ray_private.kv_keys(prefix, PACKAGE_NAMESPACE)]
            for key in keys:
                data = ray_private.kv_get(key, PACKAGE_NAMESPACE)
                ray_private.kv_delete(key, PACKAGE_NAMESPACE)
                if data is not None:
                    self._pool.submit(self._serve, wire.mail_key(key, self.job), data)
        except ray_private.RayInternalsChanged as exc:
            logger.warning("job %s: requests from remote drivers cannot be read (%s)", self.job, exc)
            self._broken = True
        except Exception as exc:  # the GCS is briefly unreachable: the next poll tries again
            logger.warning("job %s: reading the mailbox failed: %s", self.job, exc)

    def _serve(self, request_id: str, data: bytes) -> None:
        try:
            request: dict[str, Any] = json.loads(data)
            answer = self._answer(self.job, request)
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        self._emit(wire.line(wire.ANSWER, {"id": request_id, **answer}))

    def close(self) -> None:
        """Wait for the requests being answered, then drop any request left unread."""
        self._pool.shutdown(wait=True)
        try:
            ray_private.kv_delete(wire.mail_prefix(self.job), PACKAGE_NAMESPACE, by_prefix=True)
        except Exception as exc:
            logger.debug("job %s: mailbox not cleared: %s", self.job, exc)
