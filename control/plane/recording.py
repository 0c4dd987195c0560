"""Round recordings: every `RoundRecord` of a run in one file, for replay and offline analysis.

The file is length-delimited protobuf:

    MAGIC                         8 bytes, b"PGATEREC"
    varint length, RecordingHeader
    varint length, RoundRecord    one per round, in publish order, until the end of the file

The writer appends as rounds happen (buffered, flushed about twice a second), so a recording of a run
that was killed ends with at most one cut-off record; the reader names the byte offset where a file stops
making sense, whether it is truncated, corrupt, or not a recording at all.
"""

from __future__ import annotations

import sys
import time
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
