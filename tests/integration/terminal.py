"""Running a command in a pseudo-terminal, as a user's shell would, and reading what it drew."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ERASE_LINE = "\x1b[2K"  # what a live view sends to redraw itself


def run_in_terminal(
    args: list[str],
    env: dict[str, str],
    cwd: Path,
    timeout_s: float = 240,
    on_output: Callable[[str, int], None] | None = None,
) -> tuple[int, str]:
    """Run a command with a pseudo-terminal as its stdout and stderr; its exit code and output.
    `on_output` sees the output so far and the command's pid after each read."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin, stdout and stderr are the terminal
        os.chdir(cwd)
        os.execve(args[0], args, env)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:  # the child closed the terminal: it has ended
                break
            if not data:
                break
            chunks.append(data)
            if on_output is not None:
                on_output(b"".join(chunks).decode(errors="replace"), pid)
        else:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"{' '.join(args)} did not end within {timeout_s:.0f} s")
        _, status = os.waitpid(pid, 0)
    finally:
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode(errors="replace")


def final_screen(output: str) -> str:
    """What the terminal shows last: the text after the live view's last redraw, uncoloured."""
    return ANSI.sub("", output.rsplit(ERASE_LINE, 1)[-1]).replace("\r", "")
