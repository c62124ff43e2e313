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


_CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


def terminal_contents(output: str) -> list[str]:
    """What a terminal holds at the end (its scrollback and screen), by playing `output`'s text,
    carriage returns, newlines and the cursor moves and erases a live view sends (CSI A, B, K,
    G; colours and cursor hiding ignored). Lines a redraw erased are gone, as on a screen."""
    lines: list[list[str]] = [[]]
    row, col, at = 0, 0, 0
    while at < len(output):
        match = _CSI.match(output, at)
        if match is not None:
            arg, op = match.group(1), match.group(2)
            n = int(arg) if arg.isdigit() else None
            if op == "A":
                row = max(0, row - (n or 1))
            elif op == "B":
                row += n or 1
            elif op == "G":
                col = (n or 1) - 1
            elif op == "K":
                while len(lines) <= row:
                    lines.append([])
                if n == 2:
                    lines[row] = []
                elif not n:
                    del lines[row][col:]
            at = match.end()
            continue
        char = output[at]
        at += 1
        if char == "\r":
            col = 0
        elif char == "\n":
            row, col = row + 1, 0
        elif char >= " ":
            while len(lines) <= row:
                lines.append([])
            line = lines[row]
            line.extend(" " * (col - len(line)))
            if col < len(line):
                line[col] = char
            else:
                line.append(char)
            col += 1
        while len(lines) <= row:
            lines.append([])
    return ["".join(line).rstrip() for line in lines]
