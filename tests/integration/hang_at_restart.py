"""train_lm.py, except that the first restarted process of rank HANG_RANK stops itself (SIGSTOP)
before it sends its first heartbeat: a hang in the start-up of a script known to beat."""

from __future__ import annotations

import os
import runpy
import signal
from pathlib import Path

LM = Path(__file__).resolve().parents[2] / "examples" / "elastic" / "train_lm.py"


def main() -> None:
    marks = Path(os.environ["HANG_MARK_DIR"])
    if os.environ.get("RANK") == os.environ.get("HANG_RANK", "1"):
        started, hung = marks / "started-once", marks / "hung-once"
        if not started.exists():
            started.touch()
        elif not hung.exists():
            hung.touch()
            os.kill(os.getpid(), signal.SIGSTOP)
    runpy.run_path(str(LM), run_name="__main__")


if __name__ == "__main__":
    main()
