"""Extensions: what DLU cannot do by itself on every cluster, such as replacing a machine.

Node relaunch (tier 4 of the failover ladder) asks the job's Extension to replace nodes that
failed too often. How is cluster-specific (a cloud API, KubeRay, a test cluster), so it is a
plugin: a class registered under the `dlu.extensions` entry-point group, named by the job
spec's `extension` field ('module:Class' works too, for code in the job's working directory).
"""

from __future__ import annotations

import importlib
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from dlu_api.spec.models import JobSpec
from dlu_prime.worker.entrypoint import prepend_sys_path

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "dlu.extensions"


class ExtensionError(Exception):
    """An extension could not be loaded, or failed to do what was asked."""


@dataclass(frozen=True)
class NodeInfo:
    """A node to relaunch (or one that replaced it) and the job's actors that were on it."""

    node_id: str
    address: str | None = None
    actors: tuple[str, ...] = field(default=())


class Extension(ABC):
    """Base class of cluster extensions. One instance per PrimeMaster."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec

    @abstractmethod
    def relaunch_nodes_impl(self, nodes: list[NodeInfo]) -> list[NodeInfo]:
        """Replace these nodes and return the nodes now standing in for them.

        Called with the job's state already saved (the nodes are in `removed_nodes`), so a
        PrimeMaster restart during the call does not relaunch them twice.

        Raises:
            ExtensionError: the nodes could not be replaced; the job stops with this reason.
        """


def _import(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


def load_extension(spec: JobSpec, workdir: str | None = None) -> Extension | None:
    """The job's Extension, or None when the spec names none.

    Raises:
        ExtensionError: the name is not registered, cannot be imported, or is not an Extension.
    """
    name = spec.extension
    if not name:
        return None
    prepend_sys_path(workdir)
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    try:
        if found:
            target = found[0].load()
        elif ":" in name:
            target = _import(name)
        else:
            known = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
            raise ExtensionError(
                f"extension {name!r} is not registered in the {ENTRY_POINT_GROUP!r} entry-point group "
                f"(registered: {', '.join(known) or 'none'}); install the package that provides it, "
                "or give 'module:Class'"
            )
    except (ImportError, AttributeError) as exc:
        raise ExtensionError(f"extension {name!r} cannot be loaded: {exc}") from exc
    if not (isinstance(target, type) and issubclass(target, Extension)):
        raise ExtensionError(f"extension {name!r} is not a subclass of dlu_prime.extension.Extension")
    logger.info("job %s: extension %s loaded", spec.name, name)
    return target(spec)
