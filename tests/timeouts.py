"""Per-test timeouts that fail the one test, with a backstop that ends a stuck run.

pytest-timeout's thread method ends the whole pytest process at the first test past its time,
so one slow test on a loaded machine cost the run's remaining tests. Its signal method fails just
that test, but a SIGALRM is only handled once the main thread is back in Python: a blocking
`ray.get` without a timeout holds it off. So with `timeout_method = "signal"` both are armed:
SIGALRM at the test's timeout (the test fails, the run goes on), and the thread method's abort
(stacks dumped, then the process ends) `BACKSTOP_S` later, for a test that the signal could not
reach. A test's timeout thus still bounds it; only where the signal is held off does it take
`BACKSTOP_S` longer to end the run.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest
import pytest_timeout  # pyright: ignore[reportMissingTypeStubs]

BACKSTOP_S = 120.0


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: a run without pytest-timeout
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """Arm SIGALRM and the backstop thread; leave other methods (and threads) to pytest-timeout."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None

    def on_alarm(signum: int, frame: object) -> None:
        __tracebackhide__ = True
        pytest_timeout.timeout_sigalrm(item, settings)  # pyright: ignore[reportUnknownMemberType]

    backstop = threading.Timer(
        settings.timeout + BACKSTOP_S,
        pytest_timeout.timeout_timer,  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
        (item, settings),
    )
    backstop.name = f"timeout backstop {item.nodeid}"
    backstop.daemon = True

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        backstop.cancel()
        backstop.join()

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # what pytest-timeout's cancel hook calls
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    backstop.start()
    return True
