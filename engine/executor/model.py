"""The torch executor's model: a small MoE transformer, its weights, and a single-process reference.

Architecture (pre-norm, no learned norm weights): token embedding, then `model_layers` blocks of
RoPE multi-head attention and a routed-expert FFN (softmax router, top-k, weights renormalised over
the chosen k, SwiGLU experts), then a final norm and the LM head. Sampling is greedy (argmax).

Weights come from `args.seed` alone: every rank draws the full weight set in the same order from one
CPU generator and keeps the non-expert weights and its own expert shard, so ranks agree without a
broadcast and the reference (which keeps every expert) computes the same function.

Numerics: on CPU the model computes in float64. The distributed forward and the reference reach the
same values through different batch shapes (paged vs contiguous KV, experts run on gathered tokens);
float32 would leave last-bit differences large enough to flip an argmax now and then, float64 makes
that practically impossible, so tests can demand identical greedy tokens. On CUDA the model computes
in bfloat16 (DeepEP's dispatch takes bfloat16), where tokens are not expected to match the reference bit
for bit.

Prompts given only as lengths (workloads without token ids) are derived by `synthetic_prompt_tokens`
from `(seed, rid, position)`, so the executor, the reference and any test derive the same prompt.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from engine.config import ServerArgs

ROPE_BASE = 10000.0
NORM_EPS = 1e-6


def model_dtype(device: str) -> torch.dtype:
    """float64 on CPU (exact agreement with the reference), bfloat16 on CUDA."""
    return torch.float64 if device == "cpu" else torch.bfloat16


def synthetic_prompt_tokens(seed: int, rid: str, start: int, count: int, vocab: int) -> list[int]:
    """Prompt token ids at positions [start, start + count) of request `rid` when no ids were given.

    A splitmix64 hash of a per-request key and the position: deterministic across processes and
    independent of how the prompt is chunked.
    """
    key = int.from_bytes(hashlib.blake2b(f"{seed}/{rid}".encode(), digest_size=8).digest(), "little")
    with np.errstate(over="ignore"):
        z = np.uint64(key) + np.arange(start, start + count, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return [int(v) for v in z % np.uint64(vocab)]


@dataclass(slots=True)
class LayerWeights:
    """One transformer block; expert tensors hold only this rank's shard."""

    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    router: Tensor  # [H, E] over all experts: every rank routes every token
    w_gate: Tensor  # [E_local, H, F]
    w_up: Tensor  # [E_local, H, F]
    w_down: Tensor  # [E_local, F, H]


@dataclass(slots=True)
class ModelWeights:
    """All weights of one rank; experts [expert_start, expert_start + experts_local) are local."""

    embed: Tensor
    layers: list[LayerWeights]
    lm_head: Tensor
    expert_start: int
    experts_local: int


def build_weights(
    args: ServerArgs,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float64,
    expert_range: tuple[int, int] | None = None,
) -> ModelWeights:
    """Draw every weight from `args.seed` in a fixed order; keep the experts in `expert_range` (all if None)."""
    hidden, ffn, experts, vocab = args.model_hidden, args.model_ffn, args.model_experts, args.model_vocab
    start, end = expert_range if expert_range is not None else (0, experts)
    if not 0 <= start < end <= experts:
        raise ValueError(f"expert range [{start}, {end}) is not inside [0, {experts})")
    generator = torch.Generator().manual_seed(args.seed)

    def draw(*shape: int, fan_in: int) -> Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64) * fan_in**-0.5

    def place(t: Tensor) -> Tensor:
        return t.to(device=device, dtype=dtype).contiguous()

    embed = place(draw(vocab, hidden, fan_in=1))
    layers = []
    for _ in range(args.model_layers):
        wq, wk, wv, wo = (draw(hidden, hidden, fan_in=hidden) for _ in range(4))
        router = draw(hidden, experts, fan_in=hidden)
        # Every rank draws the full expert set so the generator stays in step, then keeps its shard.
        w_gate = draw(experts, hidden, ffn, fan_in=hidden)
        w_up = draw(experts, hidden, ffn, fan_in=hidden)
        w_down = draw(experts, ffn, hidden, fan_in=ffn)
        layers.append(
            LayerWeights(
                wq=place(wq),
                wk=place(wk),
                wv=place(wv),
                wo=place(wo),
                router=place(router),
                w_gate=place(w_gate[start:end]),
                w_up=place(w_up[start:end]),
                w_down=place(w_down[start:end]),
            )
        )
    lm_head = place(draw(hidden, vocab, fan_in=hidden))
    return ModelWeights(embed=embed, layers=layers, lm_head=lm_head, expert_start=start, experts_local=end - start)


# -- primitives ---------------------------------------------------------------------------------------


def rms_norm(x: Tensor) -> Tensor:
    """Root-mean-square normalisation over the last dimension (no learned scale)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS)


def rope(x: Tensor, positions: Tensor) -> Tensor:
    """Rotary position embedding of `x` [T, heads, head_dim] at absolute `positions` [T]."""
    half = x.shape[-1] // 2
    inv_freq = ROPE_BASE ** -(torch.arange(half, device=x.device, dtype=x.dtype) / half)
    angles = positions.to(x.dtype)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def attend(q: Tensor, k: Tensor, v: Tensor, q_positions: Tensor) -> Tensor:
    """Causal attention of queries [n, h, d] at `q_positions` over keys/values [L, h, d] at positions 0..L-1."""
    scores = torch.einsum("nhd,lhd->hnl", q, k) * q.shape[-1] ** -0.5
    future = torch.arange(k.shape[0], device=q.device)[None, :] > q_positions[:, None]
    probs = scores.masked_fill(future[None], float("-inf")).softmax(-1)
    return torch.einsum("hnl,lhd->nhd", probs, v)


def attend_paged(
    q: Tensor, k_pool: Tensor, v_pool: Tensor, block_table: Tensor, lengths: Tensor, page_size: int
) -> Tensor:
    """One query per row [B, h, d] over its first `lengths[b]` KV entries, read through `block_table` [B, P].

    Static shapes only (no data-dependent sizes), so the decode step can be captured in a CUDA graph.
    """
    batch, pages = block_table.shape
    offsets = torch.arange(page_size, device=q.device)
    slots = (block_table[:, :, None] * page_size + offsets).reshape(batch, pages * page_size)
    keys, values = k_pool[slots], v_pool[slots]  # [B, J, h, d]
    scores = torch.einsum("bhd,bjhd->bhj", q, keys) * q.shape[-1] ** -0.5
    beyond = torch.arange(pages * page_size, device=q.device)[None, :] >= lengths[:, None]
    probs = scores.masked_fill(beyond[:, None, :], float("-inf")).softmax(-1)
    return torch.einsum("bhj,bjhd->bhd", probs, values)


def combine_in_slot_order(pair_out: Tensor, topk_weights: Tensor) -> Tensor:
    """Weighted sum of the top-k expert outputs [T, k, H], always slot 0 first, then 1, ...

    One fixed summation order on every path (reference, normal and low-latency legs) keeps the result
    independent of which rank computed which contribution.
    """
    out = pair_out[:, 0] * topk_weights[:, 0:1]
    for slot in range(1, pair_out.shape[1]):
        out = out + pair_out[:, slot] * topk_weights[:, slot : slot + 1]
    return out


class LayerExperts:
    """One layer's local experts (SwiGLU), in the three shapes the dispatch legs call them with.

    Local expert ids run 0..experts_local-1; a negative id means "no expert here" and yields zeros.
    """

    def __init__(self, weights: LayerWeights, count: int) -> None:
        self.w = weights
        self.count = count

    def _run(self, local: int, x: Tensor) -> Tensor:
        w = self.w
        return (torch.nn.functional.silu(x @ w.w_gate[local]) * (x @ w.w_up[local])) @ w.w_down[local]

    def by_id(self, x: Tensor, ids: Tensor) -> Tensor:
        """Rows [R, H] with ids [R]: each expert runs on its own rows only (eager; data-dependent shapes)."""
        out = torch.zeros_like(x)
        for local in range(self.count):
            rows = (ids == local).nonzero().squeeze(1)
            if rows.numel():
                out[rows] = self._run(local, x[rows])
        return out

    def masked(self, x: Tensor, ids: Tensor) -> Tensor:
        """Like `by_id` with static shapes (every expert on every row, selected by mask): CUDA-graph safe."""
        out = torch.zeros_like(x)
        for local in range(self.count):
            out = torch.where((ids == local)[:, None], self._run(local, x), out)
        return out

    def grouped(self, x: Tensor) -> Tensor:
        """Rows already grouped per expert [experts_local, M, H] (DeepEP's low-latency layout)."""
        w = self.w
        return torch.bmm(torch.nn.functional.silu(torch.bmm(x, w.w_gate)) * torch.bmm(x, w.w_up), w.w_down)


class MoEModel:
    """The model's per-layer pieces over one rank's weights; the executor and the reference compose them."""

    def __init__(self, weights: ModelWeights, args: ServerArgs) -> None:
        if (args.model_hidden // args.model_heads) % 2:
            raise ValueError(
                f"--model-hidden / --model-heads ({args.model_hidden // args.model_heads}) must be even for RoPE"
            )
        self.w = weights
        self.heads = args.model_heads
        self.head_dim = args.model_hidden // args.model_heads
        self.top_k = args.model_top_k
        self.num_experts = args.model_experts
        self.layers = len(weights.layers)

    def embed(self, ids: Tensor) -> Tensor:
        """Token embeddings [T, H]."""
        return self.w.embed[ids]

    def qkv(self, layer: int, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys (both with RoPE) and values [T, heads, head_dim] of the normed residual."""
        w = self.w.layers[layer]
        xn = rms_norm(x)
        shape = (x.shape[0], self.heads, self.head_dim)
        q = rope((xn @ w.wq).view(shape), positions)
        k = rope((xn @ w.wk).view(shape), positions)
        return q, k, (xn @ w.wv).view(shape)

    def attn_out(self, layer: int, attn: Tensor) -> Tensor:
        """Output projection of the attention [T, heads, head_dim] -> [T, H]."""
        return attn.reshape(attn.shape[0], self.heads * self.head_dim) @ self.w.layers[layer].wo

    def route(self, layer: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Normed input [T, H], top-k expert ids [T, k] (int64, global) and weights [T, k] summing to 1."""
        hn = rms_norm(x)
        probs = (hn @ self.w.layers[layer].router).softmax(-1)
        weights, idx = probs.topk(self.top_k, dim=-1)
        return hn, idx, weights / weights.sum(-1, keepdim=True)

    def experts(self, layer: int) -> LayerExperts:
        """This rank's experts of `layer`."""
        return LayerExperts(self.w.layers[layer], self.w.experts_local)

    def logits(self, x: Tensor) -> Tensor:
        """Vocabulary logits [T, V] of the final residual."""
        return rms_norm(x) @ self.w.lm_head


# -- the single-process reference ---------------------------------------------------------------------


def reference_generate(
    args: ServerArgs,
    prompts: Mapping[str, Sequence[int] | None],
    output_lens: Mapping[str, int],
    prompt_lens: Mapping[str, int] | None = None,
) -> dict[str, list[int]]:
    """Greedy tokens per request from the full model in one process: every expert local, contiguous KV,
    no dispatcher, one request at a time, the whole prompt in one pass.

    A prompt given as None is derived with `synthetic_prompt_tokens` (then `prompt_lens` names its length).
    """
    model = MoEModel(build_weights(args, dtype=model_dtype("cpu")), args)
    out: dict[str, list[int]] = {}
    with torch.inference_mode():
        for rid, prompt in prompts.items():
            if prompt is None:
                if prompt_lens is None:
                    raise ValueError(f"request {rid}: no prompt tokens and no prompt length")
                prompt = synthetic_prompt_tokens(args.seed, rid, 0, prompt_lens[rid], args.model_vocab)
            out[rid] = _generate_one(model, list(prompt), output_lens[rid])
    return out


def _generate_one(model: MoEModel, prompt: list[int], output_len: int) -> list[int]:
    keys: list[Tensor | None] = [None] * model.layers
    values: list[Tensor | None] = [None] * model.layers
    tokens: list[int] = []
    feed, start = prompt, 0
    for _ in range(output_len):
        ids = torch.tensor(feed, dtype=torch.int64)
        positions = torch.arange(start, start + len(feed))
        x = model.embed(ids)
        for layer in range(model.layers):
            q, k, v = model.qkv(layer, x, positions)
            past_k, past_v = keys[layer], values[layer]
            keys[layer] = k if past_k is None else torch.cat((past_k, k))
            values[layer] = v if past_v is None else torch.cat((past_v, v))
            x = x + model.attn_out(layer, attend(q, keys[layer], values[layer], positions))
            hn, idx, weights = model.route(layer, x)
            pair_out = model.experts(layer).by_id(hn.repeat_interleave(model.top_k, 0), idx.reshape(-1))
            x = x + combine_in_slot_order(pair_out.view(len(feed), model.top_k, -1), weights)
        token = int(model.logits(x[-1:]).argmax(-1).item())
        tokens.append(token)
        start += len(feed)
        feed = [token]
    return tokens
