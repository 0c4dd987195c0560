"""Span export that never slows a round: endpoint parsing, a bounded queue, a background exporter, exact counts.

Spans are handed to a `SpanShipper` (one per process and collector, shared by every traced rank of a
lockstep group and by the controller) and sent over OTLP/gRPC by its own thread, which encodes them
itself (`otlp_wire`, several times faster than the SDK's encoder). Why not the SDK's
`BatchSpanProcessor` and `OTLPSpanExporter`: the queue drops the oldest span silently when full, and the
exporter retries on its own and reports a timed-out export as failed although the collector may still
take it (a 10 s SIGSTOP of the collector over-counted the loss twice over). Here every span is counted
against the `DropCounter` of whoever offered it, in exactly one outcome (see `DropCounter`): a full
queue refuses a whole offer (one rank's round tree is exported whole or not at all); an export counts
as failed only when the collector answered an error or could not be reached; one left unanswered past
the (long) deadline counts as unconfirmed, never as lost.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import grpc

from control.telemetry.otlp_wire import Producer, SpanData, encode_request, encode_span

DEFAULT_PORT = 4317  # OTLP/gRPC; Jaeger listens there since 1.35
DEFAULT_QUEUE_SPANS = 32768
DEFAULT_EXPORT_TIMEOUT_S = 30.0  # long: only a collector silent this long makes spans "unconfirmed"
MAX_REQUEST_BYTES = 3 << 20  # under gRPC servers' default 4 MiB receive limit
LOSS_LOG_INTERVAL_S = 30.0  # at most one "spans not delivered" line per interval
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$")
_log = logging.getLogger("prefill_gate.tracing")


@dataclass(frozen=True, slots=True)
class OtlpEndpoint:
    """Where OTLP/gRPC goes: `target` is host:port as gRPC dials it; plaintext unless the URL was https."""

    target: str
    insecure: bool

    @property
    def url(self) -> str:
        """The endpoint as a URL (what the flag would take back)."""
        return f"{'http' if self.insecure else 'https'}://{self.target}"


def parse_otlp_endpoint(value: str, source: str = "--otlp-endpoint") -> OtlpEndpoint:
    """`host:port`, `http://host:port` or `https://host:port` (port defaults to 4317).

    Raises ValueError naming `source` (the flag or environment variable) and what is wrong.
    """

    def refuse(why: str) -> ValueError:
        return ValueError(
            f"{source} {value!r} is not an OTLP/gRPC endpoint ({why}); "
            f"expected host:port or http(s)://host:port, e.g. http://localhost:{DEFAULT_PORT}"
        )

    text = value.strip()
    if not text:
        raise refuse("it is empty")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise refuse(f"scheme {parts.scheme!r} is neither http nor https")
    if parts.username is not None or parts.password is not None:
        raise refuse("credentials do not belong in the endpoint")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise refuse("OTLP/gRPC takes no path, query or fragment")
    try:
        port = parts.port
    except ValueError:
        raise refuse("the port is not a number in 1-65535") from None
    host = parts.hostname
    if not host:
        raise refuse("the host is missing")
    if ":" in host:  # an IPv6 literal, which urlsplit already required to be bracketed
        target_host = f"[{host}]"
    elif _HOST.match(host):
        target_host = host
    else:
        raise refuse(f"{host!r} is not a host name or address")
    if port == 0:
        raise refuse("port 0 cannot be dialled")
    return OtlpEndpoint(f"{target_host}:{port or DEFAULT_PORT}", insecure=parts.scheme == "http")


class DropCounter:
    """What happened to one producer's spans. `offered` and `refused` are written under the shipper's
    lock, the others by the shipper's thread alone; readers take each value in one read.

    Every offered span ends in exactly one of: exported (the collector acknowledged it), refused (never
    sent: the queue was full or the shipper closed), failed (the collector answered an error, rejected
    it, or could not be reached: not delivered), unconfirmed (no answer within the export deadline, or
    still in flight when the process ended: the collector may have it). Until then it is in flight.
    """

    __slots__ = ("exported", "failed", "offered", "refused", "unconfirmed")  # a rank reads it every round

    def __init__(self) -> None:
        self.offered = 0
        self.exported = 0
        self.refused = 0
        self.failed = 0
        self.unconfirmed = 0

    @property
    def total(self) -> int:
        """Spans not confirmed delivered (refused, failed or unconfirmed): what `spans_dropped` publishes."""
        return self.refused + self.failed + self.unconfirmed

    def add(self, other: DropCounter) -> None:
        """Accumulate `other` into this one (a view over several producers)."""
        self.offered += other.offered
        self.exported += other.exported
        self.refused += other.refused
        self.failed += other.failed
        self.unconfirmed += other.unconfirmed


@dataclass(frozen=True, slots=True)
class ShipperConfig:
    """Queue, batch and deadline of a shipper.

    The queue holds about a second of a fully traced 8-rank simulator (~1 KB of memory a span) and
    many seconds of a default-sampled one, so a collector hiccup loses nothing. The export deadline is
    long on purpose: a span counts as lost only when the collector says so; an export that outlives the
    deadline is counted as unconfirmed (the collector may yet take it), which a collector that merely
    stalls for less than the deadline never causes. Meanwhile new spans wait in the queue, and beyond
    it are refused and counted: the producer never waits.
    """

    max_queue_spans: int = DEFAULT_QUEUE_SPANS
    batch_spans: int = 2048
    # The oldest span waits at most this long for a fuller batch: the OpenTelemetry SDK's own default
    # (OTEL_BSP_SCHEDULE_DELAY, 5 s). Each export costs the exporter's process milliseconds of CPU
    # whatever its size, and that process is a rank's (measured at the default sampling of the 8-rank
    # simulator: 1 s instead of 0.2 s halved the exporter's CPU per span; 5 s instead of 1 s took it from
    # 3.9 to 3.0 us per round in a paired probe).
    schedule_delay_s: float = 5.0
    export_timeout_s: float = DEFAULT_EXPORT_TIMEOUT_S
    retry_s: float = 5.0  # how long an UNAVAILABLE / RESOURCE_EXHAUSTED batch is retried before it fails
    stalled_after_s: float = 2.0  # an export unanswered this long shows the exporter as stalled


@dataclass(frozen=True, slots=True)
class ExporterHealth:
    """One shipper's state and totals, for the summary, `ctl snapshot` and the metrics."""

    endpoint: str
    state: str  # "ok", "idle" (nothing sent yet), "failing", "stalled" (an export waits), "closed"
    detail: str  # the latest error, or how long the current export has waited
    queued: int
    totals: DropCounter


class _Offer:
    """Spans offered together: one rank's round tree, a root, a request; exported or lost as one."""

    __slots__ = ("counter", "producer", "spans")

    def __init__(self, spans: Sequence[SpanData], producer: Producer, counter: DropCounter) -> None:
        self.spans = spans
        self.producer = producer
        self.counter = counter


class SpanShipper:
    """A bounded span queue drained by one daemon thread, which encodes and sends OTLP/gRPC itself."""

    def __init__(self, sender: OtlpSender, config: ShipperConfig = ShipperConfig(), label: str = "") -> None:
        self.config = config
        self.label = label
        self.totals = DropCounter()  # every producer's spans together (same writers as a DropCounter)
        self._sender = sender
        self._queue: deque[_Offer] = deque()
        self._queued = 0
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the thread sleeps on it: offers, flushes, close wake it
        self._idle = threading.Condition(self._lock)  # flushers sleep on it: the thread says when it drained
        self._oldest_at = 0.0  # when the oldest queued span was offered (it waits at most schedule_delay_s)
        self._flushing = 0  # flushes waiting: ship what is queued now, without waiting for a fuller batch
        self._busy = False
        self._closed = False
        self._inflight: Any = None  # the future of the export in flight
        self._inflight_since = 0.0
        self._last_ok = 0.0
        self._last_error = ""
        self._failing = False
        self._logged_lost = 0
        self._last_log = -math.inf
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prefill-gate-spans", daemon=True)
        self._thread.start()

    @property
    def exported(self) -> int:
        """Spans the collector acknowledged."""
        return self.totals.exported

    def offer(self, spans: Sequence[SpanData], producer: Producer, counter: DropCounter) -> bool:
        """Queue `spans` whole, or count them all as refused; never blocks on the collector."""
        count = len(spans)
        with self._lock:
            counter.offered += count
            self.totals.offered += count
            if self._closed or self._queued + count > self.config.max_queue_spans:
                counter.refused += count
                self.totals.refused += count
                return False
            if not self._queue:  # the thread sleeps until there is something to send: wake it
                self._oldest_at = time.monotonic()
                self._work.notify()
            self._queue.append(_Offer(spans, producer, counter))
            self._queued += count
            if self._queued >= self.config.batch_spans:
                self._work.notify()
        return True

    def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` until everything queued was sent and answered; True when drained."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._flushing += 1
            self._work.notify()
            try:
                while self._queue or self._busy:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._thread.is_alive():
                        return False
                    self._idle.wait(left)  # the thread notifies when it drained, and as it exits
            finally:
                self._flushing -= 1
        return True

    def close(self, timeout_s: float = 1.0) -> None:
        """Flush for at most `timeout_s`, then stop. Spans still queued count as refused (never sent), the
        export still in flight is cancelled and counts as unconfirmed. Idempotent."""
        if self._closed:
            return
        atexit.unregister(self.close)
        self.flush(timeout_s)
        with self._lock:
            self._closed = True
            for offer in self._queue:  # never sent
                offer.counter.refused += len(offer.spans)
                self.totals.refused += len(offer.spans)
            self._queue.clear()
            self._queued = 0
            inflight = self._inflight
            self._work.notify()
        self._stopping.set()
        if inflight is not None:
            inflight.cancel()
        self._thread.join(max(timeout_s, 1.0))
        self._report_losses(final=True)
        self._sender.close()

    @property
    def closed(self) -> bool:
        """Whether `close` ran (offers are then refused)."""
        return self._closed

    def health(self) -> ExporterHealth:
        """The shipper's state now (read without the lock: each value is one atomic read)."""
        now = time.monotonic()
        since = self._inflight_since
        if self._closed:
            state, detail = "closed", self._last_error
        elif since and now - since > self.config.stalled_after_s:
            state, detail = "stalled", f"no answer for {now - since:.1f} s"
        elif self._failing:
            state, detail = "failing", self._last_error
        elif self._last_ok:
            state, detail = "ok", ""
        else:
            state, detail = "idle", ""
        return ExporterHealth(self.label, state, detail, self._queued, self.totals)

    # -- the shipper's thread ----------------------------------------------------------------------

    def _next_batch(self) -> list[_Offer] | None:
        """The thread's wait, under the lock: the next batch to send, [] when the loss log line is due,
        None once closed. It never polls: with nothing queued it sleeps until an offer, a flush or close
        wakes it (or, with losses not yet logged, until the log line may be written); with a partial
        batch, until the batch fills or its oldest span has waited `schedule_delay_s`."""
        config = self.config
        while True:
            if self._closed:
                return None
            if not self._queue:
                if self._busy:
                    self._busy = False
                    self._idle.notify_all()
                due = self._loss_log_due()
                if due is not None and due <= 0:
                    return []
                self._work.wait(due)
                continue
            if not self._flushing and self._queued < config.batch_spans:
                left = self._oldest_at + config.schedule_delay_s - time.monotonic()
                if left > 0:
                    self._work.wait(left)
                    continue
            batch: list[_Offer] = []
            count = 0
            while self._queue and count < config.batch_spans:
                offer = self._queue.popleft()
                batch.append(offer)
                count += len(offer.spans)
            self._queued -= count
            self._oldest_at = time.monotonic()  # what is left waits from now
            self._busy = True
            return batch

    def _loss_log_due(self) -> float | None:
        """Seconds until the rate-limited loss line may be written; None when there is nothing to log."""
        if self.totals.total == self._logged_lost:
            return None
        return self._last_log + LOSS_LOG_INTERVAL_S - time.monotonic()

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    batch = self._next_batch()
                if batch is None:
                    return
                if batch:
                    self._ship(batch)
                self._report_losses(final=False)
        finally:
            with self._lock:
                self._busy = False
                self._idle.notify_all()

    def _ship(self, batch: list[_Offer]) -> None:
        """Encode the batch and send it in requests under the collector's message size limit."""
        chunk: list[tuple[_Offer, list[bytes]]] = []
        size = 0
        for offer in batch:
            try:
                encoded = [encode_span(span) for span in offer.spans]
            except (TypeError, ValueError, OverflowError) as exc:  # a producer bug: lose its offer, counted
                self._lost(offer, "failed", f"unencodable span: {exc}")
                continue
            length = sum(map(len, encoded))
            if chunk and size + length > MAX_REQUEST_BYTES:
                self._send(chunk)
                chunk, size = [], 0
            chunk.append((offer, encoded))
            size += length
        if chunk:
            self._send(chunk)

    def _send(self, chunk: list[tuple[_Offer, list[bytes]]]) -> None:
        groups: dict[Producer, list[bytes]] = {}
        for offer, encoded in chunk:
            groups.setdefault(offer.producer, []).extend(encoded)
        payload = encode_request(groups.items())
        retry_until = time.monotonic() + self.config.retry_s
        backoff = 0.1
        while True:
            outcome, rejected, error = self._export(payload)
            if outcome != "retry" or self._closed or time.monotonic() + backoff > retry_until:
                break
            self._stopping.wait(backoff)  # a close cuts the wait short
            backoff = min(backoff * 2, 1.0)
        if outcome == "retry":
            outcome = "failed"
        for offer, _ in chunk:
            count = len(offer.spans)
            lost = min(rejected, count) if outcome == "ok" else count
            rejected -= min(rejected, count)
            if lost:
                self._lost(offer, "failed" if outcome == "ok" else outcome, error, lost)
            if count - lost:
                offer.counter.exported += count - lost
                self.totals.exported += count - lost

    def _export(self, payload: bytes) -> tuple[str, int, str]:
        """One Export call: ("ok", rejected spans, message), ("retry" | "failed" | "unconfirmed", 0, error)."""
        future = self._sender.start(payload, self.config.export_timeout_s)
        with self._lock:
            self._inflight, self._inflight_since = future, time.monotonic()
            if self._closed:
                future.cancel()
        try:
            response = future.result()
        except grpc.FutureCancelledError:
            return "unconfirmed", 0, "cancelled at close"
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            self._failing, self._last_error = True, f"{getattr(code, 'name', code)}: {exc.details()}"
            if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
                return "unconfirmed", 0, self._last_error
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
                return "retry", 0, self._last_error
            return "failed", 0, self._last_error
        finally:
            with self._lock:
                self._inflight, self._inflight_since = None, 0.0
        self._last_ok, self._failing = time.monotonic(), False
        partial = response.partial_success
        if partial.rejected_spans:
            self._last_error = f"collector rejected {partial.rejected_spans} spans: {partial.error_message}"
        return "ok", max(0, partial.rejected_spans), self._last_error

    def _lost(self, offer: _Offer, how: str, why: str, count: int | None = None) -> None:
        count = len(offer.spans) if count is None else count
        setattr(offer.counter, how, getattr(offer.counter, how) + count)
        setattr(self.totals, how, getattr(self.totals, how) + count)
        self._last_error = why or self._last_error

    def _report_losses(self, final: bool) -> None:
        """The rate-limited log line: spans not delivered since the previous line, at most one per interval."""
        totals = self.totals
        lost = totals.total
        now = time.monotonic()
        if lost == self._logged_lost or (not final and now - self._last_log < LOSS_LOG_INTERVAL_S):
            return
        _log.warning(  # the process id: lines of a rank process, a simulator's and the controller's share stderr
            "trace spans to %s from process %d: %d not delivered since the last report (%d of %d offered in all: "
            "queue full %d, failed %d, unconfirmed %d)%s",
            self.label,
            os.getpid(),
            lost - self._logged_lost,
            lost,
            totals.offered,
            totals.refused,
            totals.failed,
            totals.unconfirmed,
            f"; last error: {self._last_error}" if self._last_error else "",
        )
        self._logged_lost, self._last_log = lost, now


class OtlpSender:
    """OTLP/gRPC `TraceService.Export` of pre-encoded requests on one channel (no retries of its own)."""

    METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

    def __init__(self, endpoint: OtlpEndpoint) -> None:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        if endpoint.insecure:
            self._channel = grpc.insecure_channel(endpoint.target)
        else:
            self._channel = grpc.secure_channel(endpoint.target, grpc.ssl_channel_credentials())
        self._call = self._channel.unary_unary(
            self.METHOD,
            request_serializer=None,  # the payload is already the serialized request
            response_deserializer=trace_service_pb2.ExportTraceServiceResponse.FromString,
        )

    def start(self, payload: bytes, timeout_s: float) -> Any:
        """The call's future (cancellable)."""
        return self._call.future(payload, timeout=timeout_s)

    def close(self) -> None:
        self._channel.close()


def build_shipper(endpoint: OtlpEndpoint, config: ShipperConfig = ShipperConfig()) -> SpanShipper:
    """A shipper sending OTLP/gRPC to `endpoint`."""
    return SpanShipper(OtlpSender(endpoint), config, label=endpoint.url)


_shared: dict[tuple[OtlpEndpoint, ShipperConfig], SpanShipper] = {}
_shared_lock = threading.Lock()


def shared_shipper(endpoint: OtlpEndpoint, config: ShipperConfig = ShipperConfig()) -> SpanShipper:
    """This process's shipper to `endpoint` (one gRPC channel and one thread however many producers).

    Flushed for a second at interpreter exit, so the last rounds of a rank process get out.
    """
    key = (endpoint, config)
    with _shared_lock:
        shipper = _shared.get(key)
        if shipper is None or shipper.closed:
            shipper = build_shipper(endpoint, config)
            _shared[key] = shipper
            atexit.register(shipper.close, 1.0)
        return shipper


def close_shared(endpoint: OtlpEndpoint, timeout_s: float = 2.0) -> None:
    """Flush and close every shared shipper to `endpoint` (the controller does this when it stops)."""
    with _shared_lock:
        shippers = [s for (e, _), s in _shared.items() if e == endpoint]
        for key in [k for k in _shared if k[0] == endpoint]:
            del _shared[key]
    for shipper in shippers:
        shipper.close(timeout_s)
