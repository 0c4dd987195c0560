from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitRequest(_message.Message):
    __slots__ = ("request_id", "prompt", "prompt_len", "output_len", "prefix_hit", "rank")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LEN_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: _containers.RepeatedScalarFieldContainer[int]
    prompt_len: int
    output_len: int
    prefix_hit: int
    rank: int
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[_Iterable[int]] = ..., prompt_len: _Optional[int] = ..., output_len: _Optional[int] = ..., prefix_hit: _Optional[int] = ..., rank: _Optional[int] = ...) -> None: ...

class Accepted(_message.Message):
    __slots__ = ("request_id", "rank")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    rank: int
    def __init__(self, request_id: _Optional[str] = ..., rank: _Optional[int] = ...) -> None: ...

class TokenBatch(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class FirstToken(_message.Message):
    __slots__ = ("ttft_seconds", "round")
    TTFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ttft_seconds: float
    round: int
    def __init__(self, ttft_seconds: _Optional[float] = ..., round: _Optional[int] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("reason", "output_len", "ttft_seconds", "e2e_seconds", "gate_wait_rounds", "gate_wait_seconds", "detail")
    REASON_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    TTFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    E2E_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GATE_WAIT_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    GATE_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    reason: str
    output_len: int
    ttft_seconds: float
    e2e_seconds: float
    gate_wait_rounds: int
    gate_wait_seconds: float
    detail: str
    def __init__(self, reason: _Optional[str] = ..., output_len: _Optional[int] = ..., ttft_seconds: _Optional[float] = ..., e2e_seconds: _Optional[float] = ..., gate_wait_rounds: _Optional[int] = ..., gate_wait_seconds: _Optional[float] = ..., detail: _Optional[str] = ...) -> None: ...

class SubmitEvent(_message.Message):
    __slots__ = ("accepted", "tokens", "first_token", "finished")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    accepted: Accepted
    tokens: TokenBatch
    first_token: FirstToken
    finished: Finished
    def __init__(self, accepted: _Optional[_Union[Accepted, _Mapping]] = ..., tokens: _Optional[_Union[TokenBatch, _Mapping]] = ..., first_token: _Optional[_Union[FirstToken, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...
