"""The Device KV pool of one rank: fixed-size pages, allocated for prefill chunks and decode growth."""

from __future__ import annotations

from collections.abc import Iterable


class PoolError(RuntimeError):
    """A page accounting bug: allocation beyond capacity, or a double free."""


def pages_for(tokens: int, page_size: int) -> int:
    """Pages that hold `tokens` KV entries."""
    return -(-tokens // page_size)


class DevicePool:
    """`usable` pages; a page is either free or held by exactly one request."""

    def __init__(self, usable: int, page_size: int) -> None:
        if usable < 1 or page_size < 1:
            raise ValueError(f"pool needs usable >= 1 and page_size >= 1, got {usable}, {page_size}")
        self.usable = usable
        self.page_size = page_size
        # Pop from the end: low page ids are handed out first, which keeps traces readable.
        self._free = list(range(usable - 1, -1, -1))
        self._held = bytearray(usable)

    @property
    def free(self) -> int:
        """Pages nobody holds."""
        return len(self._free)

    @property
    def used(self) -> int:
        """Pages in use or reserved."""
        return self.usable - len(self._free)

    @property
    def occupancy(self) -> float:
        """Used over usable pages, 0..1."""
        return self.used / self.usable

    def allocate(self, count: int) -> list[int]:
        """Take `count` pages; raises PoolError when fewer are free."""
        if count > len(self._free) or count < 0:
            raise PoolError(f"cannot allocate {count} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(count)]
        for page in pages:
            self._held[page] = 1
        return pages

    def release(self, pages: Iterable[int]) -> None:
        """Give pages back; raises PoolError on a page that is not held."""
        for page in pages:
            if not self._held[page]:
                raise PoolError(f"page {page} freed twice")
            self._held[page] = 0
            self._free.append(page)
