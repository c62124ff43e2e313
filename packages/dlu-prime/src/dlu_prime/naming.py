"""Names of everything a job creates on Ray. Derived from the job name alone, so a restarted
PrimeMaster (or `dlu stop`) finds every piece by name, and two jobs never collide."""

from __future__ import annotations

NAMESPACE = "dlu"
SEP = "."


def master_name(job: str) -> str:
    return f"{job}{SEP}prime-master"


def actor_name(job: str, role: str, rank: int) -> str:
    return f"{job}{SEP}{role}{SEP}{rank}"


def sub_master_name(job: str, role: str) -> str:
    return f"{job}{SEP}{role}{SEP}submaster"


def placement_group_name(job: str, group: str) -> str:
    return f"{job}{SEP}pg{SEP}{group}"


def channel_name(job: str, channel: str) -> str:
    return f"{job}{SEP}channel{SEP}{channel}"


def shard_queue_name(job: str, queue: str) -> str:
    return f"{job}{SEP}shards{SEP}{queue}"


def job_prefix(job: str) -> str:
    """Every Ray name of the job starts with this."""
    return f"{job}{SEP}"


def endpoint_key(role: str) -> str:
    """Key under which a role's SubMaster publishes its endpoint in the PrimeMaster."""
    return f"submaster/{role}"
