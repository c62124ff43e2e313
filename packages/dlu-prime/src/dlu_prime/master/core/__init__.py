"""The controller core: typed events in, one pure `decide`, changes and commands out.

`decide(state, event, now) -> Decision` makes every decision; `master/executor.py` runs the
commands it returns and answers each with a `Done` event; the PrimeManager is the loop between
them (event -> decide under the lock -> apply and save the changes -> run the commands outside
the lock -> decide each outcome)."""

from dlu_prime.master.core.decide import decide
from dlu_prime.master.core.decision import Decision

__all__ = ["Decision", "decide"]
