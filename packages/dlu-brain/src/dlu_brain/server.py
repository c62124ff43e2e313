"""The Brain's HTTP face (stdlib `http.server`, JSON): what `dlu_prime.brain_port.BrainClient`
calls. 503 while the database is down (the job keeps its statistics and retries), 400 for a
request that is wrong, 404 for a job the Brain does not know."""

from __future__ import annotations

import json
import logging
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

from pydantic import ValidationError

from dlu_brain.db import DatabaseUnavailableError
from dlu_brain.service import Brain
from dlu_prime.brain_port import JobEnd, JobRegistration, PlanOutcome, StatsBatch

logger = logging.getLogger(__name__)

MAX_BODY = 16 * 2**20
_JOB = re.compile(r"^/v1/jobs/(?P<name>[^/]{1,200})/(?P<op>start|samples|plan|plan-outcome|end)$")


class BrainServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, brain: Brain, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.brain = brain

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="dlu-brain-http", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            body = self._body() if method == "POST" else None
            code, answer = self._route(method, url.path, query, body)
        except DatabaseUnavailableError as exc:
            code, answer = HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)}
        except (ValidationError, ValueError) as exc:
            code, answer = HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        except KeyError as exc:
            code, answer = HTTPStatus.NOT_FOUND, {"error": str(exc.args[0]) if exc.args else "not found"}
        except Exception as exc:  # a bug: answer and log it, keep serving the other jobs
            logger.exception("Brain request %s %s failed", method, self.path)
            code, answer = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"}
        data = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError(f"request body of {length} bytes is over the {MAX_BODY} limit")
        return json.loads(self.rfile.read(length) or b"null")

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        brain = cast(BrainServer, self.server).brain
        if method == "GET" and path == "/v1/status":
            return HTTPStatus.OK, brain.status()
        match = _JOB.match(path)
        if match is None:
            return HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {method} {path}"}
        name, op = match["name"], match["op"]
        if method == "GET" and op == "plan":
            return HTTPStatus.OK, brain.plan(name, query.get("run_id")).model_dump(mode="json")
        if method != "POST":
            return HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"{method} {path}: use POST"}
        if op == "start":
            registration = JobRegistration.model_validate(body)
            if registration.name != name:
                raise ValueError(f"registration names job {registration.name!r} at the URL of {name!r}")
            return HTTPStatus.OK, brain.start_job(registration).model_dump(mode="json")
        if op == "samples":
            batch = StatsBatch.model_validate(body)
            return HTTPStatus.OK, {"stored": brain.add_samples(name, batch.run_id, batch.samples)}
        if op == "plan-outcome":
            brain.plan_outcome(name, PlanOutcome.model_validate(body))
            return HTTPStatus.OK, {}
        end = JobEnd.model_validate(body)
        brain.end_job(name, end.run_id, end.outcome)
        return HTTPStatus.OK, {}
