"""The node-check probe as a training-process entrypoint (forked from the node's zygote).

The ElasticWorker passes the pair layout and thresholds in the environment; the measured
time goes back as the metric of a heartbeat, a failure as the process's traceback.
"""

from __future__ import annotations

import json
import os

from dlu_elastic.node_check.probe import injected_faults, run_probe

PROBE_RANK_ENV = "DLU_PROBE_RANK"
PROBE_SIZE_ENV = "DLU_PROBE_SIZE"
PROBE_SETTINGS_ENV = "DLU_PROBE_SETTINGS"
PROBE_NODE_ENV = "DLU_PROBE_NODE"
# Fault injection aimed at one node ("node-1"); unset: DLU_NODE_CHECK_DELAY_S / _FAIL hit every node.
FAULT_NODE_ENV = "DLU_NODE_CHECK_FAULT_NODE"
# With a counter file, the injected fault hits only the first DLU_NODE_CHECK_FAULT_TIMES probes.
FAULT_COUNTER_ENV = "DLU_NODE_CHECK_FAULT_COUNTER"
FAULT_TIMES_ENV = "DLU_NODE_CHECK_FAULT_TIMES"


def main() -> None:
    from dlu_prime.runtime import heartbeat

    settings = json.loads(os.environ[PROBE_SETTINGS_ENV])
    delay_s, fail = injected_faults(os.environ)
    target = os.environ.get(FAULT_NODE_ENV)
    if target and target != os.environ.get(PROBE_NODE_ENV):
        delay_s, fail = 0.0, False
    counter = os.environ.get(FAULT_COUNTER_ENV)
    if counter and (delay_s or fail):
        with open(counter, "a+", encoding="utf-8") as file:
            file.seek(0)
            if len(file.readlines()) >= int(os.environ.get(FAULT_TIMES_ENV, "1")):
                delay_s, fail = 0.0, False
            else:
                file.write("faulted\n")
    device = os.environ.get("DLU_DEVICE", "cpu")
    elapsed = run_probe(
        int(os.environ[PROBE_RANK_ENV]),
        int(os.environ[PROBE_SIZE_ENV]),
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        "nccl" if device.startswith("cuda") else "gloo",
        int(settings["matmul_size"]),
        float(settings["allreduce_mb"]),
        device,
        float(settings["timeout_s"]),
        delay_s=delay_s,
        fail=fail,
    )
    heartbeat(1, elapsed)
