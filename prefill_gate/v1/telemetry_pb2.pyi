from prefill_gate.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WatchMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WATCH_MODE_LOSSLESS_BOUNDED: _ClassVar[WatchMode]
    WATCH_MODE_LATEST_ONLY: _ClassVar[WatchMode]
WATCH_MODE_LOSSLESS_BOUNDED: WatchMode
WATCH_MODE_LATEST_ONLY: WatchMode

class WatchRoundsRequest(_message.Message):
    __slots__ = ("from_round", "mode", "max_queue", "ranks", "max_batch", "max_batch_delay_ms")
    FROM_ROUND_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    from_round: int
    mode: WatchMode
    max_queue: int
    ranks: _containers.RepeatedScalarFieldContainer[int]
    max_batch: int
    max_batch_delay_ms: int
    def __init__(self, from_round: _Optional[int] = ..., mode: _Optional[_Union[WatchMode, str]] = ..., max_queue: _Optional[int] = ..., ranks: _Optional[_Iterable[int]] = ..., max_batch: _Optional[int] = ..., max_batch_delay_ms: _Optional[int] = ...) -> None: ...

class GetSnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRoundsRequest(_message.Message):
    __slots__ = ("from_round", "to_round", "ranks")
    FROM_ROUND_FIELD_NUMBER: _ClassVar[int]
    TO_ROUND_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    from_round: int
    to_round: int
    ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, from_round: _Optional[int] = ..., to_round: _Optional[int] = ..., ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class GetRoundsResponse(_message.Message):
    __slots__ = ("records", "history_first_round", "history_last_round", "truncated")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIRST_ROUND_FIELD_NUMBER: _ClassVar[int]
    HISTORY_LAST_ROUND_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[_types_pb2.RoundRecord]
    history_first_round: int
    history_last_round: int
    truncated: bool
    def __init__(self, records: _Optional[_Iterable[_Union[_types_pb2.RoundRecord, _Mapping]]] = ..., history_first_round: _Optional[int] = ..., history_last_round: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...
