"""The garbage-collector setting of a process that holds thousands of rendezvous calls.

A round of 10,000 agents keeps about 450,000 objects alive in the ElasticMaster (gRPC's state of
every held call, its tasks and futures) until the round completes. CPython runs a full
collection whenever a tenth of the young collections ran and the long-lived heap grew by a
quarter, so a filling round pays several full passes over that growing heap: measured with
`benchmarks/rendezvous_scale.py`, 6 full collections took 0.7 s of the master's CPU in a
10,000-agent round (a third of its work). Making full collections ten times rarer removes them
from a round; cycles still get collected, later.
"""

from __future__ import annotations

import gc

YOUNG_COLLECTIONS_PER_FULL = 100  # CPython's default is 10


def defer_full_collections() -> None:
    """Let at least YOUNG_COLLECTIONS_PER_FULL middle-generation collections pass between full
    collections in this process (never makes them more frequent). Process-wide: call it in a
    process of its own, as the ElasticMaster's actor is."""
    young, middle, full = gc.get_threshold()
    gc.set_threshold(young, middle, max(full, YOUNG_COLLECTIONS_PER_FULL))
