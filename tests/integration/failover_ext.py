"""A test Extension: replaces a `ray.cluster_utils.Cluster` node by asking the test process,
which owns the Cluster, to remove the node and add a fresh one (a real node swap)."""

from __future__ import annotations

from multiprocessing.connection import Client

from dlu_prime.extension import Extension, ExtensionError, NodeInfo

AUTHKEY = b"dlu-test-node-control"


class ClusterRelaunch(Extension):
    def relaunch_nodes_impl(self, nodes: list[NodeInfo]) -> list[NodeInfo]:
        host, port = str(self.spec.config["node_ctl"]).split(":")
        with Client((host, int(port)), authkey=AUTHKEY) as conn:
            conn.send([n.node_id for n in nodes])
            answer = conn.recv()
        if isinstance(answer, str):
            raise ExtensionError(answer)
        return [NodeInfo(node_id) for node_id in answer]
