"""Trace loaders (Azure 2023 CSV, Mooncake FAST'25 JSONL), the per-rank prefix block caches and the
prefix-affinity router (issue 11, item 1).

The shared traces are read from ``../shared/traces`` next to the repository root (or from
``$PREFILL_GATE_SHARED/traces``); the tests that need them skip, saying where they looked, when absent.
"""

from __future__ import annotations

import heapq
import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import ServerArgs
from lab.simrun import run_sim
from workloads import PrefixAffinity, RoundRobin, Trace, TraceError, Workload, load_trace_file, trace_workload
from workloads.arrivals import Arrival
from workloads.prefix_cache import MOONCAKE_BLOCK_TOKENS, BlockCache, PrefixView, RankCaches
from workloads.traces import TraceData, trace_window

ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = Path(os.environ.get("PREFILL_GATE_SHARED", ROOT.parent / "shared")) / "traces"
MOONCAKE = SHARED_TRACES / "mooncake-fast25-conversation.jsonl"
AZURE = SHARED_TRACES / "azure-llm-2023-conv.csv"

needs_shared = pytest.mark.skipif(
    not (MOONCAKE.is_file() and AZURE.is_file()),
    reason=f"the shared traces are not at {SHARED_TRACES} (set PREFILL_GATE_SHARED to the folder holding traces/)",
)


@pytest.fixture(scope="module")
def mooncake() -> TraceData:
    return load_trace_file(MOONCAKE)


def mooncake_line(t_ms: float, prompt: int, output: int, blocks: list[int]) -> str:
    return json.dumps({"timestamp": t_ms, "input_length": prompt, "output_length": output, "hash_ids": blocks})


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


# -- the shared traces -------------------------------------------------------------------------------------


@needs_shared
def test_mooncake_trace_loads_with_its_prefix_blocks(mooncake: TraceData):  # format by JSONL keys
    assert mooncake.format == "mooncake-jsonl" and mooncake.block_tokens == MOONCAKE_BLOCK_TOKENS
    assert len(mooncake) == 12_031  # the README's count
    first = mooncake.arrivals[0]
    assert (first.time, first.prompt_len, first.output_len, first.blocks) == (0.0, 6758, 500, tuple(range(14)))
    times = [a.time for a in mooncake.arrivals]
    assert times == sorted(times) and 3500 < mooncake.span_s < 3600  # ms in the file, seconds here: 59 minutes
    assert all(len(a.blocks or ()) == -(-(a.prompt_len or 0) // 512) for a in mooncake.arrivals)
    mean_prompt = sum(a.prompt_len or 0 for a in mooncake.arrivals) / len(mooncake)
    assert 11_500 < mean_prompt < 12_500  # "~12k prompt tokens"


@needs_shared
def test_mooncake_buckets_are_spread_so_no_two_requests_share_a_time(mooncake: TraceData):
    # The release's timestamps are 3 s buckets (1,180 distinct values for 12,031 requests): replayed as
    # recorded, a bucket is one burst at every speed. Spread, every request has its own time, each within its
    # bucket, in file order.
    assert mooncake.bucket_s == pytest.approx(3.0, abs=0.01) and "3 s buckets" in mooncake.describe()
    times = [a.time for a in mooncake.arrivals]
    assert len(set(times)) == len(times) and times == sorted(times)
    assert mooncake.arrivals[1].time == pytest.approx(0.3)  # the first bucket's 10 requests, 0.3 s apart


def test_bucketed_timestamps_spread_evenly_and_distinct_ones_stay(tmp_path: Path):
    bucketed = "".join(mooncake_line(t, 600, 5, [0, 1]) + "\n" for t in (0, 0, 0, 3000, 3000, 6000, 6000, 6000, 6000))
    data = load_trace_file(write(tmp_path, "b.jsonl", bucketed))
    assert data.bucket_s == pytest.approx(3.0)
    assert [a.time for a in data.arrivals] == pytest.approx([0, 1, 2, 3, 4.5, 6, 6.75, 7.5, 8.25])
    distinct = "".join(mooncake_line(t, 600, 5, [0, 1]) + "\n" for t in (0, 700, 3000, 3001, 9000))
    kept = load_trace_file(write(tmp_path, "d.jsonl", distinct))
    assert kept.bucket_s is None and [a.time for a in kept.arrivals] == [0, 0.7, 3.0, 3.001, 9.0]


@needs_shared
def test_azure_trace_loads_as_seconds_since_its_first_request():  # format by CSV header
    data = load_trace_file(AZURE)
    assert data.format == "azure-csv" and data.block_tokens is None
    assert len(data) == 19_366
    first, second = data.arrivals[:2]
    assert (first.time, first.prompt_len, first.output_len) == (0.0, 374, 44)
    # 18:15:50.9951690 - 18:15:46.6805900 (datetime keeps microseconds)
    assert second.time == pytest.approx(4.314579, abs=2e-6) and (second.prompt_len, second.output_len) == (396, 109)
    assert 3400 < data.span_s < 3600 and all(a.blocks is None for a in data.arrivals)


# -- malformed input: one line naming the file and the line -----------------------------------------------

GOOD_CSV = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
GOOD_MOONCAKE = mooncake_line(0, 600, 5, [0, 1]) + "\n"


@pytest.mark.parametrize(
    ("name", "text", "where", "message"),
    [
        # bad header
        ("a.csv", "TIMESTAMP,Context,Generated\n2023-11-16 18:15:46,1,1\n", ":1: ", "unknown trace format"),
        ("a.csv", "time;in;out\n", ":1: ", "expected the Azure CSV header"),
        ("a.jsonl", '{"when": 1, "size": 3}\n', ":1: ", "neither a Mooncake line"),
        # bad number
        ("a.csv", GOOD_CSV + "2023-11-16 18:15:47.0,12x,5\n", ":3: ", "ContextTokens must be an integer >= 1"),
        ("a.csv", GOOD_CSV + "2023-11-16 18:15:47.0,12,-5\n", ":3: ", "GeneratedTokens must be an integer >= 1"),
        ("a.csv", GOOD_CSV + "2023-11-16 18:15:47.0,0,5\n", ":3: ", "ContextTokens must be an integer >= 1"),
        ("a.csv", GOOD_CSV + "16/11/2023 18:15,12,5\n", ":3: ", "bad TIMESTAMP"),
        ("a.csv", GOOD_CSV + "2023-11-16 18:15:47.0,12\n", ":3: ", "expected 3 fields"),
        ("a.jsonl", GOOD_MOONCAKE + mooncake_line(5, 0, 5, []) + "\n", ":2: ", "'input_length' must be an integer"),
        ("a.jsonl", GOOD_MOONCAKE + mooncake_line(5, 9, 2.5, [0]) + "\n", ":2: ", "'output_length' must be"),
        (
            "a.jsonl",
            GOOD_MOONCAKE + '{"timestamp": NaN, "input_length": 5, "output_length": 1, "hash_ids": []}\n',
            ":2: ",
            "'timestamp' must be a finite number",
        ),
        ("a.jsonl", GOOD_MOONCAKE + mooncake_line(5, 9, 2, [0, -1]) + "\n", ":2: ", "'hash_ids' must be a list"),
        ("a.jsonl", GOOD_MOONCAKE + mooncake_line(5, 600, 2, [0, 1, 2]) + "\n", ":2: ", "more than the 2"),
        ("a.jsonl", GOOD_MOONCAKE + "{broken\n", ":2: ", "not valid JSON"),
        ("a.jsonl", GOOD_MOONCAKE + "[1, 2]\n", ":2: ", "expected a JSON object"),
        # missing key
        (
            "a.jsonl",
            GOOD_MOONCAKE + '{"timestamp": 9, "input_length": 5, "output_length": 1}\n',
            ":2: ",
            "missing key 'hash_ids'",
        ),
        ("a.jsonl", '{"t": 0, "output_len": 5}\n', ":1: ", "missing key 'prompt_len'"),
        # unsorted timestamps
        (
            "a.jsonl",
            mooncake_line(500, 9, 1, [0]) + "\n\n" + mooncake_line(499, 9, 1, [0]) + "\n",
            ":3: ",
            "before the previous line's 500 ms",
        ),
        ("a.csv", GOOD_CSV + "2023-11-16 18:15:46.0,12,5\n", ":3: ", "before the previous line's"),
        # not text
        ("a.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n\xff\xfe,1,1\n", ":2: ", "not UTF-8 text"),
    ],
)
def test_malformed_trace_is_one_line_naming_file_and_line(tmp_path: Path, name: str, text, where: str, message: str):
    path = write(tmp_path, name, text)
    with pytest.raises(TraceError, match=message) as info:
        load_trace_file(path)
    assert str(info.value).startswith(f"{path}{where}") and "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("empty.jsonl", "", "empty trace file"),
        ("blank.csv", "\n  \n\n", "empty trace file"),
        ("header.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests after the header"),
    ],
)
def test_empty_trace_is_refused(tmp_path: Path, name: str, text: str, message: str):
    path = write(tmp_path, name, text)
    with pytest.raises(TraceError, match=message) as info:
        load_trace_file(path)
    assert str(info.value).startswith(f"{path}: ")


def test_missing_file_is_a_trace_error(tmp_path: Path):
    with pytest.raises(TraceError, match="cannot read the trace"):
        load_trace_file(tmp_path / "nope.csv")


def test_byte_order_mark_and_crlf_are_accepted(tmp_path: Path):  # files saved by spreadsheet tools
    path = write(tmp_path, "bom.csv", "\ufeff" + GOOD_CSV.replace("\n", "\r\n"))
    data = load_trace_file(path)
    assert [(a.time, a.prompt_len, a.output_len) for a in data.arrivals] == [(0.0, 374, 44)]


def test_prefill_gate_jsonl_is_still_replayed_sorted(tmp_path: Path):  # the project's own format keeps working
    lines = [{"t": 0.5, "prompt_len": 4, "output_len": 2}, {"t": 0.1, "prompt_len": 8, "output_len": 1, "rank": 1}]
    path = write(tmp_path, "own.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")
    data = load_trace_file(path)
    assert data.format == "jsonl" and [(a.time, a.rank) for a in data.arrivals] == [(0.1, 1), (0.5, None)]


TRACE_TEXT = st.one_of(
    st.binary(max_size=300),
    st.lists(
        st.one_of(
            st.sampled_from(
                [
                    "TIMESTAMP,ContextTokens,GeneratedTokens",
                    "2023-11-16 18:15:46.6805900,374,44",
                    mooncake_line(0, 600, 5, [0, 1]),
                    '{"t": 1, "prompt_len": 3, "output_len": 1}',
                    '{"timestamp": 1e400}',
                    "",
                    ",,,",
                    '"unterminated',
                ]
            ),
            st.text(max_size=40),
        ),
        max_size=6,
    ).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass")),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=TRACE_TEXT)
def test_fuzzed_files_load_or_fail_with_one_line(tmp_path: Path, data: bytes):  # bad input changes nothing
    path = tmp_path / "fuzz.trace"
    path.write_bytes(data)
    try:
        trace = load_trace_file(path)
    except TraceError as exc:
        text = str(exc)
        assert text.startswith(str(path)) and "\n" not in text and "\r" not in text
    else:
        assert len(trace) >= 1 and trace.format in ("azure-csv", "mooncake-jsonl", "jsonl")
        assert all(a.prompt_len and a.prompt_len >= 1 and a.output_len and a.output_len >= 1 for a in trace.arrivals)


# -- windows and speed -------------------------------------------------------------------------------------


def small_trace(times: list[float]) -> TraceData:
    return TraceData("mem", "jsonl", tuple(Arrival(t, 10, 2) for t in times))


def test_window_picks_trace_seconds_and_speed_compresses_them():
    data = small_trace([0.0, 5.0, 10.0, 15.0, 20.0])
    assert [a.time for a in trace_window(data, start=5.0, duration=10.0)] == [0.0, 5.0]  # [5, 15)
    assert [a.time for a in trace_window(data, speed=4.0, start=10.0)] == [0.0, 1.25, 2.5]
    assert [a.time for a in trace_window(data, speed=0.5, duration=6.0)] == [0.0, 10.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"speed": 0.0}, "speed must be a finite number > 0"),
        ({"speed": float("inf")}, "speed must be a finite number > 0"),
        ({"start": -1.0}, "start must be a finite number >= 0"),
        ({"duration": 0.0}, "duration must be > 0"),
        ({"start": 30.0}, r"no requests in the window \[30, inf\)"),
    ],
)
def test_bad_window_is_refused(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        trace_window(small_trace([0.0, 1.0]), **kwargs)


# -- the block caches ---------------------------------------------------------------------------------------


def test_block_cache_matches_leading_blocks_only():
    cache = BlockCache(10)
    cache.insert([1, 2, 3])
    assert cache.match([1, 2, 3, 4]) == 3
    assert cache.match([1, 9, 3]) == 1  # a prefix match stops at the first miss
    assert cache.match([9, 1, 2]) == 0


def test_block_cache_evicts_least_recently_used_tails_first():
    cache = BlockCache(4)
    cache.insert([1, 2, 3])  # a conversation: head 1, tail 3
    cache.insert([1, 4])  # another one on the same head: 1 is touched again
    cache.insert([5])  # over capacity: the oldest is 3, the first conversation's tail
    assert 3 not in cache and cache.match([1, 2, 3]) == 2 and cache.evicted == 1
    cache.touch([1, 2])
    cache.insert([6, 7])  # evicts 4 then 5, never the recently used head
    assert [b in cache for b in (1, 2, 4, 5, 6, 7)] == [True, True, False, False, True, True]
    assert len(cache) == 4


def test_zero_capacity_holds_nothing():
    cache = BlockCache(0)
    cache.insert([1, 2])
    assert len(cache) == 0 and cache.match([1]) == 0


def test_hit_is_whole_blocks_below_the_prompt_length():
    caches = RankCaches(2, capacity=100, block_tokens=512)
    caches.finished(1, [7, 8, 9])
    assert caches.hit(0, [7, 8, 9], 1400) == 0  # another rank holds nothing
    assert caches.hit(1, [7, 8, 10], 1400) == 1024  # two matched blocks
    assert caches.hit(1, [7, 8, 9], 1400) == 1399  # all three, but the last token is always computed


def feed(workload: Workload, now: float, loads: list[int] | None = None):
    return workload.due(now, loads)


def test_a_request_hits_only_where_its_prefix_was_served_and_after_it_ended():
    arrivals = [
        Arrival(0.0, 1200, 4, blocks=(1, 2, 3)),
        Arrival(1.0, 1300, 4, blocks=(1, 2, 3)),  # while the first is in flight: no KV yet
        Arrival(2.0, 1800, 4, blocks=(1, 2, 3, 4)),  # after it ended: the three blocks hit
    ]
    workload = Workload(Trace(arrivals), dp_size=1, router=RoundRobin(), cache_blocks=64)
    ((_, first),) = feed(workload, 0.0)
    ((_, second),) = feed(workload, 1.0)
    assert first.prefix_hit == second.prefix_hit == 0
    workload.on_finished(first.rid, 1.5)
    ((_, third),) = feed(workload, 2.0)
    assert third.prefix_hit == 3 * 512


def test_evicted_blocks_no_longer_hit():
    arrivals = [
        Arrival(0.0, 1100, 1, blocks=(1, 2, 3)),
        Arrival(1.0, 1100, 1, blocks=(4, 5, 6)),
        Arrival(2.0, 1100, 1, blocks=(1, 2, 3)),
    ]
    workload = Workload(Trace(arrivals), dp_size=1, cache_blocks=3)
    for now in (0.0, 1.0):
        ((_, spec),) = feed(workload, now)
        workload.on_finished(spec.rid, now + 0.5)
    ((_, again),) = feed(workload, 2.0)
    assert again.prefix_hit == 0 and workload.prefix_caches is not None and workload.prefix_caches.evicted == 3


# -- the prefix-affinity router ----------------------------------------------------------------------------


def test_affinity_follows_the_longest_cached_prefix():
    state = PrefixAffinity().start(4, None)  # type: ignore[arg-type]
    view = PrefixView(blocks=4, matched=(0, 2, 3, 1), sizes=(0, 5, 9, 2))
    assert state.pick([5, 0, 3, 0], view) == 2  # 3/4 > 0.3, despite a longer queue than rank 1


def test_affinity_below_the_threshold_picks_the_smallest_cache():
    state = PrefixAffinity().start(3, None)  # type: ignore[arg-type]
    view = PrefixView(blocks=10, matched=(1, 3, 0), sizes=(40, 60, 50))
    assert state.pick([0, 0, 0], view) == 0  # best match 3/10 is not above 0.3: fewest cached blocks


def test_affinity_balances_when_loads_spread_beyond_both_thresholds():
    state = PrefixAffinity(balance_abs_threshold=8, balance_rel_threshold=1.5).start(3, None)  # type: ignore[arg-type]
    view = PrefixView(blocks=4, matched=(4, 0, 0), sizes=(4, 0, 0))
    assert state.pick([20, 11, 12], view) == 1  # 20 - 11 > 8 and 20 > 1.5 * 11: shortest queue
    assert state.pick([20, 14, 15], view) == 0  # 20 > 1.5 * 14 is false: the cached prefix wins
    assert state.pick([9, 2, 3], view) == 0  # 9 - 2 is not > 8


# -- through the simulator and serve -------------------------------------------------------------------------


def extend_counter(out: list[int]):
    """A round hook that collects every round's extended prompt tokens."""

    def hook(record, outcomes) -> None:
        out.append(sum(row.prefill_tokens for row in record.rows))

    return hook


@needs_shared
def test_hits_reduce_the_extend_work_in_the_simulator(mooncake: TraceData):  # the hit tokens are not extended
    args = ServerArgs(executor="sim", dp_size=4, enable_dp_attention=True, kv_pages=16384)
    workload = trace_workload(mooncake, dp_size=4, duration=90.0, speed=0.5)
    extended: list[int] = []
    summary, _ = run_sim(args, workload, on_round=extend_counter(extended))
    assert summary.requests_finished == summary.requests_submitted > 100
    assert summary.prefix_hit_requests > 0.5 * summary.requests_submitted  # the shared head block at least
    # Every prompt token is either extended or served from a rank's cache, never both.
    assert sum(extended) == summary.prompt_tokens - summary.prefix_hit_tokens
    assert summary.prefix_hit_share == pytest.approx(summary.prefix_hit_tokens / summary.prompt_tokens)


def replay_hit_share(data: TraceData, router: str, service_s: float = 30.0) -> float:
    """Replay a whole trace through its workload alone, every request ending `service_s` after it
    arrived; the share of prompt tokens served from the ranks' caches."""
    workload = trace_workload(data, dp_size=8, router=router)
    ends: list[tuple[float, str]] = []
    hit = total = 0
    while not workload.done or ends:
        now = min(workload.next_arrival, ends[0][0] if ends else math.inf)
        while ends and ends[0][0] <= now:
            workload.on_finished(heapq.heappop(ends)[1], now)
        for _, spec in workload.due(now):
            hit += spec.prefix_hit
            total += spec.prompt_len
            heapq.heappush(ends, (now + service_s, spec.rid))
    return hit / total


@needs_shared
def test_prefix_affinity_finds_most_of_the_reuse_round_robin_misses(mooncake: TraceData):
    # Served by one infinite cache the trace would reuse ~37% of its prompt tokens (README: heavy reuse).
    affinity = replay_hit_share(mooncake, "prefix-affinity")
    spread = replay_hit_share(mooncake, "round-robin")
    assert affinity > 0.25 and affinity > 2 * spread


def test_prefix_hits_cross_the_control_plane():  # RunStats fields 80-83
    from control.plane.services import run_stats

    arrivals = [Arrival(0.0, 1200, 2, blocks=(1, 2, 3)), Arrival(0.5, 1500, 2, blocks=(1, 2, 3))]
    workload = Workload(Trace(arrivals), dp_size=1, cache_blocks=8)
    args = ServerArgs(executor="sim", dp_size=1, storage_read_ticks=0)
    summary, _ = run_sim(args, workload)
    # three blocks matched (1536 tokens), capped below the 1500-token prompt
    assert (summary.prompt_tokens, summary.prefix_hit_requests, summary.prefix_hit_tokens) == (2700, 1, 1499)
    stats = run_stats(summary, 0)
    assert (stats.prompt_tokens, stats.prefix_hit_requests, stats.prefix_hit_tokens) == (2700, 1, 1499)
    assert stats.prefix_hit_share == pytest.approx(1499 / 2700)
