from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTION_NONE: _ClassVar[Action]
    ACTION_RESTART: _ClassVar[Action]
    ACTION_STOP: _ClassVar[Action]
    ACTION_HALT: _ClassVar[Action]
ACTION_NONE: Action
ACTION_RESTART: Action
ACTION_STOP: Action
ACTION_HALT: Action

class JoinRequest(_message.Message):
    __slots__ = ("job_token", "node_id", "node_rank_hint", "local_ranks", "agent_id", "host", "free_port", "wait_s")
    JOB_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_HINT_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANKS_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    FREE_PORT_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    job_token: str
    node_id: str
    node_rank_hint: int
    local_ranks: int
    agent_id: str
    host: str
    free_port: int
    wait_s: float
    def __init__(self, job_token: _Optional[str] = ..., node_id: _Optional[str] = ..., node_rank_hint: _Optional[int] = ..., local_ranks: _Optional[int] = ..., agent_id: _Optional[str] = ..., host: _Optional[str] = ..., free_port: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("round", "accepted", "state")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    round: int
    accepted: bool
    state: RendezvousState
    def __init__(self, round: _Optional[int] = ..., accepted: _Optional[bool] = ..., state: _Optional[_Union[RendezvousState, _Mapping]] = ...) -> None: ...

class GetRendezvousRequest(_message.Message):
    __slots__ = ("job_token", "round", "agent_id", "wait_s")
    JOB_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    job_token: str
    round: int
    agent_id: str
    wait_s: float
    def __init__(self, job_token: _Optional[str] = ..., round: _Optional[int] = ..., agent_id: _Optional[str] = ..., wait_s: _Optional[float] = ...) -> None: ...

class RendezvousState(_message.Message):
    __slots__ = ("round", "complete", "world_size", "group_rank", "rank_offset", "group_world_size", "master_addr", "master_port", "waiting_agents", "joined_agents")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    GROUP_RANK_FIELD_NUMBER: _ClassVar[int]
    RANK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    GROUP_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    WAITING_AGENTS_FIELD_NUMBER: _ClassVar[int]
    JOINED_AGENTS_FIELD_NUMBER: _ClassVar[int]
    round: int
    complete: bool
    world_size: int
    group_rank: int
    rank_offset: int
    group_world_size: int
    master_addr: str
    master_port: int
    waiting_agents: int
    joined_agents: int
    def __init__(self, round: _Optional[int] = ..., complete: _Optional[bool] = ..., world_size: _Optional[int] = ..., group_rank: _Optional[int] = ..., rank_offset: _Optional[int] = ..., group_world_size: _Optional[int] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., waiting_agents: _Optional[int] = ..., joined_agents: _Optional[int] = ...) -> None: ...

class NodeCheckReport(_message.Message):
    __slots__ = ("job_token", "round", "agent_id", "node_id", "elapsed_s", "success", "error", "check_round")
    JOB_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CHECK_ROUND_FIELD_NUMBER: _ClassVar[int]
    job_token: str
    round: int
    agent_id: str
    node_id: str
    elapsed_s: float
    success: bool
    error: str
    check_round: int
    def __init__(self, job_token: _Optional[str] = ..., round: _Optional[int] = ..., agent_id: _Optional[str] = ..., node_id: _Optional[str] = ..., elapsed_s: _Optional[float] = ..., success: _Optional[bool] = ..., error: _Optional[str] = ..., check_round: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("job_token", "round", "agent_id", "step", "has_metric", "metric", "timestamp", "wait_s", "idle")
    JOB_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    HAS_METRIC_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    job_token: str
    round: int
    agent_id: str
    step: int
    has_metric: bool
    metric: float
    timestamp: float
    wait_s: float
    idle: bool
    def __init__(self, job_token: _Optional[str] = ..., round: _Optional[int] = ..., agent_id: _Optional[str] = ..., step: _Optional[int] = ..., has_metric: _Optional[bool] = ..., metric: _Optional[float] = ..., timestamp: _Optional[float] = ..., wait_s: _Optional[float] = ..., idle: _Optional[bool] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("action",)
    ACTION_FIELD_NUMBER: _ClassVar[int]
    action: Action
    def __init__(self, action: _Optional[_Union[Action, str]] = ...) -> None: ...

class FailureReport(_message.Message):
    __slots__ = ("job_token", "round", "agent_id", "local_rank", "exit_code", "error")
    JOB_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    job_token: str
    round: int
    agent_id: str
    local_rank: int
    exit_code: int
    error: str
    def __init__(self, job_token: _Optional[str] = ..., round: _Optional[int] = ..., agent_id: _Optional[str] = ..., local_rank: _Optional[int] = ..., exit_code: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
