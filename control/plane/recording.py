"""Round recordings: every `RoundRecord` of a run in one file, for replay and offline analysis.

The file is length-delimited protobuf:

    MAGIC                         8 bytes, b"PGATEREC"
    varint length, RecordingHeader
    varint length, RoundRecord    one per round, in publish order, until the end of the file

The writer appends as rounds happen (buffered, flushed about twice a second), so a recording of a run
that was killed ends with at most one cut-off record; the reader names the byte offset where a file stops
making sense, whether it is truncated, corrupt, or not a recording at all. `RecordingIndex` gives random
access (seek to any round) from the byte offset of every record, without holding the records.
"""

from __future__ import annotations

import bisect
import mmap
import sys
import time
from array import array
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, TextIO, TypeVar

from google.protobuf.message import DecodeError, Message

from prefill_gate.v1 import types_pb2 as pb

MAGIC = b"PGATEREC"
HEADER_MAGIC = "prefill-gate/recording"
VERSION = 1
# No record comes near this; a larger length prefix means the file is corrupt, not that a record is big.
MAX_MESSAGE_BYTES = 64 << 20

M = TypeVar("M", bound=Message)


class RecordingError(ValueError):
    """The file is not a readable recording; `offset` is the byte where reading stopped making sense."""

    def __init__(self, path: str | Path, offset: int, problem: str) -> None:
        super().__init__(f"{path}: {problem} (at byte offset {offset})")
        self.path = str(path)
        self.offset = offset


def encode_varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    if value < 0:
        raise ValueError(f"varint of a negative value {value}")
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def decode_varint(data: bytes | mmap.mmap, offset: int, end: int) -> tuple[int, int] | None:
    """The varint at `offset` and the offset after it; None when it runs past `end`; ValueError when too long."""
    value = shift = 0
    while offset < end:
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7
        if shift >= 64:
            raise ValueError("not a varint")
    return None


def frame(message: bytes) -> bytes:
    """A message with its varint length prefix."""
    return encode_varint(len(message)) + message


class RecordingWriter:
    """Appends round records to a new recording file.

    Use `tap` as a `RoundHub` tap: it never raises, so a full disk stops the recording (with one
    message on `err`) instead of the engine.
    """

    def __init__(
        self, path: str | Path, header: pb.RecordingHeader, *, flush_every_s: float = 0.5, err: TextIO = sys.stderr
    ) -> None:
        self.path = Path(path)
        header.magic = HEADER_MAGIC
        header.version = VERSION
        self._file: BinaryIO | None = self.path.open("wb")
        self._file.write(MAGIC + frame(header.SerializeToString()))
        self._file.flush()
        self.flush_every_s = flush_every_s
        self._last_flush = time.monotonic()
        self.records_written = 0
        self.error: OSError | None = None
        self._err = err

    def write(self, record: pb.RoundRecord) -> None:
        """Append one record; raises OSError from the file system."""
        if self._file is None:
            raise ValueError(f"recording {self.path} is closed")
        self._file.write(frame(record.SerializeToString()))
        now = time.monotonic()
        if now - self._last_flush >= self.flush_every_s:
            self._file.flush()
            self._last_flush = now
        self.records_written += 1

    def tap(self, record: pb.RoundRecord) -> None:
        """`write`, except that a file-system error ends the recording instead of propagating."""
        if self.error is not None or self._file is None:
            return
        try:
            self.write(record)
        except OSError as exc:
            self.error = exc
            print(f"recording to {self.path} stopped after {self.records_written} rounds: {exc}", file=self._err)

    def close(self) -> None:
        """Flush and close; safe to call twice."""
        if self._file is None:
            return
        try:
            self._file.close()
        except OSError as exc:
            self.error = self.error or exc
        self._file = None


class RecordingReader:
    """Reads a recording: `header`, then iterate for the round records in order.

    Raises RecordingError (with the byte offset) on a file that is not a recording, on a truncated file
    and on a record that does not parse.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: BinaryIO = self.path.open("rb")
        self._offset = 0
        try:
            magic = self._file.read(len(MAGIC))
            if magic != MAGIC:
                raise RecordingError(self.path, 0, f"not a prefill-gate recording: it does not start with {MAGIC!r}")
            self._offset = len(MAGIC)
            header = self._next_message(pb.RecordingHeader, "the recording header")
            if header is None:
                raise RecordingError(self.path, self._offset, "truncated recording: the header is missing")
            if header.magic != HEADER_MAGIC or header.version != VERSION:
                raise RecordingError(
                    self.path,
                    len(MAGIC),
                    f"unsupported recording: header says {header.magic!r} version {header.version}, "
                    f"this reader reads {HEADER_MAGIC!r} version {VERSION}",
                )
        except BaseException:
            self._file.close()
            raise
        self.header = header
        self.records_read = 0

    def __iter__(self) -> Iterator[pb.RoundRecord]:
        try:
            while (record := self._next_message(pb.RoundRecord, f"round record {self.records_read}")) is not None:
                self.records_read += 1
                yield record
        finally:
            self.close()  # at the end, on a bad record, or when the consumer stops early

    def _next_message(self, kind: type[M], what: str) -> M | None:
        """The next framed message; None at a clean end of file."""
        start = self._offset
        length = self._read_varint(what)
        if length is None:
            return None
        if length > MAX_MESSAGE_BYTES:
            raise RecordingError(self.path, start, f"corrupt recording: {what} declares {length} bytes")
        body = self._file.read(length)
        if len(body) < length:
            raise RecordingError(
                self.path,
                start,
                f"truncated recording: {what} declares {length} bytes but only {len(body)} remain",
            )
        self._offset += length
        message = kind()
        try:
            message.ParseFromString(body)
        except DecodeError as exc:
            raise RecordingError(self.path, start, f"corrupt recording: {what} does not parse ({exc})") from exc
        return message

    def _read_varint(self, what: str) -> int | None:
        start = self._offset
        value = shift = 0
        while True:
            byte = self._file.read(1)
            if not byte:
                if self._offset == start:
                    return None
                raise RecordingError(self.path, start, f"truncated recording: the length of {what} is cut off")
            self._offset += 1
            value |= (byte[0] & 0x7F) << shift
            if not byte[0] & 0x80:
                return value
            shift += 7
            if shift >= 64:
                raise RecordingError(self.path, start, f"corrupt recording: the length of {what} is not a varint")

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> RecordingReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def read_recording(path: str | Path) -> tuple[pb.RecordingHeader, list[pb.RoundRecord]]:
    """The header and every record of a (small enough) recording; raises RecordingError."""
    with RecordingReader(path) as reader:
        return reader.header, list(reader)


class RecordingIndex:
    """Random access to a recording: the byte offset and round of every whole record, found in one pass.

    The records stay on disk (the file is memory-mapped; the index is two integer arrays), so a recording
    of millions of rounds can be sought anywhere. A file cut short or corrupt after some records indexes
    the records before the damage and keeps the reason in `error`, worded as `RecordingReader` words it.
    Rounds are assumed to ascend (a recording is written in publish order); `index_of` checks that.
    """

    def __init__(self, path: str | Path) -> None:
        with RecordingReader(path) as reader:  # validates the magic and the header
            self.header = reader.header
            start = reader._offset
        self.path = Path(path)
        self.offsets = array("q")
        self.rounds = array("q")
        self.error: RecordingError | None = None
        self._file: BinaryIO | None = self.path.open("rb")
        size = self.path.stat().st_size
        self._map: mmap.mmap | None = (
            mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size > start else None
        )
        self._build(start, size)
        self._ascending = all(a <= b for a, b in zip(self.rounds, self.rounds[1:], strict=False))

    def _build(self, offset: int, size: int) -> None:
        data = self._map
        while data is not None and offset < size:
            what = f"round record {len(self.offsets)}"
            start = offset
            try:
                decoded = decode_varint(data, offset, size)
            except ValueError:
                self.error = RecordingError(self.path, start, f"corrupt recording: {what}'s length is not a varint")
                return
            if decoded is None:
                self.error = RecordingError(self.path, start, f"truncated recording: the length of {what} is cut off")
                return
            length, offset = decoded
            if length > MAX_MESSAGE_BYTES:
                self.error = RecordingError(self.path, start, f"corrupt recording: {what} declares {length} bytes")
                return
            if offset + length > size:
                self.error = RecordingError(
                    self.path, start,
                    f"truncated recording: {what} declares {length} bytes but only {size - offset} remain",
                )
                return
            self.offsets.append(start)
            self.rounds.append(self._round_of(offset, length))
            offset += length

    def _round_of(self, body: int, length: int) -> int:
        """The record's round without parsing it: field 1 (a varint) leads a serialized RoundRecord."""
        data = self._map
        assert data is not None
        if length and data[body] == 0x08:
            decoded = decode_varint(data, body + 1, body + length)
            if decoded is not None:
                return decoded[0]
        message = pb.RoundRecord()  # round 0 (not serialized) or an unusual field order: parse it
        try:
            message.ParseFromString(data[body : body + length])
        except DecodeError:
            return self.rounds[-1] if self.rounds else 0  # reported when the record itself is read
        return message.round

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> pb.RoundRecord:
        """The record at `index` (0-based, in file order); raises IndexError or RecordingError."""
        if not 0 <= index < len(self.offsets):
            raise IndexError(f"record {index} of a recording of {len(self.offsets)}")
        data = self._map
        if data is None:
            raise RecordingError(self.path, 0, "the recording is closed")
        start = self.offsets[index]
        length, offset = decode_varint(data, start, len(data)) or (0, start)  # whole: checked by _build
        message = pb.RoundRecord()
        try:
            message.ParseFromString(data[offset : offset + length])
        except DecodeError as exc:
            problem = f"corrupt recording: round record {index} does not parse ({exc})"
            raise RecordingError(self.path, start, problem) from exc
        return message

    def round_at(self, index: int) -> int:
        """The round of the record at `index`, from the index alone."""
        return self.rounds[index]

    def index_of(self, round_: int) -> int:
        """The index of the last record whose round is <= `round_` (0 when every round is later)."""
        if self._ascending:
            return max(bisect.bisect_right(self.rounds, round_) - 1, 0)
        best = 0
        for index, value in enumerate(self.rounds):
            if value <= round_:
                best = index
        return best

    def close(self) -> None:
        """Release the mapping and the file; safe to call twice."""
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> RecordingIndex:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
