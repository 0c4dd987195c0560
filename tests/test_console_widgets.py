"""What the console's widgets and store say, asserted on their text, from fixed records.

No server here: the store is fed directly (as a source would feed it) and the widgets are read back
line by line. The live paths are in test_console_live.py, the pictures in test_console_snapshots.py.
"""

from __future__ import annotations

import pytest
from google.rpc import error_details_pb2, status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.admin import field_violations
from console.app import ConsoleApp
from console.endpoint import Endpoint, TargetError, check_target
from console.source import ReplaySource
from console.state import Connection, Link, Mark
from console.store import STALE_AFTER_S, Store, figures
from console.widgets import RankGrid, StatusHeader, ThroughputPanel, Timeline
from console.widgets.rank_grid import Columns
from console.widgets.status_header import config_label, link_label
from console.widgets.timeline import GAP, level, point_glyph
from prefill_gate.v1 import types_pb2 as pb
from tests.console_pilot import Clock, record, row

ROWS = [
    row(0, want_prefill=True, has_decode_work=True, batch_size=12, num_tokens=2060, num_extends=1,
        planned_prefill=True, occupancy=0.42, resident_chunks=1, waiting_prompts=3),
    row(1, want_prefill=False, has_decode_work=True, batch_size=9, num_tokens=9, occupancy=0.95, waiting_prompts=4,
        retracted=2),
    row(2, want_prefill=False, has_decode_work=False, occupancy=0.0),
    row(3, want_prefill=True, has_decode_work=True, batch_size=7, num_tokens=7, occupancy=0.88, storage_reads=2),
]


# -- the store -------------------------------------------------------------------------------------


def test_store_counts_drops_from_the_server_and_from_gaps() -> None:
    store = Store("t", live=True, clock=Clock())
    store.record(record(10, ROWS))
    store.record(record(11, ROWS, dropped_before=0))
    store.record(record(15, ROWS, dropped_before=3))  # three announced, one more missing before the server
    store.record(record(20, ROWS))  # a resume the server could not fill
    assert store.dropped == 3 + 4
    marks = store.view().marks
    assert [m.gap_before for m in marks] == [False, False, True, True]


def test_store_new_run_resets_history_and_says_so() -> None:
    store = Store("t", live=True, clock=Clock())
    store.record(record(500, ROWS, run_id="run-a"))
    store.record(record(0, ROWS, run_id="run-b"))
    assert [r.round for r in store.history] == [0]
    assert store.dropped == 0
    assert "restarted" in store.notice_text and "run-a" in store.notice_text and "run-b" in store.notice_text


def test_store_pause_and_step_stay_within_history() -> None:
    store = Store("t", live=True, clock=Clock())
    for index in range(50):
        store.record(record(index, ROWS))
    assert store.toggle_pause()
    store.record(record(50, ROWS))
    assert store.view().record.round == 49 and store.view().behind == 1
    assert store.step(-10) == 39
    assert store.step(-100) == 0
    assert store.step(1000) == 50
    assert not store.toggle_pause()
    assert store.view().record.round == 50 and not store.view().paused


def test_store_stale_after_silence_and_reconnect_countdown() -> None:
    clock = Clock()
    store = Store("t", live=True, clock=clock)
    store.status(Link.LIVE, "streaming")
    store.record(record(1, ROWS))
    clock.now += STALE_AFTER_S + 2.4
    connection = store.view().connection
    assert connection.link is Link.STALE and connection.stale_s == pytest.approx(STALE_AFTER_S + 2.4)
    store.status(Link.RECONNECTING, "cannot reach x", retry_in_s=4.0)
    clock.now += 1.5
    assert store.view().connection.retry_in_s == pytest.approx(2.5)


def test_rate_and_figures_from_the_records() -> None:
    store = Store("t", live=False, clock=Clock())
    marks_in = [
        (pb.GATE_POINT_ALL, True, 3), (pb.GATE_POINT_NONE, False, 0), (pb.GATE_POINT_ANY, False, 0),
        (pb.GATE_POINT_ANY, True, 1), (pb.GATE_POINT_ALL, False, 0),
    ]
    for index, (point, opened, extending) in enumerate(marks_in):
        rows = [row(r, num_extends=1 if r < extending else 0) for r in range(4)]
        store.record(record(index, rows, point=point, opened=opened))
    state = store.view()
    assert state.rounds_per_s == pytest.approx(100.0)
    assert state.figures.extend_share == pytest.approx(2 / 5)
    assert state.figures.ranks_per_window == pytest.approx((3 + 1) / 2)
    assert (state.figures.any_open, state.figures.any_shut, state.figures.all_open, state.figures.all_shut) == (
        1, 1, 1, 1)
    assert figures([]).extend_share is None


# -- labels ----------------------------------------------------------------------------------------


def test_link_and_config_labels() -> None:
    assert link_label(Connection(Link.LIVE)) == "● live"
    assert link_label(Connection(Link.STALE, stale_s=4.2)) == "◌ stale for 4 s"
    assert link_label(Connection(Link.RECONNECTING, retry_in_s=2.0)) == "↻ reconnecting in 2 s"
    assert link_label(Connection(Link.RECONNECTING, retry_in_s=0.2)) == "↻ reconnecting now"
    store = Store("t", live=True)
    store.record(record(1, ROWS))
    assert config_label(store.view()) == "gate ON · ALL A=4 · ANY K=12 · epoch 2"
    off = record(2, ROWS)
    off.config.CopyFrom(pb.GateConfig(epoch=3, enabled=False, policy="gate"))
    store.record(off)
    assert config_label(store.view()) == "gate OFF · epoch 3"


def test_timeline_glyphs() -> None:
    def mark(point: int, opened: bool, extending: int = 0) -> Mark:
        return Mark(1, point, opened, 0, extending, False)

    assert point_glyph(mark(pb.GATE_POINT_ANY, True)) == ("▲", "open")
    assert point_glyph(mark(pb.GATE_POINT_ANY, False)) == ("△", "shut")
    assert point_glyph(mark(pb.GATE_POINT_ALL, True)) == ("■", "open")
    assert point_glyph(mark(pb.GATE_POINT_ALL, False)) == ("□", "shut")
    assert point_glyph(mark(pb.GATE_POINT_NONE, False)) == ("·", "none")
    assert level(0, 8) == " " and level(8, 8) == "█" and level(1, 8) == "▂"


def test_field_violations_from_trailing_metadata() -> None:
    bad = error_details_pb2.BadRequest(field_violations=[
        error_details_pb2.BadRequest.FieldViolation(field="any_interval", description="must be >= 4"),
        error_details_pb2.BadRequest.FieldViolation(field="any_interval", description="must be an integer"),
    ])
    status = status_pb2.Status(code=3, message="bad")
    status.details.add().Pack(bad)
    metadata = (("other", "x"), ("grpc-status-details-bin", status.SerializeToString()))
    assert field_violations(metadata) == {"any_interval": ["must be >= 4", "must be an integer"]}


def test_targets_and_credentials(tmp_path) -> None:
    assert check_target("127.0.0.1:50151") == "127.0.0.1:50151"
    assert check_target("[::1]:7") == "[::1]:7"
    for bad in ("localhost", "host:port", ":50151", "a:0", "a:70000", "http://a:1"):
        with pytest.raises(TargetError, match="HOST:PORT"):
            check_target(bad)
    with pytest.raises(TargetError, match="cannot read"):
        Endpoint("a:1", tls_ca=str(tmp_path / "missing.pem"))
    (tmp_path / "junk.pem").write_text("junk")
    with pytest.raises(TargetError, match="not a PEM"):
        Endpoint("a:1", tls_ca=str(tmp_path / "junk.pem"))
    assert Endpoint("a:1", token="s3").metadata == (("authorization", "Bearer s3"),)


# -- widgets in a running app ----------------------------------------------------------------------


def fixed_app(records: list[pb.RoundRecord]) -> ConsoleApp:
    frozen = Clock()
    return ConsoleApp(ReplaySource(iter(records), "fixed.pgrec", speed=0, clock=frozen), limit=len(records),
                      clock=frozen)


def grid_lines(grid: RankGrid) -> list[str]:
    return ["".join(segment.text for segment in grid.render_line(y)) for y in range(len(grid.rows) + 1)]


@pytest.mark.parametrize("width", [80, 160])
async def test_rank_grid_text_and_highlights(width: int) -> None:
    app = fixed_app([record(7, ROWS)])
    async with app.run_test(size=(width, 30)) as pilot:
        await app.workers.wait_for_complete()
        app.refresh_now()
        await pilot.pause()
        grid = app.query_one(RankGrid)
        lines = grid_lines(grid)
        columns = Columns.fit(grid.scrollable_content_region.width)
        titles = ["rank", "w", "d", "p", "batch"] if columns.layout == "compact" else ["rank", "want", "dec", "pre",
                                                                                       "batch"]
        assert lines[0].split()[:5] == titles
        assert lines[1].split()[:6] == ["0", "●", "●", "▶", "12", "2060"] if not columns.wide else \
            lines[1].split()[:7] == ["0", "●", "●", "▶", "12", "0", "2060"]
        blocks = "blocks ALL" if columns.wide else "⊘ALL"
        assert blocks in lines[2] and "95%" in lines[2]  # rank 1: want=false, decodes=true, above 0.9
        assert ("blocks ALL >0.9" if columns.wide else "⊘ALL!") in lines[2]
        assert blocks not in lines[3]  # rank 2 has no decode work: it never blocks ALL (P5)
        assert blocks not in lines[1] and blocks not in lines[4]
        # the watermark cell sits at 0.9 of the bar on every line
        for line in lines[1:]:
            bar_start = line.index("┃") - int(0.9 * columns.bar)
            assert line[bar_start - 1] == " "
        # rank 1 stands out: its rank cell takes the blocking style, its occupancy the hot one
        strip = grid.render_line(2)
        blocking = grid.get_component_rich_style("rank-grid--blocks")
        assert any(seg.text.strip() == "1" and seg.style.bgcolor == blocking.bgcolor for seg in strip)
        hot = grid.get_component_rich_style("rank-grid--hot")
        assert any("95%" in seg.text and seg.style.color == hot.color for seg in strip)


async def test_blocking_ranks_stand_out_only_while_someone_wants_prefill() -> None:
    """With no rank wanting prefill a shut ALL point holds nothing back: the flag stays, muted."""
    quiet = [row(r, want_prefill=False, has_decode_work=True, batch_size=4, occupancy=0.5) for r in range(4)]
    app = fixed_app([record(3, quiet)])
    async with app.run_test(size=(80, 20)) as pilot:
        await app.workers.wait_for_complete()
        app.refresh_now()
        await pilot.pause()
        grid = app.query_one(RankGrid)
        assert all("⊘ALL" in line for line in grid_lines(grid)[1:])
        blocking = grid.get_component_rich_style("rank-grid--blocks")
        moot = grid.get_component_rich_style("rank-grid--blocks-moot")
        strip = list(grid.render_line(1))
        assert not any(seg.style.bgcolor == blocking.bgcolor for seg in strip if seg.text.strip())
        assert any(seg.text == "⊘ALL" and seg.style.color == moot.color for seg in strip)


async def test_header_timeline_and_panel_text() -> None:
    records = [record(i, ROWS, point=pb.GATE_POINT_ALL if i % 4 == 0 else pb.GATE_POINT_NONE,
                      opened=i == 8, counter=i % 12) for i in range(20)]
    records.append(record(25, ROWS, point=pb.GATE_POINT_ANY, opened=True, dropped_before=4))
    app = fixed_app(records)
    async with app.run_test(size=(160, 40)) as pilot:
        await app.workers.wait_for_complete()
        app.refresh_now()
        await pilot.pause()
        header = app.query_one(StatusHeader).compose_text(app.state).plain.splitlines()
        assert header[0].startswith("▶ replay │ round 25 │ 100 rounds/s │ 4 ranks │ run run-a │ fixed.pgrec")
        # the replay stopped after its last record (limit): it says so, and that this console lost 5 records
        assert header[1] == "gate ON · ALL A=4 · ANY K=12 · epoch 2 │ ⚠ 1 alert (a) │ dropped 5 │ ⏸ not playing"

        timeline = app.query_one(Timeline)
        text = ["".join(seg.text for seg in timeline.render_line(y)) for y in range(4)]
        assert "rounds 0-25" in text[0]
        points = text[1].rstrip()
        assert points.endswith("□···■···□···□···" + GAP)  # round 8 opened ALL; 25 after a gap
        assert text[1].lstrip().startswith("points")

        await pilot.press("left")
        header = app.query_one(StatusHeader).compose_text(app.state).plain.splitlines()
        assert header[1].endswith("⏸ PAUSED at round 19")  # a replay plays on from here: nothing is behind

        side = app.query_one("#side-figures", ThroughputPanel)
        rendered = str(side.render())
        assert "request figures need a live server" in rendered
        assert "ALL opened / shut      1 / 4" in rendered


# -- the contract ------------------------------------------------------------------------------------


def test_every_field_the_console_shows_is_emitted_by_the_control_plane() -> None:
    """The engine's values go through the control plane's converters into every field the console reads."""
    import dataclasses

    from console.sample import sample_args, sample_engine_records, sample_workload
    from console.state import RECORD_FIELDS_READ, ROW_FIELDS_READ, STATS_FIELDS_READ
    from control.plane.services import run_stats
    from control.telemetry.trace_status import TraceStatus
    from engine.gate import GatePoint
    from engine.rows import Row
    from lab.simrun import run_sim
    from prefill_gate.convert import rank_row, round_record

    def engine_row(rank: int, want: bool, used: int) -> Row:
        values = {}
        for index, field in enumerate(dataclasses.fields(Row)):
            default = getattr(Row(), field.name)
            values[field.name] = True if isinstance(default, bool) else 3 + index
        values.update(rank=rank, want_prefill=want, has_decode_work=True, pool_pages_used=used, pool_pages_usable=20)
        return Row(**values)

    rows = (engine_row(1, True, 10), engine_row(2, False, 19))  # the second blocks ALL above the watermark
    for name in ROW_FIELDS_READ:
        assert any(getattr(rank_row(r), name) for r in rows), f"RankRow.{name} is never set"

    source = sample_engine_records(2, 5)[-1]
    engine_record = dataclasses.replace(
        source, round=9, counter=12, point=GatePoint.ANY, open=True, adopted_epoch=3, rows=rows
    )
    message = round_record(engine_record, "run-x")
    for name in RECORD_FIELDS_READ:
        value = getattr(message, name)
        assert (len(value) if name == "ranks" else message.HasField(name) if name == "config" else value), name

    summary, _ = run_sim(sample_args(2), sample_workload(2), rounds=400)
    # records the engine's hand-off dropped; spans the exporter dropped
    stats = run_stats(summary, 3, TraceStatus(enabled=True, spans_dropped=2))
    for name in STATS_FIELDS_READ:
        assert getattr(stats, name), f"RunStats.{name} is zero after a busy run"


# -- digests, summary, selection, alerts (pure) -----------------------------------------------------


def test_blocks_all_is_decided_from_the_round_not_from_the_flag() -> None:
    """rule P4/P5/R8: decode work, no wish for prefill, not extending, and the gate on."""
    from console.digest import Summary, digest

    rows = [
        row(0, want_prefill=False, has_decode_work=True, num_extends=1),  # took its prompt this round
        row(1, want_prefill=False, has_decode_work=True),  # blocks
        row(2, want_prefill=False, has_decode_work=False),  # nothing to protect (P5)
        row(3, want_prefill=True, has_decode_work=True, occupancy=0.95),
    ]
    entry = digest(record(5, rows))
    assert entry.blocks == 0b0010 and entry.want == 0b1000 and entry.extend == 0b0001 and entry.above == 0b1000
    assert Summary.of(entry).line() == "ranks 4 · want 1/4 · blocks ALL 1 · >0.9 1 · extending 1"
    off = record(6, rows)
    off.config.CopyFrom(pb.GateConfig(epoch=3, enabled=False))
    assert digest(off).blocks == 0
    assert Summary.of(None).line() == "ranks 0 · want 0/0 · blocks ALL 0 · >0.9 0 · extending 0"


def test_rounds_since_each_rank_extended() -> None:
    store = Store("t", live=False, clock=Clock())
    for i in range(12):
        store.record(record(i, [row(0, num_extends=int(i % 5 == 0)), row(1), row(2, num_extends=int(i == 9))]))
    assert [view.since for view in store.view().views] == [1, None, 2]  # 0 at round 10, 2 at 9, 1 never
    store.step(-2)  # paused at round 9
    assert [view.since for view in store.view().views] == [4, None, 0]


def test_filter_words_and_refusals() -> None:
    from console.selection import FilterError, RankView, parse_filter, sort_views

    def view(rank: int, **fields: object) -> RankView:
        blocks = bool(fields.pop("blocks", False))
        since = fields.pop("since", None)
        return RankView(row(rank, **fields), rank, blocks, blocks, since, bool(fields.get("retracted")))  # type: ignore[arg-type]

    views = [view(0, want_prefill=True, occupancy=0.2, waiting_prompts=5), view(1, blocks=True, occupancy=0.95),
             view(2, num_extends=1, occupancy=0.5, since=0), view(3, retracted=2, since=40)]

    def ranks(text: str) -> list[int]:
        rank_filter = parse_filter(text)
        return [v.row.rank for v in views if rank_filter(v)]

    assert ranks("") == [0, 1, 2, 3]
    assert ranks("blocks") == [1] and ranks("!blocks") == [0, 2, 3]
    assert ranks(">0.9") == [1] and ranks("occ>0.4") == [1, 2] and ranks("occ<50%") == [0, 3]
    assert ranks("wait>=5") == [0] and ranks("want") == [0] and ranks("ext") == [2] and ranks("alert") == [3]
    assert ranks("since>10") == [0, 1, 3]  # never extended within the rounds held counts as longest
    assert ranks("1-2") == [1, 2] and ranks("3") == [3] and ranks("1-3 !blocks") == [2, 3]
    for bad, message in (("frob", "not a filter word"), ("5-2", "low-high"), ("occ>7", "occupancy is 0..1"),
                         ("²", "not a filter word")):  # a digit to str.isdigit(), not a number to int()
        with pytest.raises(FilterError, match=message):
            parse_filter(bad)
    assert [v.row.rank for v in sort_views(views, "since")] == [0, 1, 3, 2]
    assert [v.row.rank for v in sort_views(views, "blocking")] == [1, 0, 2, 3]
    with pytest.raises(ValueError, match="unknown sort key"):
        sort_views(views, "colour")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_any_filter_text_is_read_or_refused_with_a_message(text: str) -> None:
    """Users type anything after `/`: it is a filter, or a FilterError that names the word; nothing else."""
    from console.selection import FilterError, RankView, parse_filter

    try:
        rank_filter = parse_filter(text)
    except FilterError as error:
        assert str(error)
        return
    rank_filter(RankView(row(0, occupancy=0.5), 0, False, False, None, False))


def test_alerts_from_the_rounds_held_and_the_run() -> None:
    from console.alerts import Bounds, rank_alerts, run_alerts
    from console.digest import digest

    bounds = Bounds(above_rounds=5, growing_rounds=4, gate_wait_p99_s=1.0)
    history = [digest(record(i, [row(0, occupancy=0.95), row(1, occupancy=0.95 if i > 6 else 0.5,
                                                                waiting_prompts=i), row(2, waiting_prompts=3)]))
               for i in range(10)]
    alerts = rank_alerts(history[::-1], bounds)
    assert {(a.kind, a.rank) for a in alerts} == {("watermark", 0), ("waiting", 1)}  # rank 1: 3 rounds above
    assert rank_alerts(history[::-1][:3], bounds) == []  # too few rounds held to say
    stats = pb.RunStats(gate_wait_p99_seconds=1.7, gate_wait_p99_rounds=40, records_dropped=3, trace_spans_dropped=9)
    tuned = pb.GateConfig(epoch=4, changed_by="tuner", reason="TTFT p99 1.8 s > 1.5 s -> K 32->24")
    run = run_alerts(stats, 2, tuned, bounds)
    texts = [a.text for a in run]
    assert any("gate wait p99 1.70 s over the 1 s bound" in t for t in texts)
    assert any("dropped 3 round records" in t for t in texts) and any("9 spans" in t for t in texts)
    assert any("this console lost 2" in t for t in texts)
    assert [a.text for a in run if not a.counts] == ["tuner at epoch 4: TTFT p99 1.8 s > 1.5 s -> K 32->24"]
    assert run_alerts(None, 0, pb.GateConfig(epoch=0, changed_by="launch"), bounds) == []
    # the exporter's health (TracingStatus): raised while it fails or stalls, not while it is ok
    from prefill_gate.v1 import tracing_pb2 as tracing_pb

    failing = pb.RunStats(tracing=tracing_pb.TracingStatus(enabled=True, exporter_state="failing", exporter_queued=120,
                                                   exporter_detail="UNAVAILABLE"))
    assert [a.text for a in run_alerts(failing, 0, None, bounds)] == [
        "the trace exporter is failing (120 spans queued): UNAVAILABLE"]
    healthy = pb.RunStats(tracing=tracing_pb.TracingStatus(enabled=True, exporter_state="ok"))
    assert run_alerts(healthy, 0, None, bounds) == []


def test_parts_are_dropped_whole_lowest_first() -> None:
    from console.textfit import Part, fit_parts

    parts = [Part("alpha", keep=9), Part("beta", keep=1), Part("gamma", keep=5), Part("delta", keep=1)]
    assert fit_parts(parts, 100).plain == "alpha │ beta │ gamma │ delta"
    assert fit_parts(parts, 22).plain == "alpha │ beta │ gamma"  # the rightmost of the least kept goes first
    assert fit_parts(parts, 15).plain == "alpha │ gamma"
    assert fit_parts(parts, 4).plain == "alp…"  # only what must stay is ever cut


# -- the recording index (replay's seeking) ----------------------------------------------------------


def write(path, records: list[pb.RoundRecord]) -> None:
    from control.plane.recording import RecordingWriter

    writer = RecordingWriter(path, pb.RecordingHeader(run_id="r", dp_size=2))
    for message in records:
        writer.write(message)
    writer.close()


def test_recording_index_reads_any_record_without_holding_them(tmp_path) -> None:
    from array import array

    from control.plane.recording import RecordingIndex

    records = [record(i, ROWS[:2]) for i in range(0, 400)]
    write(tmp_path / "r.pgrec", records)
    with RecordingIndex(tmp_path / "r.pgrec") as index:
        assert len(index) == 400 and index.error is None
        assert isinstance(index.offsets, array) and isinstance(index.rounds, array)
        assert list(index.rounds) == list(range(400))  # round 0 is not serialized: read by parsing
        assert index[0] == records[0] and index[399] == records[399] and index[123] == records[123]
        assert index.index_of(250) == 250 and index.index_of(10_000) == 399
        with pytest.raises(IndexError):
            index[400]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=2000))
def test_a_cut_recording_indexes_every_whole_record_before_the_cut(tmp_path, cut: int) -> None:
    from control.plane.recording import MAGIC, RecordingError, RecordingIndex, frame

    path = tmp_path / f"cut{cut}.pgrec"
    records = [record(i + 1, ROWS[:2]) for i in range(12)]
    write(path, records)
    data = path.read_bytes()
    sizes = [len(frame(r.SerializeToString())) for r in records]
    header_end = len(data) - sum(sizes)
    end = min(header_end + cut, len(data))
    path.write_bytes(data[:end])
    with RecordingIndex(path) as index:
        whole = 0
        offset = header_end
        for size in sizes:
            if offset + size > end:
                break
            offset += size
            whole += 1
        assert len(index) == whole
        assert [index[i].round for i in range(len(index))] == [r.round for r in records[:whole]]
        assert (index.error is None) == (offset == end)
        if index.error is not None:
            assert "truncated recording" in str(index.error)
    path.write_bytes(b"PGATEREX")
    with pytest.raises(RecordingError, match=f"does not start with {MAGIC!r}"):
        RecordingIndex(path)
