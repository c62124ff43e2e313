"""Holds a multi-node Ray cluster with a job server until its stdin closes.

Run with the Python of a *cluster* environment (our wheels plus `ray[default]`), not the
workspace: `python cluster_holder.py '{"workers": 2, ...}'`. It prints one JSON line with the
job server URL, the GCS address, the node ids and each node's Prometheus port (the metrics
agent's `metrics_export_port`, pinned here), then waits. Every node is a real raylet
(`ray.cluster_utils.Cluster`), all on 127.0.0.1, with free ports only, so that several test
sessions on one machine never collide. The caller sets RAY_TMPDIR and
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (keeps every Ray process, the job agent included, on
loopback instead of the host's interface address).
"""

from __future__ import annotations

import json
import socket
import sys


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    options = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    from ray.cluster_utils import Cluster

    dashboard_port = free_port()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": options.get("head_cpus", 1),
            "resources": {"dlu_head": 1},
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": dashboard_port,
            "dashboard_agent_listen_port": free_port(),
            "metrics_export_port": free_port(),
            "node_ip_address": "127.0.0.1",
        },
    )
    workers = [
        cluster.add_node(
            num_cpus=options.get("worker_cpus", 2),
            resources={"dlu_worker": 4},
            node_ip_address="127.0.0.1",
            dashboard_agent_listen_port=free_port(),
            metrics_export_port=free_port(),
        )
        for _ in range(options.get("workers", 2))
    ]
    info = {
        "dashboard": f"http://127.0.0.1:{dashboard_port}",
        "gcs": cluster.address,
        "head_node": cluster.head_node.node_id,
        "worker_nodes": [node.node_id for node in workers],
        "metrics_ports": {node.node_id: node.metrics_export_port for node in (cluster.head_node, *workers)},
    }
    print(json.dumps(info), flush=True)
    try:
        sys.stdin.read()
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
