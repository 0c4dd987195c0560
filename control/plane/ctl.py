"""`prefill-gate ctl`: the control plane from a terminal.

    prefill-gate ctl --target HOST:PORT config
    prefill-gate ctl set --attempt 2 --any 8 [--validate-only] [--expected-epoch E] [--reason TEXT]
    prefill-gate ctl disable
    prefill-gate ctl watch [--rank R ...] [--count N]        one compact line per round
    prefill-gate ctl submit --prompt-len 128 --output-len 32  (or --prompt 1,2,3)
    prefill-gate ctl snapshot [--json]

The admin token comes from --token, --token-file or $PREFILL_GATE_ADMIN_TOKEN. A refused call prints the server's
status and every field violation, and exits 1; nothing prints a traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import grpc
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from control.plane.auth import DEFAULT_PORT, TOKEN_ENV, bearer_metadata, read_token_file
from prefill_gate.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    requests_pb2,
    requests_pb2_grpc,
    telemetry_pb2,
    telemetry_pb2_grpc,
)
from prefill_gate.v1 import types_pb2 as pb

# A stream reader that wants fresh records keeps the transport's receive window small: with gRPC's
# defaults (BDP probing) megabytes of old records pile up in HTTP/2 buffers before the server's own
# bounded queue, which counts what it drops, ever fills (see PRACTICE.md).
# Lookahead 0: the window opens only for the read in progress, so nothing waits in HTTP/2 buffers while
# the reader is busy (see WatchRounds in the proto).
FRESH_STREAM_OPTIONS = (("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 0))
# A record read later than this after rank 0 published it says how old it is.
STALE_AFTER_S = 1.0
# What gRPC says when no connection could be made (a server's own UNAVAILABLE, a crash or a drain, says why).
_CONNECTION_FAILED = re.compile(
    r"failed to connect|connection refused|socket closed|connection reset|handshake|end of tls|"
    r"unexpected eof|dns resolution|deadline", re.IGNORECASE
)
POINTS = {pb.GATE_POINT_NONE: "-", pb.GATE_POINT_ANY: "ANY", pb.GATE_POINT_ALL: "ALL"}


def add_ctl_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `ctl` and its commands to the top-level subparsers; returns the `ctl` parser."""
    ctl = subparsers.add_parser(
        "ctl",
        help="talk to a running engine's control plane",
        description="Read and change a running engine through its gRPC control plane.",
    )
    add_endpoint_args(ctl)
    ctl.add_argument("--timeout", type=float, default=30.0, help="seconds a unary call may take")
    commands = ctl.add_subparsers(dest="ctl_command", required=True, metavar="CTL_COMMAND")
    commands.add_parser("config", help="the gate config in force")
    change = commands.add_parser("set", help="change the gate's intervals on every rank at once")
    change.add_argument("--attempt", type=int, required=True, help="ALL interval A")
    change.add_argument("--any", type=int, required=True, help="ANY interval K (>= A)")
    disable = commands.add_parser("disable", help="turn the gate off")
    for command in (change, disable):
        command.add_argument("--validate-only", action="store_true", help="validate, change nothing")
        command.add_argument("--expected-epoch", type=int, default=None, help="refuse unless this epoch is current")
        command.add_argument("--reason", default="", help="why (shown with the config; default: what changed)")
    watch = commands.add_parser("watch", help="one compact line per round")
    watch.add_argument("--rank", type=int, action="append", default=[], help="show these ranks' rows (repeatable)")
    watch.add_argument("--from-round", type=int, default=None, help="resume from this round of the history")
    watch.add_argument("--latest-only", action="store_true", help="skip to the newest round when behind")
    watch.add_argument("--count", type=int, default=0, help="stop after this many rounds (0: until the end)")
    submit = commands.add_parser("submit", help="submit one request and follow it to the end")
    submit.add_argument("--prompt-len", type=int, default=0, help="synthetic prompt tokens")
    submit.add_argument("--prompt", default=None, help="prompt token ids, comma-separated")
    submit.add_argument("--output-len", type=int, default=16, help="tokens to generate")
    submit.add_argument("--prefix-hit", type=int, default=0, help="prompt tokens cached on the storage tier (sim)")
    submit.add_argument("--rank", type=int, default=None, help="pin to a rank")
    submit.add_argument("--request-id", default="", help="request id (default: the server assigns one)")
    snapshot = commands.add_parser("snapshot", help="the latest round, the config and the run's figures")
    snapshot.add_argument("--json", action="store_true", help="print the Snapshot message as JSON")
    return ctl


def ctl_main(ns: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run one `ctl` command; returns the exit code (0 ok, 1 refused or unreachable, 130 interrupted)."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        token = admin_token(ns)
        channel = open_channel(ns.target, ns.tls_ca, watch=ns.ctl_command == "watch")
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=err)
        return 1
    command = COMMANDS[ns.ctl_command]
    try:
        with channel:
            command(channel, ns, bearer_metadata(token), out)
    except grpc.RpcError as exc:
        print(describe_error(exc, tls=ns.tls_ca is not None), file=err)
        return 1
    except ValueError as exc:
        print(f"error: {exc}", file=err)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`ctl watch | head`): point stdout at /dev/null so the exit-time flush is quiet.
        if out is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


def describe_error(exc: grpc.RpcError, *, tls: bool = False) -> str:
    """The status code, the server's message and every field violation, one per line; for a connection
    that failed, what to check (including TLS when the call was plaintext)."""
    code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    lines = [f"error: {code.name}: {details}"]
    if code is grpc.StatusCode.UNAVAILABLE and _CONNECTION_FAILED.search(details or ""):
        lines.append("  is the engine running, and is --target right?")
        if not tls:
            lines.append("  if the server serves TLS (serve --tls-cert), connect with --tls-ca FILE")
    try:
        status = rpc_status.from_call(exc) if isinstance(exc, grpc.Call) else None
    except ValueError:
        status = None
    for detail in status.details if status else ():
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            lines += [f"  {violation.field}: {violation.description}" for violation in bad.field_violations]
    return "\n".join(lines)


def add_endpoint_args(parser: argparse.ArgumentParser) -> None:
    """--target, --token, --token-file and --tls-ca: how a client reaches the control plane (ctl, tune)."""
    parser.add_argument("--target", default=f"127.0.0.1:{DEFAULT_PORT}", help="HOST:PORT (default: %(default)s)")
    token = parser.add_mutually_exclusive_group()
    token.add_argument(
        "--token",
        default=None,
        help=f"admin token for changes (default: ${TOKEN_ENV}); visible in `ps`: prefer --token-file or the variable",
    )
    token.add_argument("--token-file", default=None, metavar="FILE", help="read the admin token from FILE's first line")
    parser.add_argument("--tls-ca", default=None, metavar="FILE", help="PEM CA certificate: connect with TLS")


def admin_token(ns: argparse.Namespace) -> str | None:
    """The admin token from --token, --token-file (first line) or the environment; ValueError naming the flag
    for a file that cannot be read or holds no token."""
    from_file = read_token_file(getattr(ns, "token_file", None), "--token-file")
    return ns.token or from_file or os.environ.get(TOKEN_ENV) or None


def open_channel(target: str, tls_ca: str | None, *, watch: bool, aio: bool = False) -> grpc.Channel:
    """A channel to `target` (TLS with `tls_ca`); `watch` keeps stream buffers small; `aio` for asyncio."""
    options = list(FRESH_STREAM_OPTIONS) if watch else []
    module = grpc.aio if aio else grpc
    if tls_ca is None:
        return module.insecure_channel(target, options=options)
    with open(tls_ca, "rb") as handle:
        credentials = grpc.ssl_channel_credentials(root_certificates=handle.read())
    return module.secure_channel(target, credentials, options=options)


def format_config(config: pb.GateConfig) -> str:
    """`epoch 3  gate on  A=2 K=8  policy gate  by tuner: <reason>`."""
    gate = f"gate on  A={config.attempt_interval} K={config.any_interval}" if config.enabled else "gate off"
    return f"epoch {config.epoch}  {gate}  policy {config.policy}" + format_origin(config)


def format_origin(config: pb.GateConfig) -> str:
    """`  tuner: <why>` or `  by operator: <why>` (empty when the config does not say who made it)."""
    by, reason = config.changed_by, config.reason
    if not by:
        return ""
    if reason.startswith(f"{by}:"):
        return f"  {reason}"
    return f"  by {by}" + (f": {reason}" if reason else "")


def format_round(record: pb.RoundRecord, *, rows: bool = False) -> str:
    """One compact line: round, point and vote, counter, ranks extending/wanting/blocking, config, drops;
    with `rows`, one more indented line per rank row the record carries."""
    vote = f"{POINTS.get(record.point, '?')}{' open' if record.open else ''}"
    config = record.config
    gate = f"e{config.epoch}" + (f" A{config.attempt_interval} K{config.any_interval}" if config.enabled else " off")
    line = (
        f"round {record.round:>7}  {vote:<8}  ctr {record.counter:>3}->{record.counter_after:<3}  "
        f"ext {record.ranks_extending:>2} want {record.ranks_wanting:>2} block {record.ranks_blocking_all:>2}  "
        f"{'decode' if record.all_decode_or_idle else 'extend'}  {record.round_seconds * 1e3:7.2f} ms  {gate}"
    )
    if record.adopted_epoch:
        line += f"  adopted e{record.adopted_epoch}" + format_origin(record.adopted_config)
    if record.dropped_before:
        line += f"  (dropped {record.dropped_before})"
    if record.latest_round > record.round:  # a stream's record: how far behind it was when sent
        line += f"  ({record.latest_round - record.round} behind)"
    age = time.time() - record.unix_nanos / 1e9
    if record.unix_nanos and age > STALE_AFTER_S:
        line += f"  ({age:.1f} s old)"
    for row in record.ranks if rows else ():
        line += (
            f"\n    rank {row.rank:>2}: tok {row.num_tokens:>5} bs {row.batch_size:>3} ext {row.num_extends:>2} "
            f"want {int(row.want_prefill)} dec {int(row.has_decode_work)} occ {row.occupancy:.2f} "
            f"wait {row.waiting_prompts} res {row.resident_chunks} rd {row.storage_reads} retr {row.retracted}"
        )
    return line


def _config(channel: grpc.Channel, ns: argparse.Namespace, metadata: tuple, out: TextIO) -> None:
    config = admin_pb2_grpc.GateAdminStub(channel).GetConfig(admin_pb2.GetConfigRequest(), timeout=ns.timeout)
    print(format_config(config), file=out)


def _update(channel: grpc.Channel, ns: argparse.Namespace, metadata: tuple, out: TextIO) -> None:
    request = admin_pb2.UpdateIntervalsRequest(validate_only=ns.validate_only, reason=ns.reason)
    if ns.ctl_command == "disable":
        request.disable = True
    else:
        request.attempt_interval = ns.attempt
        request.any_interval = ns.any
    if ns.expected_epoch is not None:
        if ns.expected_epoch < 0:
            raise ValueError(f"--expected-epoch must be >= 0, got {ns.expected_epoch}")
        request.expected_epoch = ns.expected_epoch
    stub = admin_pb2_grpc.GateAdminStub(channel)
    response = stub.UpdateIntervals(request, metadata=metadata, timeout=ns.timeout)
    if response.validated_only:
        print(f"valid (nothing changed): {format_config(response.config)}", file=out)
    else:
        print(f"adopted by every rank after round {response.adopted_round}: {format_config(response.config)}", file=out)


def _watch(channel: grpc.Channel, ns: argparse.Namespace, metadata: tuple, out: TextIO) -> None:
    request = telemetry_pb2.WatchRoundsRequest(ranks=ns.rank)
    if ns.from_round is not None:
        request.from_round = ns.from_round
    if ns.latest_only:
        request.mode = telemetry_pb2.WATCH_MODE_LATEST_ONLY
    stream: Iterator[pb.RoundRecord] = telemetry_pb2_grpc.GateTelemetryStub(channel).WatchRounds(request)
    seen = 0
    try:
        for record in stream:
            print(format_round(record, rows=bool(ns.rank)), file=out, flush=True)
            seen += 1
            if ns.count and seen >= ns.count:
                return
    finally:
        stream.cancel()  # type: ignore[attr-defined]
    print("stream ended: the engine stopped", file=out)


def _submit(channel: grpc.Channel, ns: argparse.Namespace, metadata: tuple, out: TextIO) -> None:
    request = requests_pb2.SubmitRequest(
        request_id=ns.request_id, prompt_len=ns.prompt_len, output_len=ns.output_len, prefix_hit=ns.prefix_hit
    )
    if ns.prompt:
        try:
            request.prompt.extend(int(token) for token in ns.prompt.split(","))
        except ValueError:
            raise ValueError(f"--prompt must be comma-separated token ids, got {ns.prompt!r}") from None
    if ns.rank is not None:
        if ns.rank < 0:
            raise ValueError(f"--rank must be >= 0, got {ns.rank}")
        request.rank = ns.rank
    for event in requests_pb2_grpc.GateRequestsStub(channel).Submit(request, metadata=metadata):
        kind = event.WhichOneof("event")
        if kind == "accepted":
            print(f"accepted {event.accepted.request_id} on rank {event.accepted.rank}", file=out, flush=True)
        elif kind == "first_token":
            first = event.first_token
            print(f"first token after {first.ttft_seconds * 1e3:.1f} ms (round {first.round})", file=out, flush=True)
        elif kind == "tokens":
            print("tokens " + " ".join(str(t) for t in event.tokens.tokens), file=out, flush=True)
        elif kind == "finished":
            done = event.finished
            print(
                f"finished: {done.reason}, {done.output_len} tokens, TTFT {done.ttft_seconds * 1e3:.1f} ms, "
                f"end-to-end {done.e2e_seconds * 1e3:.1f} ms, gate wait {done.gate_wait_rounds} rounds "
                f"({done.gate_wait_seconds * 1e3:.1f} ms)",
                file=out,
                flush=True,
            )


def _snapshot(channel: grpc.Channel, ns: argparse.Namespace, metadata: tuple, out: TextIO) -> None:
    stub = telemetry_pb2_grpc.GateTelemetryStub(channel)
    snapshot = stub.GetSnapshot(telemetry_pb2.GetSnapshotRequest(), timeout=ns.timeout)
    if ns.json:
        print(json_format.MessageToJson(snapshot, preserving_proto_field_name=True), file=out)
        return
    s = snapshot.stats
    head = f"run {snapshot.run_id}  {snapshot.dp_size} ranks  executor {snapshot.executor}  [{snapshot.state}]"
    print(head, file=out)
    if snapshot.failure:
        print(f"failed: {snapshot.failure}", file=out)
    elif snapshot.state == "stalled":
        print(f"stalled: no round for {snapshot.last_round_age_seconds:.1f} s", file=out)
    print(f"config: {format_config(snapshot.config)}", file=out)
    print(
        f"rounds {s.rounds} ({s.rounds_per_second:,.0f}/s engine clock)  history {snapshot.history_first_round}"
        f"..{snapshot.history_last_round}  records dropped {s.records_dropped}",
        file=out,
    )
    print(
        f"requests {s.requests_finished}/{s.requests_submitted} finished, {s.requests_aborted} aborted, "
        f"{s.requests_refused} refused, {s.requests_cut_off} cut off  "
        f"output tokens/s {s.output_tokens_per_second:,.1f}",
        file=out,
    )
    print(
        f"TTFT p50 {s.ttft_p50_seconds * 1e3:.1f} ms p99 {s.ttft_p99_seconds * 1e3:.1f} ms  "
        f"ITL p50 {s.itl_p50_seconds * 1e3:.1f} ms p99 {s.itl_p99_seconds * 1e3:.1f} ms  "
        f"windows ANY {s.windows_any} ALL {s.windows_all}",
        file=out,
    )
    budget = f"{snapshot.watch_send_budget:,} messages/s" if snapshot.watch_send_budget else "none"
    print(
        f"watch streams: send budget {budget}, {snapshot.watch_messages:,} messages sent, "
        f"{snapshot.watch_records_dropped_by_budget:,} records dropped by the budget",
        file=out,
    )
    if s.HasField("tracing"):
        print(format_tracing(s.tracing), file=out)
    if snapshot.HasField("latest"):
        print(format_round(snapshot.latest, rows=True), file=out)


def format_tracing(t: Any) -> str:
    """One line on tracing: what was sampled, what was lost, how the exporter is (a TracingStatus)."""
    if not t.enabled:
        return "tracing: off"
    share = f"{t.rounds_traced / t.rounds_seen:.1%}" if t.rounds_seen else "-"
    line = (
        f"tracing: {t.endpoint}  rounds traced {t.rounds_traced}/{t.rounds_seen} ({share})  requests untraced "
        f"{t.requests_untraced}  spans dropped {t.spans_dropped}{'' if t.ranks_final else ' so far'} "
        f"(queue full {t.spans_refused}, failed {t.spans_failed}, unconfirmed {t.spans_unconfirmed} here)  "
        f"exporter {t.exporter_state}"
    )
    return line + (f": {t.exporter_detail}" if t.exporter_detail else "")


COMMANDS: dict[str, Callable[[grpc.Channel, argparse.Namespace, tuple, TextIO], None]] = {
    "config": _config,
    "set": _update,
    "disable": _update,
    "watch": _watch,
    "submit": _submit,
    "snapshot": _snapshot,
}
