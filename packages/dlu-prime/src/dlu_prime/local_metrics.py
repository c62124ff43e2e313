"""Metrics of local runs: `dlu run`'s embedded Ray has no metrics agent (plain `ray`, not
`ray[default]`), so what Ray's metrics API records there is exported nowhere.

The driver (dlu_prime.local) serves a Prometheus endpoint on 127.0.0.1 and, before its Ray
starts, names a private directory in `DLU_METRICS_DIR`, which every Ray worker inherits. Each
process that records a job's metrics (the PrimeMaster, a role's SubMaster) then keeps them here
and writes them to one file of that directory, named after its Ray actor, so a rebuilt actor
takes its predecessor's file over. A scrape merges the files: counters and histograms summed,
gauges as written. The values are exact (a histogram's `_sum` is the sum of what was observed;
Ray's exporter writes bucket midpoints).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from dlu_api.errors import DLUError

logger = logging.getLogger(__name__)

DIR_ENV = "DLU_METRICS_DIR"
PORT_ENV = "DLU_METRICS_PORT"
OFF = ("off", "none", "no", "false")
LOOPBACK = "127.0.0.1"
FLUSH_S = 0.5
"""Gauges change on every look of the manager loop: written at most this often (a counter or a
histogram, rarer and never to be lost, at once)."""

Labels = tuple[tuple[str, str], ...]


class _Store:
    """One process's series and their values, written to its file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.series: dict[str, dict[str, Any]] = {}
        self.values: dict[str, dict[Labels, Any]] = {}
        self._dirty = threading.Event()
        self._flusher: threading.Thread | None = None

    def add(self, name: str, kind: str, help_: str, boundaries: Sequence[float]) -> None:
        with self.lock:
            self.series[name] = {"kind": kind, "help": help_, "boundaries": list(boundaries)}
            self.values.setdefault(name, {})
        self.write()  # every series is listed from its creation, before any value

    def record(self, name: str, value: float, tags: dict[str, str]) -> None:
        labels: Labels = tuple(sorted(tags.items()))
        with self.lock:
            kind = self.series[name]["kind"]
            values = self.values[name]
            if kind == "gauge":
                values[labels] = value
            elif kind == "counter":
                values[labels] = values.get(labels, 0.0) + value
            else:
                bounds: list[float] = self.series[name]["boundaries"]
                buckets, total, count = values.get(labels, ([0] * len(bounds), 0.0, 0))
                buckets = list(buckets)
                for i, bound in enumerate(bounds):
                    if value <= bound:
                        buckets[i] += 1
                        break
                values[labels] = (buckets, total + value, count + 1)
        if kind == "gauge":
            self._later()
        else:
            self.write()

    def _later(self) -> None:
        self._dirty.set()
        with self.lock:
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_loop, name="dlu-metrics", daemon=True)
                self._flusher.start()

    def _flush_loop(self) -> None:
        while True:
            self._dirty.wait()
            time.sleep(FLUSH_S)
            self.write()

    def write(self) -> None:
        """The file replaced whole (a scrape never reads half of one)."""
        with self.lock:
            self._dirty.clear()
            data = {
                name: {**meta, "values": [[dict(k), v] for k, v in self.values[name].items()]}
                for name, meta in self.series.items()
            }
        temporary = self.path.with_name(f".{self.path.name}.{threading.get_ident()}")
        try:
            temporary.write_text(json.dumps(data))
            os.replace(temporary, self.path)
        except OSError as exc:  # the driver has gone and its directory with it
            logger.debug("metrics not written to %s: %s", self.path, exc)


class _Recorder:
    def __init__(self, store: _Store, name: str) -> None:
        self._store = store
        self._name = name

    def record(self, value: float, tags: dict[str, str]) -> None:
        self._store.record(self._name, value, tags)


class LocalMetricsBackend:
    """A `MetricsBackend` (dlu_prime.master.metrics) that keeps values for the local endpoint."""

    def __init__(self, directory: Path, source: str) -> None:
        self.store = _Store(directory / f"{urllib.parse.quote(source, safe='')}.json")

    def gauge(self, name: str, description: str, tag_keys: Sequence[str]) -> _Recorder:
        self.store.add(name, "gauge", description, ())
        return _Recorder(self.store, name)

    def counter(self, name: str, description: str, tag_keys: Sequence[str]) -> _Recorder:
        self.store.add(name, "counter", description, ())
        return _Recorder(self.store, name)

    def histogram(
        self, name: str, description: str, boundaries: Sequence[float], tag_keys: Sequence[str]
    ) -> _Recorder:
        self.store.add(name, "histogram", description, sorted(boundaries))
        return _Recorder(self.store, name)


_backends: dict[str, LocalMetricsBackend] = {}
_backends_lock = threading.Lock()


def _source() -> str:
    """This process's Ray actor (stable across its rebuilds), else its pid."""
    ray = sys.modules.get("ray")
    if ray is not None:
        with contextlib.suppress(Exception):
            name = ray.get_runtime_context().get_actor_name()
            if name:
                return str(name)
    return f"pid-{os.getpid()}"


def backend_from_env() -> LocalMetricsBackend | None:
    """The backend of this process when its driver serves the local endpoint, else None. One
    per process and job source: JobMetrics made twice in one actor share a file."""
    directory = os.environ.get(DIR_ENV)
    if not directory or not Path(directory).is_dir():
        return None
    source = _source()
    with _backends_lock:
        found = _backends.get(source)
        if found is None or found.store.path.parent != Path(directory):
            found = _backends[source] = LocalMetricsBackend(Path(directory), source)
        return found


# --- the endpoint -------------------------------------------------------------------------------


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _labels(labels: dict[str, str], extra: tuple[str, str] | None = None) -> str:
    pairs = sorted(labels.items()) + ([extra] if extra else [])
    if not pairs:
        return ""
    escaped = (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for _, v in pairs)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(pairs, escaped, strict=True)) + "}"


def _read(directory: Path) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # removed meanwhile
            continue
    return found


def render(directory: Path) -> str:
    """The Prometheus text format (0.0.4) of every file in `directory`, merged."""
    meta: dict[str, dict[str, Any]] = {}
    merged: dict[str, dict[Labels, Any]] = {}
    for data in _read(directory):
        for name, series in data.items():
            meta.setdefault(name, series)
            values = merged.setdefault(name, {})
            for tags, value in series["values"]:
                key: Labels = tuple(sorted(tags.items()))
                if series["kind"] == "gauge" or key not in values:
                    values[key] = value
                elif series["kind"] == "counter":
                    values[key] += value
                else:
                    old_buckets, old_sum, old_count = values[key]
                    buckets = [a + b for a, b in zip(old_buckets, value[0], strict=True)]
                    values[key] = (buckets, old_sum + value[1], old_count + value[2])
    lines: list[str] = []
    for name in sorted(meta):
        kind = meta[name]["kind"]
        lines.append(f"# HELP {name} {meta[name]['help']}")
        lines.append(f"# TYPE {name} {kind}")
        for key, value in sorted(merged[name].items()):
            tags = dict(key)
            if kind != "histogram":
                lines.append(f"{name}{_labels(tags)} {_number(value)}")
                continue
            buckets, total, count = value
            cumulative = 0
            for bound, n in zip(meta[name]["boundaries"], buckets, strict=True):
                cumulative += n
                lines.append(f"{name}_bucket{_labels(tags, ('le', _number(bound)))} {cumulative}")
            lines.append(f"{name}_bucket{_labels(tags, ('le', '+Inf'))} {count}")
            lines.append(f"{name}_sum{_labels(tags)} {_number(total)}")
            lines.append(f"{name}_count{_labels(tags)} {count}")
    return "\n".join(lines) + "\n"


class LocalEndpoint:
    """`/metrics` on 127.0.0.1, served by a thread of the driver from a private directory."""

    def __init__(self, port: int) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="dlu-metrics-"))
        directory = self.directory

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served")
                    return
                body = render(directory).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # a scrape every few seconds is no news

        try:
            self._server = ThreadingHTTPServer((LOOPBACK, port), Handler)
        except OSError as exc:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise DLUError(
                f"cannot serve the job's metrics on {LOOPBACK}:{port} ({exc.strerror}); "
                f"set {PORT_ENV} to a free port, to 0 for any free one, or to off"
            ) from None
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.url = f"http://{LOOPBACK}:{self.port}/metrics"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="dlu-metrics-http", daemon=True
        )
        self._thread.start()
        os.environ[DIR_ENV] = str(self.directory)  # before Ray starts: its workers inherit it

    def close(self, wait: bool = True) -> None:
        """Stop serving and remove the directory; `wait=False` (the process is about to exit)
        skips waiting up to half a second for the serving thread to notice."""
        if wait:
            self._server.shutdown()
        self._server.server_close()
        if os.environ.get(DIR_ENV) == str(self.directory):
            del os.environ[DIR_ENV]
        shutil.rmtree(self.directory, ignore_errors=True)


def port_from_env() -> int | None:
    """`DLU_METRICS_PORT`: unset or 0 any free port, a number that port, `off` none.

    Raises:
        DLUError: anything else, naming the variable and what it takes.
    """
    raw = os.environ.get(PORT_ENV, "").strip()
    if not raw:
        return 0
    if raw.lower() in OFF:
        return None
    if raw.isascii() and raw.isdigit() and int(raw) <= 65535:
        return int(raw)
    raise DLUError(f"{PORT_ENV}={raw!r}: give a port number (0-65535; 0 picks a free one) or 'off'")


def start_endpoint() -> LocalEndpoint | None:
    """The local endpoint, or None when `DLU_METRICS_PORT=off`."""
    port = port_from_env()
    return None if port is None else LocalEndpoint(port)
