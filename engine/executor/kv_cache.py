"""The paged KV cache of one rank, and its host tier for retracted requests.

The cache mirrors the scheduler's `DevicePool` exactly: page `p` holds KV positions
`[i * page_size, (i + 1) * page_size)` of the request whose `pages[i] == p`. One extra page past the
pool (`scratch_page`) absorbs the writes of padding rows in a bucketed decode step, so padding never
touches a page the scheduler handed out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(slots=True)
class HostImage:
    """A retracted request's KV on the host: [layers, num_tokens, heads, head_dim] each."""

    keys: Tensor
    values: Tensor

    @property
    def num_tokens(self) -> int:
        """KV entries held."""
        return int(self.keys.shape[1])


class PagedKVCache:
    """Keys and values of every layer in `pages + 1` pages of `page_size` slots (the last is scratch)."""

    def __init__(
        self,
        layers: int,
        pages: int,
        page_size: int,
        heads: int,
        head_dim: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float64,
    ) -> None:
        self.pages = pages
        self.page_size = page_size
        self.scratch_page = pages
        shape = (layers, (pages + 1) * page_size, heads, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self._host: dict[str, HostImage] = {}

    # -- addressing ----------------------------------------------------------------------------------

    def slots(self, pages: Sequence[int], start: int, count: int) -> Tensor:
        """Flat slot ids of KV positions [start, start + count) of a request holding `pages`."""
        if start < 0 or (start + count) > len(pages) * self.page_size:
            raise ValueError(
                f"KV positions [{start}, {start + count}) do not fit in {len(pages)} pages of {self.page_size}"
            )
        positions = torch.arange(start, start + count)
        table = torch.tensor(list(pages), dtype=torch.int64)
        return (table[positions // self.page_size] * self.page_size + positions % self.page_size).to(self.k.device)

    def write(self, layer: int, slots: Tensor, keys: Tensor, values: Tensor) -> None:
        """Store keys/values [T, heads, head_dim] of one layer at `slots` [T]."""
        self.k[layer].index_copy_(0, slots, keys)
        self.v[layer].index_copy_(0, slots, values)

    def read(self, layer: int, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of one layer at `slots`, in slot order."""
        return self.k[layer][slots], self.v[layer][slots]

    # -- the host tier ---------------------------------------------------------------------------------

    def offload(self, rid: str, pages: Sequence[int], num_tokens: int) -> None:
        """Copy the first `num_tokens` KV entries held in `pages` to a host image keyed by `rid`."""
        slots = self.slots(pages, 0, num_tokens)
        self._host[rid] = HostImage(self.k[:, slots].to("cpu"), self.v[:, slots].to("cpu"))

    def restore(self, rid: str, pages: Sequence[int], num_tokens: int) -> None:
        """Copy `rid`'s host image into `pages` and drop the image; raises KeyError/ValueError on a mismatch."""
        image = self._host.get(rid)
        if image is None:
            raise KeyError(f"request {rid}: restore without a host image (was it offloaded?)")
        if image.num_tokens != num_tokens:
            raise ValueError(f"request {rid}: restore of {num_tokens} tokens, host image holds {image.num_tokens}")
        slots = self.slots(pages, 0, num_tokens)
        self.k[:, slots] = image.keys.to(self.k.device)
        self.v[:, slots] = image.values.to(self.v.device)
        del self._host[rid]

    def drop(self, rid: str) -> None:
        """Forget `rid`'s host image, if any."""
        self._host.pop(rid, None)

    @property
    def host_images(self) -> int:
        """Requests whose KV is held on the host."""
        return len(self._host)
