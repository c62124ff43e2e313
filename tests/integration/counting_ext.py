"""A test Extension that notes each process that builds it: the pre-flight builds the job's
Extension to check it loads (`dlu_prime.preflight.extension_problems`), so the lines say how
many times a process ran the code checks. It replaces no node."""

from __future__ import annotations

import os
from pathlib import Path

from dlu_api.spec.models import JobSpec
from dlu_prime.extension import Extension, ExtensionError, NodeInfo


class CountingExtension(Extension):
    def __init__(self, spec: JobSpec) -> None:
        super().__init__(spec)
        with Path(str(spec.config["ext_log"])).open("a", encoding="utf-8") as log:
            log.write(f"{os.getpid()}\n")

    def relaunch_nodes_impl(self, nodes: list[NodeInfo]) -> list[NodeInfo]:
        raise ExtensionError("this test extension replaces no node")
