from prefill_gate.v1 import tracing_pb2 as _tracing_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GatePoint(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GATE_POINT_NONE: _ClassVar[GatePoint]
    GATE_POINT_ANY: _ClassVar[GatePoint]
    GATE_POINT_ALL: _ClassVar[GatePoint]
GATE_POINT_NONE: GatePoint
GATE_POINT_ANY: GatePoint
GATE_POINT_ALL: GatePoint

class RankRow(_message.Message):
    __slots__ = ("rank", "num_tokens", "batch_size", "num_extends", "want_prefill", "has_decode_work", "planned_prefill", "occupancy", "pool_pages_used", "pool_pages_usable", "resident_chunks", "waiting_prompts", "storage_reads", "retracted", "running", "config_epoch", "prefill_tokens", "pending_prefill_tokens", "retractions_total", "forward_us", "above_watermark", "blocks_all", "spans_dropped")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_EXTENDS_FIELD_NUMBER: _ClassVar[int]
    WANT_PREFILL_FIELD_NUMBER: _ClassVar[int]
    HAS_DECODE_WORK_FIELD_NUMBER: _ClassVar[int]
    PLANNED_PREFILL_FIELD_NUMBER: _ClassVar[int]
    OCCUPANCY_FIELD_NUMBER: _ClassVar[int]
    POOL_PAGES_USED_FIELD_NUMBER: _ClassVar[int]
    POOL_PAGES_USABLE_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    WAITING_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    STORAGE_READS_FIELD_NUMBER: _ClassVar[int]
    RETRACTED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    CONFIG_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PENDING_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETRACTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FORWARD_US_FIELD_NUMBER: _ClassVar[int]
    ABOVE_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_ALL_FIELD_NUMBER: _ClassVar[int]
    SPANS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    rank: int
    num_tokens: int
    batch_size: int
    num_extends: int
    want_prefill: bool
    has_decode_work: bool
    planned_prefill: bool
    occupancy: float
    pool_pages_used: int
    pool_pages_usable: int
    resident_chunks: int
    waiting_prompts: int
    storage_reads: int
    retracted: int
    running: int
    config_epoch: int
    prefill_tokens: int
    pending_prefill_tokens: int
    retractions_total: int
    forward_us: int
    above_watermark: bool
    blocks_all: bool
    spans_dropped: int
    def __init__(self, rank: _Optional[int] = ..., num_tokens: _Optional[int] = ..., batch_size: _Optional[int] = ..., num_extends: _Optional[int] = ..., want_prefill: _Optional[bool] = ..., has_decode_work: _Optional[bool] = ..., planned_prefill: _Optional[bool] = ..., occupancy: _Optional[float] = ..., pool_pages_used: _Optional[int] = ..., pool_pages_usable: _Optional[int] = ..., resident_chunks: _Optional[int] = ..., waiting_prompts: _Optional[int] = ..., storage_reads: _Optional[int] = ..., retracted: _Optional[int] = ..., running: _Optional[int] = ..., config_epoch: _Optional[int] = ..., prefill_tokens: _Optional[int] = ..., pending_prefill_tokens: _Optional[int] = ..., retractions_total: _Optional[int] = ..., forward_us: _Optional[int] = ..., above_watermark: _Optional[bool] = ..., blocks_all: _Optional[bool] = ..., spans_dropped: _Optional[int] = ...) -> None: ...

class GateConfig(_message.Message):
    __slots__ = ("epoch", "attempt_interval", "any_interval", "enabled", "policy", "changed_by", "reason")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    ANY_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CHANGED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    attempt_interval: int
    any_interval: int
    enabled: bool
    policy: str
    changed_by: str
    reason: str
    def __init__(self, epoch: _Optional[int] = ..., attempt_interval: _Optional[int] = ..., any_interval: _Optional[int] = ..., enabled: _Optional[bool] = ..., policy: _Optional[str] = ..., changed_by: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RoundRecord(_message.Message):
    __slots__ = ("round", "unix_nanos", "counter", "point", "open", "counter_after", "all_decode_or_idle", "round_seconds", "ranks", "config", "dropped_before", "clock_seconds", "run_id", "adopted_epoch", "ranks_extending", "ranks_wanting", "ranks_blocking_all", "latest_round", "sent_unix_nanos", "ttft_seconds", "itl_seconds", "itl_tokens", "adopted_config", "following")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    POINT_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    COUNTER_AFTER_FIELD_NUMBER: _ClassVar[int]
    ALL_DECODE_OR_IDLE_FIELD_NUMBER: _ClassVar[int]
    ROUND_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    CLOCK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RANKS_EXTENDING_FIELD_NUMBER: _ClassVar[int]
    RANKS_WANTING_FIELD_NUMBER: _ClassVar[int]
    RANKS_BLOCKING_ALL_FIELD_NUMBER: _ClassVar[int]
    LATEST_ROUND_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    TTFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ITL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ITL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_CONFIG_FIELD_NUMBER: _ClassVar[int]
    FOLLOWING_FIELD_NUMBER: _ClassVar[int]
    round: int
    unix_nanos: int
    counter: int
    point: GatePoint
    open: bool
    counter_after: int
    all_decode_or_idle: bool
    round_seconds: float
    ranks: _containers.RepeatedCompositeFieldContainer[RankRow]
    config: GateConfig
    dropped_before: int
    clock_seconds: float
    run_id: str
    adopted_epoch: int
    ranks_extending: int
    ranks_wanting: int
    ranks_blocking_all: int
    latest_round: int
    sent_unix_nanos: int
    ttft_seconds: _containers.RepeatedScalarFieldContainer[float]
    itl_seconds: _containers.RepeatedScalarFieldContainer[float]
    itl_tokens: _containers.RepeatedScalarFieldContainer[int]
    adopted_config: GateConfig
    following: _containers.RepeatedCompositeFieldContainer[RoundRecord]
    def __init__(self, round: _Optional[int] = ..., unix_nanos: _Optional[int] = ..., counter: _Optional[int] = ..., point: _Optional[_Union[GatePoint, str]] = ..., open: _Optional[bool] = ..., counter_after: _Optional[int] = ..., all_decode_or_idle: _Optional[bool] = ..., round_seconds: _Optional[float] = ..., ranks: _Optional[_Iterable[_Union[RankRow, _Mapping]]] = ..., config: _Optional[_Union[GateConfig, _Mapping]] = ..., dropped_before: _Optional[int] = ..., clock_seconds: _Optional[float] = ..., run_id: _Optional[str] = ..., adopted_epoch: _Optional[int] = ..., ranks_extending: _Optional[int] = ..., ranks_wanting: _Optional[int] = ..., ranks_blocking_all: _Optional[int] = ..., latest_round: _Optional[int] = ..., sent_unix_nanos: _Optional[int] = ..., ttft_seconds: _Optional[_Iterable[float]] = ..., itl_seconds: _Optional[_Iterable[float]] = ..., itl_tokens: _Optional[_Iterable[int]] = ..., adopted_config: _Optional[_Union[GateConfig, _Mapping]] = ..., following: _Optional[_Iterable[_Union[RoundRecord, _Mapping]]] = ...) -> None: ...

class RunStats(_message.Message):
    __slots__ = ("rounds", "rounds_per_second", "output_tokens_per_second", "ttft_p50_seconds", "ttft_p99_seconds", "itl_p50_seconds", "itl_p99_seconds", "gate_wait_p99_seconds", "gate_wait_p99_rounds", "extend_round_share", "ranks_extending_per_window", "windows_any", "windows_all", "requests_submitted", "requests_finished", "requests_aborted", "requests_refused", "output_tokens", "retractions", "records_dropped", "trace_spans_dropped", "elapsed_seconds", "requests_cut_off", "tracing", "prompt_tokens", "prefix_hit_requests", "prefix_hit_tokens", "prefix_hit_share")
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    TTFT_P50_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TTFT_P99_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ITL_P50_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ITL_P99_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GATE_WAIT_P99_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GATE_WAIT_P99_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    EXTEND_ROUND_SHARE_FIELD_NUMBER: _ClassVar[int]
    RANKS_EXTENDING_PER_WINDOW_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_ANY_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_ALL_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_SUBMITTED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_ABORTED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETRACTIONS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    TRACE_SPANS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_CUT_OFF_FIELD_NUMBER: _ClassVar[int]
    TRACING_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_SHARE_FIELD_NUMBER: _ClassVar[int]
    rounds: int
    rounds_per_second: float
    output_tokens_per_second: float
    ttft_p50_seconds: float
    ttft_p99_seconds: float
    itl_p50_seconds: float
    itl_p99_seconds: float
    gate_wait_p99_seconds: float
    gate_wait_p99_rounds: float
    extend_round_share: float
    ranks_extending_per_window: float
    windows_any: int
    windows_all: int
    requests_submitted: int
    requests_finished: int
    requests_aborted: int
    requests_refused: int
    output_tokens: int
    retractions: int
    records_dropped: int
    trace_spans_dropped: int
    elapsed_seconds: float
    requests_cut_off: int
    tracing: _tracing_pb2.TracingStatus
    prompt_tokens: int
    prefix_hit_requests: int
    prefix_hit_tokens: int
    prefix_hit_share: float
    def __init__(self, rounds: _Optional[int] = ..., rounds_per_second: _Optional[float] = ..., output_tokens_per_second: _Optional[float] = ..., ttft_p50_seconds: _Optional[float] = ..., ttft_p99_seconds: _Optional[float] = ..., itl_p50_seconds: _Optional[float] = ..., itl_p99_seconds: _Optional[float] = ..., gate_wait_p99_seconds: _Optional[float] = ..., gate_wait_p99_rounds: _Optional[float] = ..., extend_round_share: _Optional[float] = ..., ranks_extending_per_window: _Optional[float] = ..., windows_any: _Optional[int] = ..., windows_all: _Optional[int] = ..., requests_submitted: _Optional[int] = ..., requests_finished: _Optional[int] = ..., requests_aborted: _Optional[int] = ..., requests_refused: _Optional[int] = ..., output_tokens: _Optional[int] = ..., retractions: _Optional[int] = ..., records_dropped: _Optional[int] = ..., trace_spans_dropped: _Optional[int] = ..., elapsed_seconds: _Optional[float] = ..., requests_cut_off: _Optional[int] = ..., tracing: _Optional[_Union[_tracing_pb2.TracingStatus, _Mapping]] = ..., prompt_tokens: _Optional[int] = ..., prefix_hit_requests: _Optional[int] = ..., prefix_hit_tokens: _Optional[int] = ..., prefix_hit_share: _Optional[float] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("run_id", "dp_size", "executor", "state", "latest", "config", "stats", "history_first_round", "history_last_round", "failure", "last_round_age_seconds")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DP_SIZE_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIRST_ROUND_FIELD_NUMBER: _ClassVar[int]
    HISTORY_LAST_ROUND_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    LAST_ROUND_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    dp_size: int
    executor: str
    state: str
    latest: RoundRecord
    config: GateConfig
    stats: RunStats
    history_first_round: int
    history_last_round: int
    failure: str
    last_round_age_seconds: float
    def __init__(self, run_id: _Optional[str] = ..., dp_size: _Optional[int] = ..., executor: _Optional[str] = ..., state: _Optional[str] = ..., latest: _Optional[_Union[RoundRecord, _Mapping]] = ..., config: _Optional[_Union[GateConfig, _Mapping]] = ..., stats: _Optional[_Union[RunStats, _Mapping]] = ..., history_first_round: _Optional[int] = ..., history_last_round: _Optional[int] = ..., failure: _Optional[str] = ..., last_round_age_seconds: _Optional[float] = ...) -> None: ...

class RecordingHeader(_message.Message):
    __slots__ = ("magic", "version", "run_id", "dp_size", "started_unix_nanos", "executor")
    MAGIC_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DP_SIZE_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    magic: str
    version: int
    run_id: str
    dp_size: int
    started_unix_nanos: int
    executor: str
    def __init__(self, magic: _Optional[str] = ..., version: _Optional[int] = ..., run_id: _Optional[str] = ..., dp_size: _Optional[int] = ..., started_unix_nanos: _Optional[int] = ..., executor: _Optional[str] = ...) -> None: ...
