"""Attention rows and head writes at the supervised positions only (App. I.5).

The student's pooled attention is never read from full attention matrices.  The input hidden
state of every pooled layer is captured during the (gradient-checkpointed, sdpa) forward; at the
supervised rows only, the layer's own q/k/v projections, q/k RMSNorms and rotary embeddings
recompute the attention probabilities of the pooled heads:

    alpha^h_{q,j} = softmax_j( <RoPE(norm_q(W_Q^h x_q)), RoPE(norm_k(W_K^{g(h)} x_j))> / sqrt(d) ),  j <= q

and the heads' outputs z_h = sum_j alpha^h_{q,j} W_V^{g(h)} x_j and writes z_h W_O^h are rebuilt
from the same rows (for c, Eq. D).  Each layer's recompute runs inside its own checkpoint, in row
chunks, so only [rows, buckets] survives to the backward pass.  SmolLM3's NoPE layers skip RoPE.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from mistill.distill.objective import pool_bucket_attention


def decoder_layers(model) -> Sequence[torch.nn.Module]:
    return model.model.layers


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


class LayerInputCapture:
    """Forward pre-hooks that keep the input hidden states (and rotary tables) of chosen layers.

    Only the first call per layer within `capturing()` is kept: under gradient checkpointing the
    layer runs again during backward, and that recompute must not overwrite the capture.
    """

    def __init__(self, model, layers: Sequence[int]):
        self.inputs: dict[int, torch.Tensor] = {}
        self.rotary: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.final_input: torch.Tensor | None = None
        self._active = False
        self._handles = []
        for idx in sorted(set(layers)):
            self._handles.append(decoder_layers(model)[idx].register_forward_pre_hook(
                self._make_hook(idx), with_kwargs=True))
        self._handles.append(model.model.norm.register_forward_pre_hook(self._final_hook))

    def _make_hook(self, idx: int):
        def hook(module, args, kwargs):
            if self._active and idx not in self.inputs:
                self.inputs[idx] = args[0] if args else kwargs["hidden_states"]
                self.rotary[idx] = kwargs.get("position_embeddings")
        return hook

    def _final_hook(self, module, args):
        if self._active and self.final_input is None:
            self.final_input = args[0]

    def start(self) -> None:
        self.inputs.clear()
        self.rotary.clear()
        self.final_input = None
        self._active = True

    def stop(self) -> None:
        self._active = False

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def attention_rows(layer: torch.nn.Module, hidden_in: torch.Tensor, rotary, rows: torch.Tensor,
                   heads: torch.Tensor, *, with_writes: bool = False):
    """Probabilities of `heads` at `rows` over all keys of one sequence, and optionally their writes.

    hidden_in: [T, D] the layer's input (before input_layernorm); rotary: (cos, sin) [T, d] or
    None; rows: [R] long; heads: [h] long.  Returns probs [h, R, T] (float32, zero after each
    row) and, with_writes, writes [R, h, D] = z_h W_O^h.
    """
    attn = layer.self_attn
    cfg = attn.config
    d = attn.head_dim
    n_heads = cfg.num_attention_heads
    group = n_heads // cfg.num_key_value_heads
    x = layer.input_layernorm(hidden_in)
    xq = x.index_select(0, rows)
    q = attn.q_proj(xq).view(len(rows), n_heads, d).index_select(1, heads)
    kv_heads = torch.div(heads, group, rounding_mode="floor")
    k = attn.k_proj(x).view(x.shape[0], -1, d)
    if hasattr(attn, "q_norm"):
        q = attn.q_norm(q)
        k = attn.k_norm(k)
    k = k.index_select(1, kv_heads)
    if rotary is not None and getattr(attn, "use_rope", True):
        cos, sin = rotary
        cos, sin = cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])
        q = _rope(q, cos.index_select(0, rows), sin.index_select(0, rows))
        k = _rope(k, cos, sin)
    scores = torch.einsum("rhd,thd->hrt", q.float(), k.float()) * attn.scaling
    keys = torch.arange(x.shape[0], device=x.device)
    scores = scores.masked_fill(keys[None, None, :] > rows[None, :, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if not with_writes:
        return probs, None
    v = attn.v_proj(x).view(x.shape[0], -1, d).index_select(1, kv_heads)
    z = torch.einsum("hrt,thd->rhd", probs, v.float())
    w_o = attn.o_proj.weight.view(attn.o_proj.weight.shape[0], n_heads, d).index_select(1, heads)
    writes = torch.einsum("rhd,Dhd->rhD", z, w_o.float())
    return probs, writes


@dataclass
class LayerPool:
    """The heads of one pool inside one layer, with their pool weights."""

    layer: int
    heads: torch.Tensor    # [h] long
    weights: torch.Tensor  # [h] float (w_h of the whole pool, not renormalised per layer)

    def to_device(self, device) -> "LayerPool":
        return LayerPool(self.layer, self.heads.to(device), self.weights.to(device))


def pooled_rows(model, capture: LayerInputCapture, layer_pools: Sequence[LayerPool], rows: torch.Tensor,
                bucket_index: torch.Tensor, n_buckets: int, *, with_writes: bool = False,
                row_chunk: int = 256, use_checkpoint: bool = True):
    """Eq. A over a pool spread across layers: sum over layers of the layer's heads' pooled rows.

    bucket_index: [R, T] (per-row carving) or [T].  Returns pooled [R, n_buckets] and, with_writes,
    the per-head writes [R, H_pool, D] in the order of `layer_pools` (layer by layer).
    """
    total = None
    writes_all = []
    for lp in layer_pools:
        hidden = capture.inputs[lp.layer][0]
        rotary = capture.rotary.get(lp.layer)
        rot = None if rotary is None else (rotary[0][0], rotary[1][0])
        layer = decoder_layers(model)[lp.layer]
        chunks_pooled, chunks_writes = [], []
        for start in range(0, len(rows), row_chunk):
            r = rows[start:start + row_chunk]
            bidx = bucket_index[start:start + row_chunk] if bucket_index.dim() == 2 else bucket_index

            def run(h, r=r, bidx=bidx, layer=layer, lp=lp, rot=rot):
                probs, writes = attention_rows(layer, h, rot, r, lp.heads, with_writes=with_writes)
                pooled = pool_bucket_attention(probs, bidx, lp.weights.float(), n_buckets)
                return (pooled, writes) if with_writes else (pooled,)

            out = checkpoint(run, hidden, use_reentrant=False) if use_checkpoint and torch.is_grad_enabled() \
                else run(hidden)
            chunks_pooled.append(out[0])
            if with_writes:
                chunks_writes.append(out[1])
        pooled = torch.cat(chunks_pooled, 0)
        total = pooled if total is None else total + pooled
        if with_writes:
            writes_all.append(torch.cat(chunks_writes, 0))
    writes = torch.cat(writes_all, 1) if with_writes and writes_all else None
    return total, writes
