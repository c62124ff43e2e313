"""Where the seconds of one `dlu run` go: every process it starts, when, and how much CPU it used.

A sampler for `job_e2e.py --trace`: while the run goes on it scans /proc every `interval_s`
for the processes that carry the run's folder in their environment (the CLI passes `RAY_TMPDIR`
and `DLU_ZYGOTE_DIR` down to everything it starts, so its Ray, its zygote and the processes they
fork all have it), and records for each when it started (the kernel's start time), every title
it took (Ray workers rename themselves `ray::PrimeMaster`, ...; a forked training process keeps
its zygote's name until it execs nothing: the title changes tell them apart), when it was last
seen and the CPU it had used by then. The machine's idle share is sampled beside it.

`report()` prints the timeline relative to the CLI's start, with the job's own events (from its
record: created, placed, node check, RUNNING, restarts, STOPPED) merged in, and the CPU per kind
of process. Nothing here changes what it observes: it reads /proc only.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


@dataclass
class Seen:
    """One process of the run, as the sampler saw it."""

    pid: int
    started: float  # wall clock (the kernel's start time; 10 ms resolution)
    forked: bool = False  # forked by a zygote (a training process, a probe, a Ray worker)
    titles: list[tuple[float, str]] = field(default_factory=list[tuple[float, str]])
    cpu_s: float = 0.0
    last_seen: float = 0.0

    @property
    def kind(self) -> str:
        kind = kind_of(self.titles[-1][1] if self.titles else "?")
        return f"{kind} fork" if self.forked and kind == "zygote" else kind


def kind_of(title: str) -> str:
    """A short name for what a process is, from its command line."""
    rules = (
        ("gcs_server", "gcs_server"),
        ("raylet", "raylet"),
        ("log_monitor", "log_monitor"),
        ("dashboard/agent.py", "dashboard_agent"),
        ("runtime_env/agent", "runtime_env_agent"),
        ("reaper.py", "reaper_watcher"),
        ("ray_worker_entry", "ray_worker_entry"),
        ("dlu_prime.zygote", "zygote"),
        ("ray::IDLE", "ray_worker_idle"),
        ("ray::", "ray_actor"),
        (" run ", "cli"),
    )
    for needle, name in rules:
        if needle in title:
            if name == "ray_actor":
                return title.split()[0]
            return name
    return title.split()[0].rsplit("/", 1)[-1] if title.split() else "?"


def _stat(pid: int) -> tuple[float, float, int] | None:
    """(start time after boot, CPU seconds, parent pid) of `pid`, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return float(fields[19]) / _TICK, (int(fields[11]) + int(fields[12])) / _TICK, int(fields[1])


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def _cpu_idle() -> tuple[float, float]:
    """(idle ticks, total ticks) of the whole machine."""
    parts = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return parts[3] + parts[4], sum(parts)


class Sampler:
    """Samples the processes whose environment names `needle` until `stop()`."""

    def __init__(self, needle: str, interval_s: float = 0.05) -> None:
        self.needle = f"={needle}".encode()
        self.interval_s = interval_s
        self.boot = _boot_time()
        self.seen: dict[int, Seen] = {}
        self.others: set[int] = set()
        self.idle: list[tuple[float, float]] = []  # (wall time, idle share since the last sample)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="e2e-trace", daemon=True)

    def start(self) -> None:
        self.others = {int(p) for p in os.listdir("/proc") if p.isdigit()}  # already there: not ours
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _ours(self, pid: int) -> bool:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False
        return any(
            entry.endswith(self.needle) or self.needle + b"/" in entry for entry in environ.split(b"\0")
        )

    def _sample(self) -> None:
        now = time.time()
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid in self.others:
                continue
            known = self.seen.get(pid)
            if known is None:
                if not self._ours(pid):
                    self.others.add(pid)
                    continue
                stat = _stat(pid)
                if stat is None:
                    continue
                parent = self.seen.get(stat[2])
                forked = parent is not None and parent.kind == "zygote"
                known = self.seen[pid] = Seen(pid, self.boot + stat[0], forked)
            stat = _stat(pid)
            title = _cmdline(pid)
            if stat is None or not title:  # gone, or a zombie (no command line)
                continue
            known.cpu_s, known.last_seen = stat[1], now
            if not known.titles or known.titles[-1][1] != title:
                known.titles.append((now, title))

    def _run(self) -> None:
        last = _cpu_idle()
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):  # a process vanishing mid-read: next sample
                self._sample()
            current = _cpu_idle()
            total = current[1] - last[1]
            self.idle.append((time.time(), (current[0] - last[0]) / total if total else 0.0))
            last = current


def job_events(record: Path) -> list[tuple[float, str]]:
    """(wall time, 'kind: message') of every event in a job's record file."""
    import json

    try:
        data: dict[str, Any] = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    found: list[tuple[float, str]] = []
    for event in data.get("status", {}).get("events", []):
        when = event.get("ts") or event.get("time") or event.get("at")
        if isinstance(when, int | float):
            found.append((float(when), f"event {event.get('kind')}: {str(event.get('message', ''))[:90]}"))
    return found


def report(
    sampler: Sampler, t0: float, marks: dict[str, float], events: list[tuple[float, str]]
) -> list[str]:
    """The timeline (seconds after `t0`, the CLI's start) and the CPU per kind of process.

    Kernel start times count from the boot time, which /proc gives in whole seconds: they are
    shifted so that the CLI's own start is 0."""
    lines: list[tuple[float, str]] = []
    cli = [seen.started for seen in sampler.seen.values() if seen.kind == "cli"]
    shift = (min(cli) - t0) if cli else 0.0
    for seen in sampler.seen.values():
        first = True
        for when, title in seen.titles:
            at = seen.started - shift if first else when
            lines.append((at - t0, f"pid {seen.pid} {'start' if first else 'now'} {kind_of(title)}"))
            first = False
        lines.append((seen.last_seen - t0, f"pid {seen.pid} last seen ({seen.kind}, {seen.cpu_s:.2f} s CPU)"))
    lines += [(when - t0, text) for when, text in events]
    lines += [(at, f"MARK {name}") for name, at in marks.items()]
    out = [f"{at:7.3f}  {text}" for at, text in sorted(lines)]
    per_kind: dict[str, float] = {}
    for seen in sampler.seen.values():
        per_kind[seen.kind] = per_kind.get(seen.kind, 0.0) + seen.cpu_s
    out.append("CPU seconds per kind of process (whole run):")
    out += [f"  {cpu:6.2f}  {kind}" for kind, cpu in sorted(per_kind.items(), key=lambda kv: -kv[1])]
    out.append("machine idle share per second of the run:")
    buckets: dict[int, list[float]] = {}
    for when, share in sampler.idle:
        buckets.setdefault(int(when - t0), []).append(share)
    out.append(
        "  " + " ".join(f"{sec}:{sum(v) / len(v):.0%}" for sec, v in sorted(buckets.items()) if sec >= 0)
    )
    return out
