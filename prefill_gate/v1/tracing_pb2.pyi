from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class TracingStatus(_message.Message):
    __slots__ = ("enabled", "endpoint", "sample_rate", "window_sample_rate", "request_spans_per_second", "rounds_seen", "rounds_traced", "rounds_traced_by_reason", "requests_traced", "requests_untraced", "spans_dropped", "spans_dropped_by_ranks", "ranks_final", "exporter_state", "exporter_detail", "exporter_queued", "spans_offered", "spans_exported", "spans_refused", "spans_failed", "spans_unconfirmed")
    class RoundsTracedByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_SPANS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_SEEN_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_TRACED_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_TRACED_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_TRACED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_UNTRACED_FIELD_NUMBER: _ClassVar[int]
    SPANS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    SPANS_DROPPED_BY_RANKS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FINAL_FIELD_NUMBER: _ClassVar[int]
    EXPORTER_STATE_FIELD_NUMBER: _ClassVar[int]
    EXPORTER_DETAIL_FIELD_NUMBER: _ClassVar[int]
    EXPORTER_QUEUED_FIELD_NUMBER: _ClassVar[int]
    SPANS_OFFERED_FIELD_NUMBER: _ClassVar[int]
    SPANS_EXPORTED_FIELD_NUMBER: _ClassVar[int]
    SPANS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    SPANS_FAILED_FIELD_NUMBER: _ClassVar[int]
    SPANS_UNCONFIRMED_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    endpoint: str
    sample_rate: float
    window_sample_rate: float
    request_spans_per_second: float
    rounds_seen: int
    rounds_traced: int
    rounds_traced_by_reason: _containers.ScalarMap[str, int]
    requests_traced: int
    requests_untraced: int
    spans_dropped: int
    spans_dropped_by_ranks: int
    ranks_final: bool
    exporter_state: str
    exporter_detail: str
    exporter_queued: int
    spans_offered: int
    spans_exported: int
    spans_refused: int
    spans_failed: int
    spans_unconfirmed: int
    def __init__(self, enabled: _Optional[bool] = ..., endpoint: _Optional[str] = ..., sample_rate: _Optional[float] = ..., window_sample_rate: _Optional[float] = ..., request_spans_per_second: _Optional[float] = ..., rounds_seen: _Optional[int] = ..., rounds_traced: _Optional[int] = ..., rounds_traced_by_reason: _Optional[_Mapping[str, int]] = ..., requests_traced: _Optional[int] = ..., requests_untraced: _Optional[int] = ..., spans_dropped: _Optional[int] = ..., spans_dropped_by_ranks: _Optional[int] = ..., ranks_final: _Optional[bool] = ..., exporter_state: _Optional[str] = ..., exporter_detail: _Optional[str] = ..., exporter_queued: _Optional[int] = ..., spans_offered: _Optional[int] = ..., spans_exported: _Optional[int] = ..., spans_refused: _Optional[int] = ..., spans_failed: _Optional[int] = ..., spans_unconfirmed: _Optional[int] = ...) -> None: ...
