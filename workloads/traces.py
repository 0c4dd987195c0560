"""Trace replay: public production request traces and the project's own JSONL, read and replayed.

Three formats, told apart by the file's first non-blank line (a CSV header or a JSON object's keys):

- ``azure-csv``: the Azure LLM inference trace 2023 (Azure/AzurePublicDataset,
  `data/AzureLLMInferenceTrace_conv.csv` and `_code.csv`; CC-BY 4.0; cite Patel et al., "Splitwise:
  Efficient generative LLM inference using phase splitting", ISCA 2024). Header
  ``TIMESTAMP,ContextTokens,GeneratedTokens``; TIMESTAMP is wall time (``2023-11-16 18:15:46.6805900``),
  replayed as seconds since the first request.
- ``mooncake-jsonl``: the Mooncake FAST'25 trace release (kvcache-ai/Mooncake,
  `FAST25-release/traces/conversation_trace.jsonl` and its siblings; Apache-2.0; cite Qin et al.,
  "Mooncake: Trading More Storage for Less Computation", FAST 2025). One object a line with
  ``timestamp`` (ms since the trace start), ``input_length``, ``output_length`` and ``hash_ids``: one id
  per 512-token prefix block, equal ids are the same prefix (modelled by `workloads.prefix_cache`).
  The conversation release's timestamps come in buckets of ~3 s (1,180 distinct values for 12,031
  requests, up to 28 in one): replayed as recorded, each bucket's requests would all land in one round
  at any replay speed, a burst no speed relieves and no real client sends. `spread_buckets` spreads
  each bucket's requests evenly over the bucket, in file order (`TraceData.bucket_s` says so); a trace
  whose timestamps are mostly distinct is replayed as recorded.
- ``jsonl``: this project's own ``{"t", "prompt_len", "output_len", ["rank"], ["prefix_hit"]}`` (seconds).
  Hand-written files need not be in time order: they are replayed sorted (equal times keep file order).

The two production formats must be in time order: a line earlier than the one before it is an error, as
is any malformed line, a bad header or an empty file. Every error is a `TraceError` whose text is one
line naming the file and, where there is one, the line (``path:line: what``). The traces themselves
stay outside the repository (``../shared/traces/`` next to it here).

`trace_workload` turns a trace into a `Workload`: a window of it (`start`, `duration`, in trace
seconds), replayed `speed` times faster, routed by name.
"""

from __future__ import annotations

import csv
import json
import math
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

from workloads.arrivals import Arrival, ArrivalStream
from workloads.core import Workload
from workloads.prefix_cache import DEFAULT_CACHE_BLOCKS, MOONCAKE_BLOCK_TOKENS
from workloads.routing import PrefixAffinity, RoundRobin, Router, ShortestQueue

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
SIMPLE_KEYS = ("t", "prompt_len", "output_len")
FORMATS = ("azure-csv", "mooncake-jsonl", "jsonl")

# Router names of `serve --router` and `trace_workload`; prefix-affinity is the default for traces.
ROUTERS: dict[str, Router] = {
    "round-robin": RoundRobin(),
    "shortest-queue": ShortestQueue(),
    "prefix-affinity": PrefixAffinity(),
}
DEFAULT_TRACE_ROUTER = "prefix-affinity"

_COUNT = re.compile(r"\d{1,12}")


class TraceError(ValueError):
    """A trace that cannot be replayed; the text is one line naming the file (and the line)."""


@dataclass(frozen=True)
class TraceData:
    """A loaded trace: its requests in time order (seconds), the format it was read as, and the prefix
    block size its arrivals' `blocks` are counted in (None: the format names no blocks)."""

    path: str
    format: str
    arrivals: tuple[Arrival, ...]
    block_tokens: int | None = None
    bucket_s: float | None = None  # the timestamps' bucket, spread over on loading (None: as recorded)

    def __len__(self) -> int:
        return len(self.arrivals)

    @property
    def span_s(self) -> float:
        """Seconds from the first arrival to the last."""
        return self.arrivals[-1].time - self.arrivals[0].time if self.arrivals else 0.0

    def describe(self) -> str:
        """One line: format, requests, span, rate and mean lengths."""
        count = len(self.arrivals)
        prompt = sum(a.prompt_len or 0 for a in self.arrivals) / max(count, 1)
        output = sum(a.output_len or 0 for a in self.arrivals) / max(count, 1)
        rate = f"{count / self.span_s:.2f} req/s" if self.span_s > 0 else "all at once"
        blocks = f", prefix blocks of {self.block_tokens} tokens" if self.block_tokens else ""
        spread = f", timestamps in {self.bucket_s:g} s buckets spread evenly" if self.bucket_s else ""
        return (
            f"{self.path} ({self.format}): {count:,} requests over {self.span_s:,.1f} s ({rate}), "
            f"mean prompt {prompt:,.0f} / output {output:,.0f} tokens{blocks}{spread}"
        )


def spread_buckets(arrivals: Sequence[Arrival]) -> tuple[tuple[Arrival, ...], float | None]:
    """Arrivals whose timestamps come in buckets (most requests share a timestamp with others, distinct
    timestamps at least 0.5 s apart) spread evenly over each bucket, in order: a bucket of n requests at
    t is replayed at t + i * w / n, w the gap to the next bucket (at most the median gap). Returns the
    arrivals and the bucket (the median gap), or the arrivals unchanged and None when not bucketed."""
    times = sorted({a.time for a in arrivals})
    if len(times) < 2 or len(times) > len(arrivals) / 2:
        return tuple(arrivals), None
    gaps = sorted(b - a for a, b in pairwise(times))
    bucket = gaps[len(gaps) // 2]
    if gaps[0] < 0.5 or bucket <= 0:
        return tuple(arrivals), None
    following = dict(zip(times, [*times[1:], times[-1] + bucket], strict=True))
    out: list[Arrival] = []
    at = 0
    while at < len(arrivals):
        t = arrivals[at].time
        end = at
        while end < len(arrivals) and arrivals[end].time == t:
            end += 1
        width = min(following[t] - t, bucket) / (end - at)
        out += [replace(a, time=t + i * width) for i, a in enumerate(arrivals[at:end])]
        at = end
    return tuple(out), bucket


# -- reading ---------------------------------------------------------------------------------------------


def load_trace_file(path: str | Path) -> TraceData:
    """Read a trace of any known format (detected from its first non-blank line); raises TraceError."""
    name = str(path)
    lines = _lines(path)
    first = next(lines, None)
    if first is None:
        raise TraceError(f"{name}: empty trace file (no lines)")
    number, text = first
    if text.startswith("{"):
        item = _json_object(text, f"{name}:{number}")
        if any(key in item for key in MOONCAKE_KEYS):
            return _read_mooncake(name, first, lines)
        if any(key in item for key in SIMPLE_KEYS):
            return TraceData(name, "jsonl", tuple(_read_simple(name, first, lines)))
        raise TraceError(
            f"{name}:{number}: a JSON line with keys {sorted(item)[:6]} is neither a Mooncake line "
            f"({', '.join(MOONCAKE_KEYS)}) nor a prefill-gate line ({', '.join(SIMPLE_KEYS)})"
        )
    header = tuple(field.strip() for field in _csv_fields(text, f"{name}:{number}"))
    if header != AZURE_HEADER:
        raise TraceError(
            f"{name}:{number}: unknown trace format: expected the Azure CSV header {','.join(AZURE_HEADER)} "
            f"or a JSON object, got {_short(text)}"
        )
    return _read_azure(name, lines)


def load_trace(path: str | Path) -> list[Arrival]:
    """The arrivals of a trace file of any known format (see `load_trace_file`)."""
    return list(load_trace_file(path).arrivals)


def _lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every non-blank line, decoded as UTF-8; a byte-order mark is dropped."""
    name = str(path)
    try:
        with Path(path).open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise TraceError(f"{name}:{number}: not UTF-8 text") from None
                if number == 1:
                    text = text.removeprefix("\ufeff")
                text = text.strip()
                if text:
                    yield number, text
    except OSError as exc:
        raise TraceError(f"{name}: cannot read the trace: {exc.strerror or exc}") from None


def _short(text: str, limit: int = 60) -> str:
    """A quoted, escaped excerpt of user text that keeps an error on one line."""
    quoted = repr(text)
    return quoted if len(quoted) <= limit else quoted[: limit - 4] + "...'"


def _json_object(text: str, where: str) -> dict[str, object]:
    try:
        item = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:
        raise TraceError(f"{where}: not valid JSON ({type(exc).__name__})") from None
    if not isinstance(item, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(item).__name__}")
    return item


def _integer(item: dict[str, object], key: str, where: str, minimum: int, required: bool = True) -> int | None:
    if key not in item and not required:
        return None
    if key not in item:
        raise TraceError(f"{where}: missing key {key!r}")
    value = item[key]
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceError(f"{where}: {key!r} must be an integer >= {minimum}, got {_short(repr(value), 40)}")
    return value


def _time(item: dict[str, object], key: str, where: str) -> float:
    if key not in item:
        raise TraceError(f"{where}: missing key {key!r}")
    value = item[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}: {key!r} must be a finite number >= 0, got {_short(repr(value), 40)}")
    return float(value)


def _in_order(time: float, previous: float, where: str, unit: str) -> None:
    if time < previous:
        raise TraceError(
            f"{where}: timestamp {time:g} {unit} is before the previous line's {previous:g} {unit} "
            "(a production trace must be in time order)"
        )


def _read_mooncake(name: str, first: tuple[int, str], rest: Iterator[tuple[int, str]]) -> TraceData:
    arrivals: list[Arrival] = []
    previous = 0.0
    for number, text in _chain(first, rest):
        where = f"{name}:{number}"
        item = _json_object(text, where)
        for key in MOONCAKE_KEYS:
            if key not in item:
                raise TraceError(f"{where}: missing key {key!r} (a Mooncake line has {', '.join(MOONCAKE_KEYS)})")
        stamp = _time(item, "timestamp", where)
        _in_order(stamp, previous, where, "ms")
        previous = stamp
        prompt = _integer(item, "input_length", where, 1)
        output = _integer(item, "output_length", where, 1)
        assert prompt is not None and output is not None
        ids = item["hash_ids"]
        if not isinstance(ids, list) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            raise TraceError(f"{where}: 'hash_ids' must be a list of integers >= 0")
        most = -(-prompt // MOONCAKE_BLOCK_TOKENS)
        if len(ids) > most:
            raise TraceError(
                f"{where}: 'hash_ids' names {len(ids)} blocks of {MOONCAKE_BLOCK_TOKENS} tokens, more than the "
                f"{most} an input of {prompt} tokens has"
            )
        arrivals.append(Arrival(stamp / 1000.0, prompt, output, blocks=tuple(ids)))
    spread, bucket = spread_buckets(arrivals)
    return TraceData(name, "mooncake-jsonl", spread, MOONCAKE_BLOCK_TOKENS, bucket)


def _read_simple(name: str, first: tuple[int, str], rest: Iterator[tuple[int, str]]) -> list[Arrival]:
    arrivals: list[Arrival] = []
    for number, text in _chain(first, rest):
        where = f"{name}:{number}"
        item = _json_object(text, where)
        t = _time(item, "t", where)
        prompt_len = _integer(item, "prompt_len", where, 1)
        output_len = _integer(item, "output_len", where, 1)
        rank = _integer(item, "rank", where, 0, required=False)
        hit = _integer(item, "prefix_hit", where, 0, required=False)
        if hit is not None and prompt_len is not None and hit >= prompt_len:
            raise TraceError(f"{where}: 'prefix_hit' ({hit}) must be < 'prompt_len' ({prompt_len})")
        arrivals.append(Arrival(t, prompt_len, output_len, rank, hit))
    arrivals.sort(key=lambda a: a.time)  # stable: equal times keep file order
    return arrivals


def _csv_fields(text: str, where: str) -> list[str]:
    try:
        return next(csv.reader([text]))
    except (csv.Error, StopIteration):
        raise TraceError(f"{where}: not a CSV line: {_short(text)}") from None


def _read_azure(name: str, rest: Iterator[tuple[int, str]]) -> TraceData:
    arrivals: list[Arrival] = []
    origin: datetime | None = None
    previous = 0.0
    for number, text in rest:
        where = f"{name}:{number}"
        fields = [field.strip() for field in _csv_fields(text, where)]
        if len(fields) != len(AZURE_HEADER):
            expected = f"{len(AZURE_HEADER)} fields ({','.join(AZURE_HEADER)})"
            raise TraceError(f"{where}: expected {expected}, got {len(fields)}")
        stamp = _azure_time(fields[0], where)
        if origin is None:
            origin = stamp
        seconds = (stamp - origin).total_seconds()
        _in_order(seconds, previous, where, "s after the first request")
        previous = seconds
        prompt = _azure_count(fields[1], "ContextTokens", where)
        output = _azure_count(fields[2], "GeneratedTokens", where)
        arrivals.append(Arrival(seconds, prompt, output))
    if not arrivals:
        raise TraceError(f"{name}: empty trace: no requests after the header")
    return TraceData(name, "azure-csv", tuple(arrivals))


def _azure_time(text: str, where: str) -> datetime:
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise TraceError(f"{where}: bad TIMESTAMP {_short(text)} (expected e.g. 2023-11-16 18:15:46.6805900)") from None
    # Aware and naive stamps must not mix: compare everything as naive UTC.
    return stamp.astimezone(UTC).replace(tzinfo=None) if stamp.tzinfo is not None else stamp


def _azure_count(text: str, column: str, where: str) -> int:
    if not _COUNT.fullmatch(text) or int(text) < 1:
        raise TraceError(f"{where}: {column} must be an integer >= 1, got {_short(text, 40)}")
    return int(text)


def _chain(first: tuple[int, str], rest: Iterator[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    yield first
    yield from rest


# -- replay ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    """Replay of a trace file (any format `load_trace_file` reads) or of arrivals already loaded.

    A path is read and checked when the workload starts (a malformed file raises TraceError naming the
    file and line). Arrivals are replayed in time order (equal times keep their order).
    """

    source: str | Path | Sequence[Arrival]

    def start(self, rng: random.Random) -> ArrivalStream:
        if isinstance(self.source, str | Path):
            return _TraceStream(load_trace(self.source))
        return _TraceStream(sorted(self.source, key=lambda a: a.time))


class _TraceStream(ArrivalStream):
    finite = True

    def __init__(self, arrivals: list[Arrival]) -> None:
        self._arrivals = arrivals
        self._index = 0

    def peek(self) -> float:
        return self._arrivals[self._index].time if self._index < len(self._arrivals) else math.inf

    def pop(self) -> Arrival:
        arrival = self._arrivals[self._index]
        self._index += 1
        return arrival


def router_named(name: str) -> Router:
    """The router called `name` (round-robin, shortest-queue, prefix-affinity); ValueError lists them."""
    try:
        return ROUTERS[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; known routers: {', '.join(ROUTERS)}") from None


def trace_window(
    data: TraceData, *, speed: float = 1.0, start: float = 0.0, duration: float | None = None
) -> list[Arrival]:
    """The arrivals with ``start <= t < start + duration`` (trace seconds), re-timed as
    ``(t - start) / speed`` so the window begins at 0 and runs `speed` times faster."""
    if not (math.isfinite(speed) and speed > 0):
        raise ValueError(f"trace speed must be a finite number > 0, got {speed}")
    if not (math.isfinite(start) and start >= 0):
        raise ValueError(f"trace start must be a finite number >= 0 seconds, got {start}")
    if duration is not None and not duration > 0:
        raise ValueError(f"trace duration must be > 0 seconds, got {duration}")
    end = math.inf if duration is None else start + duration
    picked = [
        Arrival((a.time - start) / speed, a.prompt_len, a.output_len, a.rank, a.prefix_hit, a.session, a.blocks)
        for a in data.arrivals
        if start <= a.time < end
    ]
    if not picked:
        first = data.arrivals[0].time if data.arrivals else 0.0
        last = data.arrivals[-1].time if data.arrivals else 0.0
        raise TraceError(
            f"{data.path}: no requests in the window [{start:g}, {end:g}) s; the trace's requests arrive "
            f"from {first:g} to {last:g} s"
        )
    return picked


def trace_workload(
    path_or_data: str | Path | TraceData,
    *,
    speed: float = 1.0,
    start: float = 0.0,
    duration: float | None = None,
    router: str | Router = DEFAULT_TRACE_ROUTER,
    dp_size: int,
    seed: int = 0,
    cache_blocks: int = DEFAULT_CACHE_BLOCKS,
    limit: int | None = None,
    token_ids: bool = False,
    vocab: int = 512,
) -> Workload:
    """A workload replaying a trace window (see `trace_window`) over `dp_size` ranks.

    `router` is a name of `ROUTERS` or a router spec. A trace with prefix blocks (Mooncake) gets
    per-rank block caches of `cache_blocks` blocks each (0: off, no hits; see `workloads.prefix_cache`).
    `limit`, `token_ids` and `vocab` are as for `Workload`.
    """
    data = path_or_data if isinstance(path_or_data, TraceData) else load_trace_file(path_or_data)
    arrivals = trace_window(data, speed=speed, start=start, duration=duration)
    spec = router_named(router) if isinstance(router, str) else router
    return Workload(
        Trace(arrivals),
        dp_size=dp_size,
        router=spec,
        seed=seed,
        limit=limit,
        token_ids=token_ids,
        vocab=vocab,
        cache_blocks=cache_blocks if data.block_tokens else 0,
        block_tokens=data.block_tokens or MOONCAKE_BLOCK_TOKENS,
    )
