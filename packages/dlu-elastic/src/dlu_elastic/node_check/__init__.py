"""Node check (DESIGN section 3): pure pairing and verdicts in `plan`, the torch probe in `probe`.

Importing this package does not import torch; `run_probe` does, when it runs.
"""

from dlu_elastic.node_check.plan import (
    Group,
    NodeCheckVerdict,
    NodeResult,
    by_node,
    judge,
    pair_round1,
    pair_round2,
    passed_time,
    suspects,
    waves,
)
from dlu_elastic.node_check.probe import (
    DELAY_ENV,
    FAIL_ENV,
    Backend,
    ProbeError,
    injected_faults,
    measure,
    run_probe,
)

__all__ = [
    "DELAY_ENV",
    "FAIL_ENV",
    "Backend",
    "Group",
    "NodeCheckVerdict",
    "NodeResult",
    "ProbeError",
    "by_node",
    "injected_faults",
    "judge",
    "measure",
    "pair_round1",
    "pair_round2",
    "passed_time",
    "run_probe",
    "suspects",
    "waves",
]
