from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LinkHello(_message.Message):
    __slots__ = ("run_id", "node", "nnodes", "ranks", "server_args_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    NNODES_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    SERVER_ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: int
    nnodes: int
    ranks: _containers.RepeatedScalarFieldContainer[int]
    server_args_json: str
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[int] = ..., nnodes: _Optional[int] = ..., ranks: _Optional[_Iterable[int]] = ..., server_args_json: _Optional[str] = ...) -> None: ...

class NodeRequestSpec(_message.Message):
    __slots__ = ("rid", "prompt_len", "output_len", "arrival", "prompt", "prefix_hit")
    RID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LEN_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_FIELD_NUMBER: _ClassVar[int]
    rid: str
    prompt_len: int
    output_len: int
    arrival: float
    prompt: _containers.RepeatedScalarFieldContainer[int]
    prefix_hit: int
    def __init__(self, rid: _Optional[str] = ..., prompt_len: _Optional[int] = ..., output_len: _Optional[int] = ..., arrival: _Optional[float] = ..., prompt: _Optional[_Iterable[int]] = ..., prefix_hit: _Optional[int] = ...) -> None: ...

class SubmitCommand(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: NodeRequestSpec
    def __init__(self, request: _Optional[_Union[NodeRequestSpec, _Mapping]] = ...) -> None: ...

class AbortCommand(_message.Message):
    __slots__ = ("rid",)
    RID_FIELD_NUMBER: _ClassVar[int]
    rid: str
    def __init__(self, rid: _Optional[str] = ...) -> None: ...

class UpdateWeightsCommand(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProposeConfigCommand(_message.Message):
    __slots__ = ("epoch", "disable", "attempt_interval", "any_interval")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DISABLE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    ANY_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    disable: bool
    attempt_interval: int
    any_interval: int
    def __init__(self, epoch: _Optional[int] = ..., disable: _Optional[bool] = ..., attempt_interval: _Optional[int] = ..., any_interval: _Optional[int] = ...) -> None: ...

class StopCommand(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GoCommand(_message.Message):
    __slots__ = ("clock",)
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    clock: float
    def __init__(self, clock: _Optional[float] = ...) -> None: ...

class EndLink(_message.Message):
    __slots__ = ("failed", "reason")
    FAILED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    failed: bool
    reason: str
    def __init__(self, failed: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class NodeCommand(_message.Message):
    __slots__ = ("rank", "hello", "submit", "abort", "update_weights", "propose", "stop", "go", "end")
    RANK_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    PROPOSE_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    GO_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    rank: int
    hello: LinkHello
    submit: SubmitCommand
    abort: AbortCommand
    update_weights: UpdateWeightsCommand
    propose: ProposeConfigCommand
    stop: StopCommand
    go: GoCommand
    end: EndLink
    def __init__(self, rank: _Optional[int] = ..., hello: _Optional[_Union[LinkHello, _Mapping]] = ..., submit: _Optional[_Union[SubmitCommand, _Mapping]] = ..., abort: _Optional[_Union[AbortCommand, _Mapping]] = ..., update_weights: _Optional[_Union[UpdateWeightsCommand, _Mapping]] = ..., propose: _Optional[_Union[ProposeConfigCommand, _Mapping]] = ..., stop: _Optional[_Union[StopCommand, _Mapping]] = ..., go: _Optional[_Union[GoCommand, _Mapping]] = ..., end: _Optional[_Union[EndLink, _Mapping]] = ...) -> None: ...

class AgentHello(_message.Message):
    __slots__ = ("node", "ranks", "hostname", "pid")
    NODE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    node: int
    ranks: _containers.RepeatedScalarFieldContainer[int]
    hostname: str
    pid: int
    def __init__(self, node: _Optional[int] = ..., ranks: _Optional[_Iterable[int]] = ..., hostname: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...

class RankReadyReport(_message.Message):
    __slots__ = ("rank", "pid")
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    rank: int
    pid: int
    def __init__(self, rank: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class RankAdmitted(_message.Message):
    __slots__ = ("rid", "rank", "round", "time", "wait_rounds", "wait_seconds")
    RID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    WAIT_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    rid: str
    rank: int
    round: int
    time: float
    wait_rounds: int
    wait_seconds: float
    def __init__(self, rid: _Optional[str] = ..., rank: _Optional[int] = ..., round: _Optional[int] = ..., time: _Optional[float] = ..., wait_rounds: _Optional[int] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class RankChunkPlanned(_message.Message):
    __slots__ = ("rid", "rank", "round", "tokens")
    RID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    rid: str
    rank: int
    round: int
    tokens: int
    def __init__(self, rid: _Optional[str] = ..., rank: _Optional[int] = ..., round: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class RankFirstToken(_message.Message):
    __slots__ = ("rid", "rank", "round", "time")
    RID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    rid: str
    rank: int
    round: int
    time: float
    def __init__(self, rid: _Optional[str] = ..., rank: _Optional[int] = ..., round: _Optional[int] = ..., time: _Optional[float] = ...) -> None: ...

class RankTokens(_message.Message):
    __slots__ = ("rid", "tokens")
    RID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    rid: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, rid: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class RankFinished(_message.Message):
    __slots__ = ("rid", "rank", "round", "time", "reason", "output_len", "detail")
    RID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    rid: str
    rank: int
    round: int
    time: float
    reason: str
    output_len: int
    detail: str
    def __init__(self, rid: _Optional[str] = ..., rank: _Optional[int] = ..., round: _Optional[int] = ..., time: _Optional[float] = ..., reason: _Optional[str] = ..., output_len: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class RankRefused(_message.Message):
    __slots__ = ("rid", "rank", "error")
    RID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    rid: str
    rank: int
    error: str
    def __init__(self, rid: _Optional[str] = ..., rank: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class RankAbortIgnored(_message.Message):
    __slots__ = ("rid", "rank")
    RID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    rid: str
    rank: int
    def __init__(self, rid: _Optional[str] = ..., rank: _Optional[int] = ...) -> None: ...

class RankRetracted(_message.Message):
    __slots__ = ("rid", "rank", "round")
    RID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    rid: str
    rank: int
    round: int
    def __init__(self, rid: _Optional[str] = ..., rank: _Optional[int] = ..., round: _Optional[int] = ...) -> None: ...

class RankProposalRefused(_message.Message):
    __slots__ = ("epoch", "error", "rid")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    error: str
    rid: str
    def __init__(self, epoch: _Optional[int] = ..., error: _Optional[str] = ..., rid: _Optional[str] = ...) -> None: ...

class RankRequestEvent(_message.Message):
    __slots__ = ("admitted", "chunk_planned", "first_token", "tokens", "finished", "refused", "abort_ignored", "retracted", "proposal_refused")
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    CHUNK_PLANNED_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    ABORT_IGNORED_FIELD_NUMBER: _ClassVar[int]
    RETRACTED_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_REFUSED_FIELD_NUMBER: _ClassVar[int]
    admitted: RankAdmitted
    chunk_planned: RankChunkPlanned
    first_token: RankFirstToken
    tokens: RankTokens
    finished: RankFinished
    refused: RankRefused
    abort_ignored: RankAbortIgnored
    retracted: RankRetracted
    proposal_refused: RankProposalRefused
    def __init__(self, admitted: _Optional[_Union[RankAdmitted, _Mapping]] = ..., chunk_planned: _Optional[_Union[RankChunkPlanned, _Mapping]] = ..., first_token: _Optional[_Union[RankFirstToken, _Mapping]] = ..., tokens: _Optional[_Union[RankTokens, _Mapping]] = ..., finished: _Optional[_Union[RankFinished, _Mapping]] = ..., refused: _Optional[_Union[RankRefused, _Mapping]] = ..., abort_ignored: _Optional[_Union[RankAbortIgnored, _Mapping]] = ..., retracted: _Optional[_Union[RankRetracted, _Mapping]] = ..., proposal_refused: _Optional[_Union[RankProposalRefused, _Mapping]] = ...) -> None: ...

class ItlSample(_message.Message):
    __slots__ = ("seconds", "requests")
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    seconds: float
    requests: int
    def __init__(self, seconds: _Optional[float] = ..., requests: _Optional[int] = ...) -> None: ...

class RankRoundReport(_message.Message):
    __slots__ = ("rank", "round", "events", "itl")
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ITL_FIELD_NUMBER: _ClassVar[int]
    rank: int
    round: int
    events: _containers.RepeatedCompositeFieldContainer[RankRequestEvent]
    itl: _containers.RepeatedCompositeFieldContainer[ItlSample]
    def __init__(self, rank: _Optional[int] = ..., round: _Optional[int] = ..., events: _Optional[_Iterable[_Union[RankRequestEvent, _Mapping]]] = ..., itl: _Optional[_Iterable[_Union[ItlSample, _Mapping]]] = ...) -> None: ...

class RankFailedReport(_message.Message):
    __slots__ = ("rank", "error", "detail")
    RANK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    rank: int
    error: str
    detail: str
    def __init__(self, rank: _Optional[int] = ..., error: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class RankExitedReport(_message.Message):
    __slots__ = ("rank", "rounds", "gathers", "phases", "observer_dropped")
    class PhasesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RANK_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    GATHERS_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    OBSERVER_DROPPED_FIELD_NUMBER: _ClassVar[int]
    rank: int
    rounds: int
    gathers: int
    phases: _containers.ScalarMap[str, float]
    observer_dropped: int
    def __init__(self, rank: _Optional[int] = ..., rounds: _Optional[int] = ..., gathers: _Optional[int] = ..., phases: _Optional[_Mapping[str, float]] = ..., observer_dropped: _Optional[int] = ...) -> None: ...

class NodeReport(_message.Message):
    __slots__ = ("hello", "ready", "round", "failed", "exited")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    hello: AgentHello
    ready: RankReadyReport
    round: RankRoundReport
    failed: RankFailedReport
    exited: RankExitedReport
    def __init__(self, hello: _Optional[_Union[AgentHello, _Mapping]] = ..., ready: _Optional[_Union[RankReadyReport, _Mapping]] = ..., round: _Optional[_Union[RankRoundReport, _Mapping]] = ..., failed: _Optional[_Union[RankFailedReport, _Mapping]] = ..., exited: _Optional[_Union[RankExitedReport, _Mapping]] = ...) -> None: ...
