"""What a rank's agent does once its training process exited 0.

torchrun restarts the whole worker group when any worker fails, workers that had already exited
0 included: they run again from the start (or their checkpoint). A DLU rank that finished is no
different: a peer that fails later opens a new rendezvous round that expects every rank, so a
finished rank that stopped watching its round would leave that round incomplete for ever. So
its agent stays in its round, showing FINISH (the PrimeMaster ends the role once every rank
shows it), and keeps asking the ElasticMaster whether training goes on:

- a new round (a peer failed, a rank was replaced, the master moved): run again (`RERUN`),
  back to RUNNING; a master that moved is asked first, since a replacement set up after every
  rank had finished says training is over instead;
- the master stops training (a peer's failure reached the restart limit, or the role's training
  is over): the rank is done;
- otherwise: wait on.

Pure: the agent (`actor.ElasticWorkerActor`) passes the master's answer in.
"""

from __future__ import annotations

from enum import StrEnum


class AfterSuccess(StrEnum):
    WAIT = "wait"  # show FINISH, keep asking
    RERUN = "rerun"  # join the next round and run the process again
    DONE = "done"  # training stopped: the rank's success stands, stop asking


def after_success(action: str) -> AfterSuccess:
    """The next step of a rank whose process exited 0, from the master's answer to its beat:
    "restart" (a new round), "stop" (training stopped), "none" (training goes on) or "halt" (a
    peer failed and the master decides: this rank, idle, waits as for "none")."""
    if action == "restart":
        return AfterSuccess.RERUN
    if action == "stop":
        return AfterSuccess.DONE
    if action in ("none", "halt"):
        return AfterSuccess.WAIT
    raise ValueError(f"unknown ElasticMaster action {action!r}; expected restart, stop or none")
