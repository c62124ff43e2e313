"""The variables torchrun's agent gives a worker process, from DLU's rendezvous round.

Mirrors what `torch.distributed.elastic.agent.server.local_elastic_agent` sets, so that an
unmodified torchrun script reads the same environment under DLU (docs/torchrun.md lists the
few values that differ on purpose and why). The error file and the agent store variable are
set by the actor (they need its files and settings).
"""

from __future__ import annotations

import os

from dlu.elastic.v1 import elastic_pb2 as pb


def restart_count(state: pb.RendezvousState, previous: int | None = None) -> int:
    """Rounds of the role before this one (rounds are numbered from 1): the same on every rank of
    a round, a replaced rank's new process included, as torchrun's count is the same on every
    worker of its group. `previous`: the count this agent's last round had, if it had one. A
    replaced ElasticMaster numbers its rounds from 1 again; the count never goes back for it
    (every agent that trained before counts on from its last round, so they stay equal)."""
    count = max(0, int(state.round) - 1)
    if previous is not None and count <= previous:
        count = previous + 1
    return count


def torchrun_env(
    state: pb.RendezvousState,
    *,
    local_rank: int,
    local_world_size: int,
    node_rank: int,
    role: str,
    run_id: str,
    max_restarts: int,
    restarts: int,
) -> dict[str, str]:
    """torchrun's worker variables for the rank at `state.rank_offset` of this round, its
    `restarts` the round's `restart_count`."""
    world = int(state.world_size)
    groups = max(1, world // max(1, local_world_size))  # nodes of the round: torchrun's agents
    env = {
        "RANK": str(state.rank_offset),
        "GROUP_RANK": str(node_rank),
        "NODE_RANK": str(node_rank),  # not torchrun's; DLU's earlier name for GROUP_RANK
        "ROLE_RANK": str(state.rank_offset),
        "ROLE_NAME": role,
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": str(groups),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": state.master_addr,
        "MASTER_PORT": str(state.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restarts),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        # torchrun's default, unless the launching environment chose
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    # torchrun's launcher exports the signals it forwards to its workers; they inherit it
    env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = os.environ.get(
        "TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    )
    if local_world_size > 1 and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"  # torchrun's default with several processes per node
    return env
