"""What the embedded Ray's raylet starts as its dashboard agent when Ray is the plain `ray`
package (no `ray[default]`): the three port files Ray's own agent writes there, and nothing else.

With plain `ray`, Ray's agent runs `--minimal`: it imports Ray and its dashboard package (0.5 to
0.7 s of CPU on this 2-core machine, while the job's own start competes for the cores), loads
no module, writes "-1" for the metrics agent, metrics export and listen ports, and then only
watches the raylet. The raylet waits for those files before it registers its node, so the
agent's imports were on the path of every local Ray's start. This script writes the same
files at once and waits for the raylet (its parent) to end, then ends too.

It is run as a script by path (dlu_prime.ray_private.lean_head puts it in the raylet's agent
command) and imports only the standard library. `DLU_RAY_AGENT_STUB=0` keeps Ray's agent.
"""

from __future__ import annotations

import os
import signal
import sys
import time

PORT_NAMES = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port")
UNUSED = "-1"  # what Ray's minimal agent writes: the service is not in use
PARENT_POLL_S = 0.5


def _option(argv: list[str], name: str) -> str:
    prefix = f"--{name}="
    for arg in argv:
        if arg.startswith(prefix):
            return arg[len(prefix) :]
    raise SystemExit(f"ray_agent_stub: no {prefix}... in the agent's arguments")


def persist_ports(session_dir: str, node_id: str) -> None:
    """The files Ray's `persist_port` writes: `<name>_<node id>` holding the port, each whole."""
    for name in PORT_NAMES:
        path = os.path.join(session_dir, f"{name}_{node_id}")
        temporary = f"{path}.{os.getpid()}"
        with open(temporary, "w") as out:
            out.write(UNUSED)
        os.replace(temporary, path)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    parent = os.getppid()
    persist_ports(_option(argv, "session-dir"), _option(argv, "node-id"))
    while os.getppid() == parent:  # the raylet: when it ends, this process is re-parented
        time.sleep(PARENT_POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
