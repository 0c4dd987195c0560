from prefill_gate.v1 import types_pb2 as _types_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UpdateIntervalsRequest(_message.Message):
    __slots__ = ("attempt_interval", "any_interval", "disable", "expected_epoch", "validate_only", "changed_by", "reason")
    ATTEMPT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    ANY_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    DISABLE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    CHANGED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    attempt_interval: int
    any_interval: int
    disable: bool
    expected_epoch: int
    validate_only: bool
    changed_by: str
    reason: str
    def __init__(self, attempt_interval: _Optional[int] = ..., any_interval: _Optional[int] = ..., disable: _Optional[bool] = ..., expected_epoch: _Optional[int] = ..., validate_only: _Optional[bool] = ..., changed_by: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class UpdateIntervalsResponse(_message.Message):
    __slots__ = ("config", "adopted_round", "validated_only")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_ROUND_FIELD_NUMBER: _ClassVar[int]
    VALIDATED_ONLY_FIELD_NUMBER: _ClassVar[int]
    config: _types_pb2.GateConfig
    adopted_round: int
    validated_only: bool
    def __init__(self, config: _Optional[_Union[_types_pb2.GateConfig, _Mapping]] = ..., adopted_round: _Optional[int] = ..., validated_only: _Optional[bool] = ...) -> None: ...
