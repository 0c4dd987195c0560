"""The all-gather seam: the one collective of every round (R2).

`TorchGroup` is the real thing: one process per rank, `torch.distributed` (gloo on CPU, NCCL on
CUDA), joined through torch's own rendezvous: `tcp://HOST:PORT` (one node: rank 0 hosts the store),
`env://` (torchrun: MASTER_ADDR/MASTER_PORT, its agent hosts the store) or `store://HOST:PORT/PREFIX`
(several nodes: node 0's controller hosts a TCPStore and every rank is its client).

`LocalGroup` steps every rank of a group inside one process, for the simulator and fast tests: the
lockstep driver hands it every rank's row and it returns the same gathered tuple to all. Both count
gathers, so a test (and the engine itself) can check that a round gathered exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol
from urllib.parse import urlparse

from engine.rows import ROW_WIDTH, Row, decode_rows


class CollectiveError(RuntimeError):
    """A collective failed: a peer died, hung past the timeout, or the group diverged."""


class Group(Protocol):
    """What a rank needs of its group."""

    rank: int
    size: int
    gathers: int

    def all_gather(self, row: Row) -> tuple[Row, ...]:
        """Every rank's row of this round, in rank order, identical on every rank."""
        ...


class LocalGroup:
    """All ranks of a group in one process. The lockstep driver gathers for all of them at once."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"group size must be >= 1, got {size}")
        self.size = size
        self.gathers = 0

    def gather_lockstep(self, rows: Sequence[Row]) -> tuple[Row, ...]:
        """Gather one round: exactly one row from each rank, in rank order."""
        if len(rows) != self.size:
            raise CollectiveError(f"lockstep gather got {len(rows)} rows for {self.size} ranks")
        for index, row in enumerate(rows):
            if row.rank != index:
                raise CollectiveError(f"lockstep gather: row {index} was published by rank {row.rank}")
        self.gathers += 1
        return tuple(rows)


class TorchGroup:
    """One rank of a `torch.distributed` group; gloo on CPU, NCCL on CUDA."""

    def __init__(
        self,
        rank: int,
        size: int,
        init_method: str,
        backend: str = "gloo",
        timeout_s: float = 60.0,
        device: str = "cpu",
    ) -> None:
        import torch
        import torch.distributed as dist

        self._torch = torch
        self._dist = dist
        self.rank = rank
        self.size = size
        self.gathers = 0
        self.device = torch.device(device if backend != "nccl" else f"cuda:{torch.cuda.current_device()}")
        join_group(dist, init_method, rank, size, backend, timedelta(seconds=timeout_s))
        self._send = torch.zeros(ROW_WIDTH, dtype=torch.int64, device=self.device)
        self._recv = torch.zeros(ROW_WIDTH * size, dtype=torch.int64, device=self.device)

    def all_gather(self, row: Row) -> tuple[Row, ...]:
        # Every rank calls this exactly once per round, idle or not: a rank that skipped it would
        # leave its peers waiting in the same collective until the timeout.
        self._send.copy_(self._torch.tensor(row.encode(), dtype=self._torch.int64))
        try:
            self._dist.all_gather_single(self._recv, self._send)
        except Exception as exc:  # gloo raises RuntimeError subclasses for dead or slow peers
            raise CollectiveError(f"rank {self.rank}: round all-gather failed: {exc}") from exc
        self.gathers += 1
        return decode_rows(self._recv.tolist(), self.size)

    @property
    def process_group(self) -> object:
        """The default process group (the executor's MoE collectives use the same group)."""
        return self._dist.group.WORLD

    def close(self) -> None:
        """Leave the group; safe to call twice."""
        if self._dist.is_initialized():
            self._dist.destroy_process_group()


STORE_SCHEME = "store://"


def join_group(dist: Any, init_method: str, rank: int, size: int, backend: str, timeout: timedelta) -> None:
    """`init_process_group` through `init_method`; `store://` joins a TCPStore hosted elsewhere as a client."""
    if not init_method.startswith(STORE_SCHEME):
        dist.init_process_group(backend=backend, init_method=init_method, rank=rank, world_size=size, timeout=timeout)
        return
    where = urlparse(init_method)
    if where.hostname is None or where.port is None:
        raise ValueError(f"expected store://HOST:PORT/PREFIX, got {init_method!r}")
    client = dist.TCPStore(where.hostname, where.port, is_master=False, timeout=timeout)
    store = dist.PrefixStore(where.path.strip("/") or "ranks", client)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=size, timeout=timeout)
