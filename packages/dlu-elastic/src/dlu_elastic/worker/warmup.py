"""What a node that will run training processes starts ahead of them: its zygote.

Kept apart from `process` so that starting the zygote imports neither Ray nor torch: `dlu run`
calls `prestart` before it imports Ray, and the zygote's imports use a core the CLI leaves idle.
"""

from __future__ import annotations

from dlu_prime import zygote

# torch._dynamo: torch imports it lazily the first time an optimizer is built (2-3 s here, 10+ s
# with four ranks on two cores), so without it every start and every in-place restart of a
# training process paid that again; measured: "process group ready -> model and optimizer
# ready" fell from 13.5 s to well under a second on the reference job.
# dlu_elastic.checkpoint.api: a training process that restores a flash checkpoint imports it
# before its first step (15 modules; 27 to 52 ms, measured when they were 13, after the rest
# of this list on the loaded 2-core machine), on the path of every in-place restart of such a
# job. The last entry is the launcher module, which imports what every training process runs
# (`process_child`).
PRELOAD: tuple[str, ...] = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch.optim",
    "dlu_elastic.checkpoint.api",
    "dlu_elastic.worker.process",
)


def prestart() -> None:
    """Start this node's zygote with the default preload list, without waiting for its imports
    (a job about to run here gets torch imported while Ray and its actors start).

    Raises:
        zygote.ZygoteError: a new zygote could not be started.
    """
    zygote.ensure_started(PRELOAD)
