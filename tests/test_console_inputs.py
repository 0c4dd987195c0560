"""Bad input never shows a traceback: wrong flags and files stop before the app starts with one line;
a recording cut short plays what it holds and then says why it ended."""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import pytest

from console.app import ConsoleApp
from console.cli import add_console_parser, console_main
from console.sample import sample_records
from console.source import ReplaySource
from console.state import Link
from control.plane.recording import RecordingWriter
from prefill_gate.v1 import types_pb2 as pb

RECORDS = 40


def parse(*argv: str) -> argparse.Namespace:
    """Flags as `prefill-gate console` parses them."""
    parser = argparse.ArgumentParser(prog="prefill-gate")
    add_console_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["console", *argv])


def write_recording(path: Path, count: int = RECORDS) -> list[pb.RoundRecord]:
    """A recording of a seeded simulated run, as `serve --record` writes it."""
    records = sample_records(2, count)
    writer = RecordingWriter(path, pb.RecordingHeader(run_id="sample-run", dp_size=2, executor="sim"))
    for message in records:
        writer.write(message)
    writer.close()
    return records


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--target", "localhost"), "--target must be HOST:PORT"),
        (("--target", "127.0.0.1:99999"), "--target must be HOST:PORT"),
        (("--target", "127.0.0.1:1", "--tls-ca", "/nonexistent/ca.pem"), "--tls-ca /nonexistent/ca.pem: cannot read"),
        (("--replay", "/nonexistent/run.pgrec"), "/nonexistent/run.pgrec: No such file or directory"),
        (("--replay", "."), ": Is a directory"),
        (("--replay", "x", "--speed", "-1"), "--speed must be >= 0"),
        (("--tick-hz", "0"), "--tick-hz must be in (0, 60]"),
        (("--alert-above-rounds", "0"), "--alert-above-rounds must be in [1, 2000]"),
        (("--alert-growing-rounds", "5000"), "--alert-growing-rounds must be in [1, 2000]"),
        (("--alert-gate-wait-p99", "-1"), "--alert-gate-wait-p99 must be > 0 seconds"),
    ],
)
def test_bad_flags_exit_before_the_app_starts(argv: tuple[str, ...], message: str) -> None:
    err = io.StringIO()
    assert console_main(parse(*argv), err=err) == 2
    assert message in err.getvalue()
    assert err.getvalue().startswith("prefill-gate console: error: ")
    assert "Traceback" not in err.getvalue()


def test_target_and_replay_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--target", "a:1", "--replay", "f")
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not a prefill-gate recording"),
        (b'{"round": 1}\n', "not a prefill-gate recording"),
        (b"PGATEREC", "the header is missing"),
    ],
)
def test_not_a_recording(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.pgrec"
    path.write_bytes(content)
    err = io.StringIO()
    assert console_main(parse("--replay", str(path)), err=err) == 2
    assert message in err.getvalue()


async def replay(path: Path, size: tuple[int, int] = (100, 30)) -> ConsoleApp:
    """Replay a file to its end in a headless app; returns the app after it closed."""
    app = ConsoleApp(ReplaySource.from_file(path, speed=0))
    async with app.run_test(size=size) as pilot:
        await app.workers.wait_for_complete()
        app.refresh_now()
        await pilot.pause()
    return app


async def test_replay_plays_every_record_then_ends(tmp_path: Path) -> None:
    path = tmp_path / "run.pgrec"
    records = write_recording(path)
    app = await replay(path)
    assert [r.round for r in app.store.history] == [r.round for r in records]
    assert app.store.link is Link.ENDED
    assert f"{RECORDS} rounds in the file" in app.store.detail
    assert app.store.run_id == "sample-run" and app.state.dp_size == 2
    assert app.store.notice_text == ""


async def test_truncated_recording_shows_what_it_holds_and_why_it_stopped(tmp_path: Path) -> None:
    path = tmp_path / "cut.pgrec"
    write_recording(path)
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # a run killed while writing its last record
    app = await replay(path)
    assert len(app.store.history) == RECORDS - 1
    assert app.store.link is Link.ENDED
    assert "truncated recording" in app.store.notice_text
    assert f"replayed the {RECORDS - 1} rounds before it" in app.store.notice_text


async def test_replay_keeps_the_recorded_pace(tmp_path: Path) -> None:
    records = sample_records(2, 30)
    span = (records[-1].unix_nanos - records[0].unix_nanos) / 1e9
    source = ReplaySource(iter(records), "paced", speed=span / 0.3)  # the whole run in about 0.3 s
    app = ConsoleApp(source)
    started = time.perf_counter()  # before the app starts: its reader may begin before the test resumes
    async with app.run_test(size=(100, 30)):
        await app.workers.wait_for_complete()
        elapsed = time.perf_counter() - started
    assert 0.25 <= elapsed < 15.0  # the recorded pace, not as fast as possible (generous on a loaded box)
    assert len(app.store.history) == 30
