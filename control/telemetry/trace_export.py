"""Span export that never slows a round: endpoint parsing, a bounded queue, a background exporter, drop counts.

Spans are handed to a `SpanShipper` (one per process and collector, shared by every traced rank of a
lockstep group and by the controller) and sent over OTLP/gRPC by its own thread. Why not the SDK's
`BatchSpanProcessor`: its queue drops the oldest span silently when full (no count to publish), and its
`force_flush` ignores its timeout, so a stuck collector could hold a rank's last round. Here every span
that does not reach the collector is counted, against the `DropCounter` of whoever offered it: a full
queue refuses a whole offer (one rank's round tree is exported whole or not at all), and a failed
export counts its batch.
"""

from __future__ import annotations

import atexit
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

DEFAULT_PORT = 4317  # OTLP/gRPC; Jaeger listens there since 1.35
DEFAULT_QUEUE_SPANS = 16384
DEFAULT_EXPORT_TIMEOUT_S = 1.0  # short: the exporter gives up instead of retrying for its default 10 s
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
    """Spans one producer lost. Each field has a single writer (no lock): `refused` the producer's thread,
    `failed` the shipper's thread."""

    def __init__(self) -> None:
        self.refused = 0  # the queue was full when offered
        self.failed = 0  # the export that carried them failed or timed out

    @property
    def total(self) -> int:
        """All spans this producer lost so far."""
        return self.refused + self.failed


@dataclass(frozen=True, slots=True)
class ShipperConfig:
    """Queue and batch sizes of a shipper, sized for the round rate.

    A traced rank exports 4 spans per sampled round. At the default 1% plus the always-sampled rounds
    (open votes: a few percent of busy rounds) and ~1-5k rounds/s, that is a few hundred spans/s per
    rank; the queue holds several seconds of a fully sampled rank, so a collector hiccup loses nothing,
    while a dead one costs at most the queue's memory.
    """

    max_queue_spans: int = DEFAULT_QUEUE_SPANS
    batch_spans: int = 1024
    schedule_delay_s: float = 0.2
    export_timeout_s: float = DEFAULT_EXPORT_TIMEOUT_S


class SpanShipper:
    """A bounded span queue drained by one daemon thread through an OTLP exporter."""

    def __init__(self, exporter: SpanExporter, config: ShipperConfig = ShipperConfig(), label: str = "") -> None:
        self.config = config
        self.label = label
        self.exported = 0
        self._exporter = exporter
        self._queue: deque[tuple[ReadableSpan, DropCounter]] = deque()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._busy = False
        self._closed = False
        self._failures = 0
        self._last_warning = 0.0
        self._thread = threading.Thread(target=self._run, name="prefill-gate-spans", daemon=True)
        self._thread.start()

    def offer(self, spans: Sequence[ReadableSpan], counter: DropCounter) -> bool:
        """Queue `spans` whole, or count them all as refused; never blocks on the collector."""
        with self._lock:
            if self._closed or len(self._queue) + len(spans) > self.config.max_queue_spans:
                counter.refused += len(spans)
                return False
            self._queue.extend((span, counter) for span in spans)
            full = len(self._queue) >= self.config.batch_spans
        if full:
            self._wake.set()
        return True

    def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` until everything queued was exported (or failed); True when drained."""
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        with self._idle:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._wake.set()
                self._idle.wait(min(left, 0.05))
        return True

    def close(self, timeout_s: float = 1.0) -> None:
        """Flush for at most `timeout_s`, then stop; whatever is left is counted as failed. Idempotent."""
        if self._closed:
            return
        atexit.unregister(self.close)
        self.flush(timeout_s)
        with self._lock:
            self._closed = True
            left = list(self._queue)
            self._queue.clear()
        self._wake.set()
        self._thread.join(timeout_s)
        for _, counter in left:  # after the join: the thread no longer writes these counters
            counter.failed += 1
        self._exporter.shutdown()

    @property
    def closed(self) -> bool:
        """Whether `close` ran (offers are then refused)."""
        return self._closed

    def _take(self) -> list[tuple[ReadableSpan, DropCounter]]:
        with self._lock:
            count = min(len(self._queue), self.config.batch_spans)
            batch = [self._queue.popleft() for _ in range(count)]
            self._busy = bool(batch)
            if not batch:
                self._idle.notify_all()
            return batch

    def _run(self) -> None:
        while True:
            self._wake.wait(self.config.schedule_delay_s)
            self._wake.clear()
            while batch := self._take():
                self._export(batch)
            if self._closed:
                return

    def _export(self, batch: list[tuple[ReadableSpan, DropCounter]]) -> None:
        try:
            ok = self._exporter.export([span for span, _ in batch]) is SpanExportResult.SUCCESS
        except Exception:  # an exporter bug must not kill the thread that every rank's spans depend on
            ok = False
        if ok:
            self.exported += len(batch)
            return
        for _, counter in batch:
            counter.failed += 1
        self._failures += 1
        now = time.monotonic()
        if now - self._last_warning > 30.0:  # one line per 30 s, not one per batch
            self._last_warning = now
            _log.warning(
                "span export to %s failing (%d batches so far); dropped spans are counted", self.label, self._failures
            )


def build_shipper(endpoint: OtlpEndpoint, config: ShipperConfig = ShipperConfig()) -> SpanShipper:
    """A shipper with an OTLP/gRPC exporter to `endpoint`."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    _quiet_exporter_log()
    exporter = OTLPSpanExporter(endpoint=endpoint.target, insecure=endpoint.insecure, timeout=config.export_timeout_s)
    return SpanShipper(exporter, config, label=endpoint.url)


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


class _OncePer(logging.Filter):
    """Lets one record per logger through every `seconds` (the exporter logs each failed batch)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self._last = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self._last < self.seconds:
            return False
        self._last = now
        return True


def _quiet_exporter_log() -> None:
    exporter_log = logging.getLogger("opentelemetry.exporter.otlp.proto.grpc.exporter")
    if not any(isinstance(f, _OncePer) for f in exporter_log.filters):
        exporter_log.addFilter(_OncePer(30.0))
