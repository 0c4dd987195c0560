"""--record FILE: every round record, length-delimited, and a reader that names where a bad file breaks."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from control.plane.recording import (
    MAGIC,
    RecordingError,
    RecordingReader,
    RecordingWriter,
    encode_varint,
    read_recording,
)
from prefill_gate.v1 import telemetry_pb2
from prefill_gate.v1 import types_pb2 as pb
from tests.grpc_plane import serving
from tests.helpers import sim_args

ARGS = sim_args(dp_size=3, prefill_attempt_interval=2, prefill_any_attempt_interval=6)


def record(round_index: int) -> pb.RoundRecord:
    return pb.RoundRecord(round=round_index, counter=round_index % 5, ranks=[pb.RankRow(rank=r) for r in range(3)])


async def test_a_served_run_records_every_round(tmp_path: Path):  # --record
    path = tmp_path / "run.pgrec"
    async with serving(ARGS, pace=1.0, record=str(path), history=100_000) as served:
        await served.wait_round(300)
        await served.plane.drain()
        held = await served.telemetry.GetRounds(telemetry_pb2.GetRoundsRequest())
    header, records = read_recording(path)
    assert (header.run_id, header.dp_size, header.executor) == (served.controller.run_id, 3, "sim")
    assert header.started_unix_nanos > 0
    assert [r.round for r in records] == list(range(len(records))) and len(records) > 300
    assert records == list(held.records)  # byte for byte what the stream and the history serve


def test_round_trip_and_the_framing(tmp_path: Path):
    path = tmp_path / "r.pgrec"
    writer = RecordingWriter(path, pb.RecordingHeader(run_id="abc", dp_size=3))
    for i in range(5):
        writer.write(record(i))
    writer.close()
    data = path.read_bytes()
    header = pb.RecordingHeader(run_id="abc", dp_size=3, magic="prefill-gate/recording", version=1)
    assert data.startswith(MAGIC + encode_varint(header.ByteSize()) + header.SerializeToString())
    with RecordingReader(path) as reader:
        assert reader.header.run_id == "abc"
        assert [r.round for r in reader] == [0, 1, 2, 3, 4]
    assert encode_varint(300) == b"\xac\x02"


def test_a_truncated_file_names_the_offset_of_the_cut_record(tmp_path: Path):
    path = tmp_path / "cut.pgrec"
    writer = RecordingWriter(path, pb.RecordingHeader(run_id="abc"))
    for i in range(3):
        writer.write(record(i))
    writer.close()
    data = path.read_bytes()
    last = record(2).SerializeToString()
    start_of_last = len(data) - len(last) - len(encode_varint(len(last)))
    path.write_bytes(data[:-3])  # a run killed mid-write
    reader = RecordingReader(path)
    got = []
    with pytest.raises(RecordingError, match=f"truncated recording: round record 2 .* byte offset {start_of_last}"):
        for item in reader:
            got.append(item.round)
    assert got == [0, 1]
    assert reader.records_read == 2
    reader.close()
    path.write_bytes(data[: start_of_last + 1] + b"")  # the length prefix itself is complete, the body is not
    with pytest.raises(RecordingError) as cut:
        read_recording(path)
    assert cut.value.offset == start_of_last
    path.write_bytes(MAGIC + b"\x85")  # cut inside the header's length prefix
    with pytest.raises(RecordingError, match="the length of the recording header is cut off"):
        RecordingReader(path)


def test_not_a_recording(tmp_path: Path):
    path = tmp_path / "notes.txt"
    path.write_text("round,counter\n1,2\n")
    with pytest.raises(RecordingError, match="not a prefill-gate recording") as error:
        RecordingReader(path)
    assert error.value.offset == 0 and str(path) in str(error.value)
    path.write_bytes(MAGIC + encode_varint(1 << 40))
    with pytest.raises(RecordingError, match=f"corrupt recording.*byte offset {len(MAGIC)}"):
        RecordingReader(path)
    other = pb.RecordingHeader(magic="something-else", version=1)
    path.write_bytes(MAGIC + encode_varint(other.ByteSize()) + other.SerializeToString())
    with pytest.raises(RecordingError, match="unsupported recording"):
        RecordingReader(path)


def test_a_failing_disk_stops_the_recording_not_the_engine(tmp_path: Path):
    read_end, write_end = os.pipe()
    err = io.StringIO()
    writer = RecordingWriter(f"/dev/fd/{write_end}", pb.RecordingHeader(run_id="x"), flush_every_s=0.0, err=err)
    os.close(read_end)  # nobody reads: the next flush fails with a broken pipe
    for i in range(10):
        writer.tap(record(i))  # never raises
    writer.close()
    os.close(write_end)
    assert isinstance(writer.error, OSError) and writer.records_written < 10
    assert err.getvalue().count("stopped after") == 1
