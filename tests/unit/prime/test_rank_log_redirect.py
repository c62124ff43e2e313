"""Rank log files on the worker side: which files a rank gets, appending with a marker per start,
and the descriptor-level redirect (Python, C-level writes and child processes all land there)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dlu_api.spec.models import LogsSettings
from dlu_prime import ray_private
from dlu_prime.worker.rank_logs import RankOutput, fds_for_child, log_root


def _output(root: Path, redirects: str = "3", tee: str = "0", rank: int = 0) -> RankOutput | None:
    settings = LogsSettings(redirects=redirects, tee=tee)
    return RankOutput.of(settings, job="j", run_id="r1", role="w", rank=rank, attempt="first", root=root)


@pytest.mark.parametrize(
    ("redirects", "tee", "rank", "files"),
    [
        ("3", "0", 0, {1: "rank0.out", 2: "rank0.err"}),
        ("1", "0", 0, {1: "rank0.out"}),
        ("0", "2", 0, {2: "rank0.err"}),  # tee implies the file, as torchrun
        ("1", "2", 5, {1: "rank5.out", 2: "rank5.err"}),
        ("0:3", "0", 0, {1: "rank0.out", 2: "rank0.err"}),
        ("0:3", "0", 1, None),  # a rank the per-rank form leaves out writes no file
        ("0", "0", 0, None),
    ],
)
def test_which_files(
    tmp_path: Path, redirects: str, tee: str, rank: int, files: dict[int, str] | None
) -> None:
    output = _output(tmp_path, redirects, tee, rank)
    if files is None:
        assert output is None
        return
    assert output is not None
    assert output.paths == {fd: str(tmp_path / "j" / "r1" / "w" / name) for fd, name in files.items()}


def test_each_start_appends_below_a_marker(tmp_path: Path) -> None:
    for attempt in ("first", "second"):
        output = RankOutput.of(
            LogsSettings(), job="j", run_id="r1", role="w", rank=0, attempt=attempt, root=tmp_path
        )
        assert output is not None
        fds = output.open()
        os.write(fds[1], f"line of {attempt}\n".encode())
        for fd in fds.values():
            os.close(fd)
    text = (tmp_path / "j" / "r1" / "w" / "rank0.out").read_text().splitlines()
    assert [line.startswith("==== dlu: w/rank0 started at ") for line in text] == [True, False, True, False]
    assert text[0].endswith("(first) ====") and text[2].endswith("(second) ====")
    assert text[1::2] == ["line of first", "line of second"]


def test_a_file_that_cannot_be_opened_leaves_the_stream_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "j"
    blocker.write_text("a file where the job's folder should be")
    output = _output(tmp_path)
    assert output is not None
    with caplog.at_level(logging.WARNING):
        assert output.open() == {}
    assert "cannot open the rank log" in caplog.text
    assert fds_for_child(output) == ([1, 2], [])


def test_no_output_means_the_actors_own_descriptors() -> None:
    assert fds_for_child(None) == ([1, 2], [])


def test_log_root_prefers_the_spec_then_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert log_root(LogsSettings(dir="~/l")) == tmp_path / "l"
    monkeypatch.setenv("DLU_HOME", str(tmp_path / "home"))
    # No Ray node in this process (an earlier test of the same run may have started one).
    monkeypatch.setattr(ray_private, "session_logs_dir", lambda: None)
    assert log_root(LogsSettings()) == tmp_path / "home" / "logs"
    monkeypatch.setattr(ray_private, "session_logs_dir", lambda: "/tmp/ray/session_x/logs")
    assert log_root(LogsSettings()) == Path("/tmp/ray/session_x/logs/dlu")  # the dashboard serves it


REDIRECTED = """
import os, subprocess, sys
from pathlib import Path
from dlu_api.spec.models import LogsSettings
from dlu_prime.worker.rank_logs import RankOutput, redirect_this_process

print("before the redirect")
sys.stdout.flush()
settings = LogsSettings(redirects={redirects!r})
output = RankOutput.of(settings, job="j", run_id="r", role="w", rank=2, attempt="a", root=Path({root!r}))
print(redirect_this_process(output), file=sys.__stderr__ if {redirects!r} == "1" else open("/dev/null", "w"))
print("python stdout")
print("python stderr", file=sys.stderr)
os.write(1, b"fd 1\\n")
os.write(2, b"fd 2\\n")
subprocess.run(["sh", "-c", "echo child out; echo child err >&2"], check=True)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("redirects", ["3", "1"])
def test_redirect_reaches_c_level_and_children(tmp_path: Path, redirects: str) -> None:
    script = textwrap.dedent(REDIRECTED.format(redirects=redirects, root=str(tmp_path)))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "j" / "r" / "w"
    out = (folder / "rank2.out").read_text().splitlines()
    assert out[1:] == ["python stdout", "fd 1", "child out"], out
    assert done.stdout == "before the redirect\n"  # nothing else reached the process's stdout
    if redirects == "3":
        err = (folder / "rank2.err").read_text().splitlines()
        assert err[1:] == ["python stderr", "fd 2", "child err"], err
        assert done.stderr == ""
    else:  # stdout only: stderr stays where it was
        assert not (folder / "rank2.err").exists()
        assert done.stderr.splitlines()[1:] == ["python stderr", "fd 2", "child err"], done.stderr
