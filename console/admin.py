"""The console's admin calls: read the config, change the intervals, disable the gate.

The server validates (C3); the console only relays. A refusal comes back as `AdminError` carrying the
`google.rpc.BadRequest` field violations, so the editor can put each message next to its field.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2, status_pb2

from console.endpoint import Endpoint, describe_rpc_error
from prefill_gate.v1 import admin_pb2, types_pb2

_DETAILS_KEY = "grpc-status-details-bin"
_TIMEOUT_S = 15.0  # an accepted change is answered only once every rank adopted it (one round, normally)


class AdminError(Exception):
    """A refused or failed admin call: the gRPC code's name, a message, and field violations by proto field."""

    def __init__(self, code: str, message: str, violations: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.violations = violations or {}


@dataclass(frozen=True)
class Applied:
    """An accepted change: the config now in force and the round after which every rank adopted it."""

    config: types_pb2.GateConfig
    adopted_round: int
    validated_only: bool


class AdminClient:
    """GateAdmin on the console's endpoint."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    async def get_config(self) -> types_pb2.GateConfig:
        """The config in force."""
        try:
            return await self.endpoint.admin().GetConfig(
                admin_pb2.GetConfigRequest(), metadata=self.endpoint.metadata, timeout=_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            raise _admin_error(exc, self.endpoint.target) from None

    async def update_intervals(
        self, attempt: int | None, any_: int | None, *, expected_epoch: int | None = None
    ) -> Applied:
        """Ask for new intervals (None leaves a field unset, which the server refuses with a violation)."""
        request = admin_pb2.UpdateIntervalsRequest()
        if attempt is not None:
            request.attempt_interval = attempt
        if any_ is not None:
            request.any_interval = any_
        if expected_epoch is not None:
            request.expected_epoch = expected_epoch
        return await self._update(request)

    async def disable(self, *, expected_epoch: int | None = None) -> Applied:
        """Turn the gate off (every rank plans prefill freely from the adoption round on)."""
        request = admin_pb2.UpdateIntervalsRequest(disable=True)
        if expected_epoch is not None:
            request.expected_epoch = expected_epoch
        return await self._update(request)

    async def _update(self, request: admin_pb2.UpdateIntervalsRequest) -> Applied:
        try:
            response = await self.endpoint.admin().UpdateIntervals(
                request, metadata=self.endpoint.metadata, timeout=_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            raise _admin_error(exc, self.endpoint.target) from None
        return Applied(response.config, response.adopted_round, response.validated_only)


def _admin_error(error: grpc.aio.AioRpcError, target: str) -> AdminError:
    code = error.code()
    violations = field_violations(error.trailing_metadata() or ())
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
        message = error.details() or code.name
    else:
        message = describe_rpc_error(error, target)
    return AdminError(code.name, message, violations)


def field_violations(metadata: object) -> dict[str, list[str]]:
    """The BadRequest field violations carried in a call's trailing metadata (rich error model)."""
    out: dict[str, list[str]] = {}
    for key, value in metadata:  # type: ignore[attr-defined]
        if key != _DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                for violation in bad.field_violations:
                    out.setdefault(violation.field, []).append(violation.description)
    return out
