"""The node link's messages: engine commands, request events and rank lifecycle <-> `nodes.proto`.

Every value crosses exactly: a message decoded from its encoding equals the original (a property test
holds this), so a remote rank's events reach the controller as a local rank's would.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.config import PrefillDelay
from engine.drivers.procs import RankExited, RankFailed, RankMessage, RankReady, RankRound
from engine.request import (
    Abort,
    AbortIgnored,
    Admitted,
    ChunkPlanned,
    Command,
    Finished,
    FinishReason,
    FirstToken,
    ProposalRefused,
    ProposeConfig,
    Refused,
    RequestEvent,
    RequestSpec,
    Retracted,
    Stop,
    Submit,
    Tokens,
    UpdateWeights,
)
from prefill_gate.v1 import nodes_pb2 as pb

# Each event type and the RankRequestEvent oneof field (and message) that carries it; fields share names.
EVENT_FIELDS: dict[type, str] = {
    Admitted: "admitted",
    ChunkPlanned: "chunk_planned",
    FirstToken: "first_token",
    Tokens: "tokens",
    Finished: "finished",
    Refused: "refused",
    AbortIgnored: "abort_ignored",
    Retracted: "retracted",
    ProposalRefused: "proposal_refused",  # rank 0 (node 0) only: crosses a link only under a bug
}
EVENT_TYPES = {name: cls for cls, name in EVENT_FIELDS.items()}


class WireError(ValueError):
    """A link message this side cannot read (a newer peer, or corruption)."""


def spec_to_pb(spec: RequestSpec) -> pb.NodeRequestSpec:
    """A request as it crosses a link."""
    return pb.NodeRequestSpec(
        rid=spec.rid,
        prompt_len=spec.prompt_len,
        output_len=spec.output_len,
        arrival=spec.arrival,
        prompt=spec.prompt or (),
        prefix_hit=spec.prefix_hit,
    )


def spec_from_pb(message: pb.NodeRequestSpec) -> RequestSpec:
    """The request a link carried (an empty prompt is none: a valid request never has zero tokens)."""
    return RequestSpec(
        rid=message.rid,
        prompt_len=message.prompt_len,
        output_len=message.output_len,
        arrival=message.arrival,
        prompt=tuple(message.prompt) or None,
        prefix_hit=message.prefix_hit,
    )


def command_to_pb(rank: int, command: Command) -> pb.NodeCommand:
    """A command for `rank` as it crosses a link."""
    out = pb.NodeCommand(rank=rank)
    if isinstance(command, Submit):
        out.submit.request.CopyFrom(spec_to_pb(command.request))
    elif isinstance(command, Abort):
        out.abort.rid = command.rid
    elif isinstance(command, UpdateWeights):
        out.update_weights.SetInParent()
    elif isinstance(command, ProposeConfig):
        delay = command.delay
        out.propose.CopyFrom(
            pb.ProposeConfigCommand(
                epoch=command.epoch,
                disable=delay is None,
                attempt_interval=delay.attempt_interval if delay else 0,
                any_interval=delay.any_interval if delay else 0,
            )
        )
    elif isinstance(command, Stop):
        out.stop.SetInParent()
    else:
        raise TypeError(f"not a rank command: {command!r}")
    return out


def command_from_pb(message: pb.NodeCommand) -> tuple[int, Command]:
    """(rank, command) of a rank command; raises WireError for link-level or unknown commands."""
    kind = message.WhichOneof("command")
    if kind == "submit":
        return message.rank, Submit(spec_from_pb(message.submit.request))
    if kind == "abort":
        return message.rank, Abort(message.abort.rid)
    if kind == "update_weights":
        return message.rank, UpdateWeights()
    if kind == "propose":
        p = message.propose
        delay = None if p.disable else PrefillDelay(p.attempt_interval, p.any_interval)
        return message.rank, ProposeConfig(p.epoch, delay)
    if kind == "stop":
        return message.rank, Stop()
    raise WireError(f"not a rank command: {kind!r}")


def event_to_pb(event: RequestEvent) -> pb.RankRequestEvent:
    """A request event as it crosses a link."""
    name = EVENT_FIELDS.get(type(event))
    if name is None:
        raise TypeError(f"not a request event: {event!r}")
    out = pb.RankRequestEvent()
    getattr(out, name).CopyFrom(_message(getattr(pb, "Rank" + type(event).__name__), event))
    return out


def event_from_pb(message: pb.RankRequestEvent) -> RequestEvent:
    """The request event a link carried."""
    kind = message.WhichOneof("event")
    cls = EVENT_TYPES.get(kind or "")
    if cls is None:
        raise WireError(f"unknown request event {kind!r}")
    inner = getattr(message, kind)  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        value = getattr(inner, field.name)
        if field.name == "tokens" and cls is Tokens:
            value = tuple(value)
        elif field.name == "reason":
            value = FinishReason(value)
        values[field.name] = value
    return cls(**values)


def report_to_pb(message: RankMessage) -> pb.NodeReport:
    """A rank's lifecycle message or round events as they cross a link."""
    out = pb.NodeReport()
    if isinstance(message, RankReady):
        out.ready.CopyFrom(pb.RankReadyReport(rank=message.rank, pid=message.pid))
    elif isinstance(message, RankRound):
        out.round.CopyFrom(
            pb.RankRoundReport(
                rank=message.rank,
                round=message.round,
                events=[event_to_pb(event) for event in message.events],
                itl=[pb.ItlSample(seconds=seconds, requests=requests) for seconds, requests in message.itl],
            )
        )
    elif isinstance(message, RankFailed):
        out.failed.CopyFrom(pb.RankFailedReport(rank=message.rank, error=message.error, detail=message.detail))
    elif isinstance(message, RankExited):
        out.exited.CopyFrom(
            pb.RankExitedReport(
                rank=message.rank,
                rounds=message.rounds,
                gathers=message.gathers,
                phases=message.phases,
                observer_dropped=message.observer_dropped,
            )
        )
    else:
        raise TypeError(f"not a rank message: {message!r}")
    return out


def report_from_pb(message: pb.NodeReport) -> RankMessage:
    """The rank message a link carried; raises WireError for the hello or an unknown report."""
    kind = message.WhichOneof("report")
    if kind == "ready":
        return RankReady(message.ready.rank, message.ready.pid)
    if kind == "round":
        r = message.round
        return RankRound(
            r.rank,
            r.round,
            [event_from_pb(event) for event in r.events],
            [(sample.seconds, sample.requests) for sample in r.itl],
        )
    if kind == "failed":
        return RankFailed(message.failed.rank, message.failed.error, message.failed.detail)
    if kind == "exited":
        e = message.exited
        return RankExited(e.rank, e.rounds, e.gathers, dict(e.phases), e.observer_dropped)
    raise WireError(f"not a rank report: {kind!r}")


def _message(cls: Any, event: Any) -> Any:
    values = {}
    for field in dataclasses.fields(event):
        value = getattr(event, field.name)
        values[field.name] = str(value) if isinstance(value, FinishReason) else value
    return cls(**values)
