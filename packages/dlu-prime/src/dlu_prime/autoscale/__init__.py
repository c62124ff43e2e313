"""Auto-scaling in the job (single-job mode) and the execution of a Brain's plans (cluster
mode): the pure policy (`policy`), the statistics the PrimeMaster feeds (`feed`), and the thin
driver that hands them to the decision core each monitoring pass (`driver`). The decisions are
the core's (`master/core/autoscale_pass.py`)."""
