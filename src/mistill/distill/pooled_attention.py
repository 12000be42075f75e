"""Attention rows and head writes at the supervised positions only (App. I.5).

The student's pooled attention is never read from full attention matrices.  Inside each pooled
layer's own (gradient-checkpointed, sdpa) forward, at the supervised rows only, the layer's own
q/k/v projections, q/k RMSNorms and rotary embeddings recompute the attention probabilities of the
pooled heads from the layer's input hidden state:

    alpha^h_{q,j} = softmax_j( <RoPE(norm_q(W_Q^h x_q)), RoPE(norm_k(W_K^{g(h)} x_j))> / sqrt(d) ),  j <= q

and the heads' outputs z_h = sum_j alpha^h_{q,j} W_V^{g(h)} x_j and writes z_h W_O^h are rebuilt
from the same rows (for c, Eq. D).  Only [rows, buckets] and the writes survive the forward; the
rest is recomputed with the layer in backward (`SupervisedRows`).  SmolLM3's NoPE layers skip RoPE.
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


@dataclass
class LayerKeys:
    """One layer's normalised input, rotated keys and values over the whole sequence (computed once
    per layer and shared by every request and row chunk)."""

    x: torch.Tensor        # [T, D] input_layernorm(hidden)
    k: torch.Tensor        # [T, KV, d] after k_norm and RoPE
    v: torch.Tensor        # [T, KV, d]
    rotary: tuple | None   # (cos, sin) [T, d] or None (NoPE layer)


def layer_keys(layer: torch.nn.Module, hidden_in: torch.Tensor, rotary) -> LayerKeys:
    attn = layer.self_attn
    d = attn.head_dim
    x = layer.input_layernorm(hidden_in)
    k = attn.k_proj(x).view(x.shape[0], -1, d)
    if hasattr(attn, "k_norm"):
        k = attn.k_norm(k)
    v = attn.v_proj(x).view(x.shape[0], -1, d)
    use_rope = rotary is not None and getattr(attn, "use_rope", True)
    if use_rope:
        cos, sin = rotary
        rotary = (cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1]))
        k = _rope(k, *rotary)
    return LayerKeys(x, k, v, rotary if use_rope else None)


def rows_from_keys(layer: torch.nn.Module, x_rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotary,
                   rows: torch.Tensor, heads: torch.Tensor, *, with_writes: bool = False):
    """Attention of `heads` at `rows` given the layer's keys (k, v already restricted to the heads'
    key-value groups, [T, h, d]) and the rows' normalised inputs x_rows [R, D]."""
    attn = layer.self_attn
    n_heads = attn.config.num_attention_heads
    d = attn.head_dim
    q = attn.q_proj(x_rows).view(len(rows), n_heads, d).index_select(1, heads)
    if hasattr(attn, "q_norm"):
        q = attn.q_norm(q)
    if rotary is not None:
        q = _rope(q, rotary[0].index_select(0, rows), rotary[1].index_select(0, rows))
    scores = torch.einsum("rhd,thd->hrt", q.float(), k.float()) * attn.scaling
    keys = torch.arange(k.shape[0], device=k.device)
    scores = scores.masked_fill(keys[None, None, :] > rows[None, :, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if not with_writes:
        return probs, None
    z = torch.einsum("hrt,thd->rhd", probs, v.float())
    w_o = attn.o_proj.weight.view(attn.o_proj.weight.shape[0], n_heads, d).index_select(1, heads)
    return probs, torch.einsum("rhd,Dhd->rhD", z, w_o.float())


def kv_groups(layer: torch.nn.Module, heads: torch.Tensor) -> torch.Tensor:
    """The key-value head of each query head (GQA)."""
    cfg = layer.self_attn.config
    return torch.div(heads, cfg.num_attention_heads // cfg.num_key_value_heads, rounding_mode="floor")


def attention_rows(layer: torch.nn.Module, hidden_in: torch.Tensor, rotary, rows: torch.Tensor,
                   heads: torch.Tensor, *, with_writes: bool = False):
    """Probabilities of `heads` at `rows` over all keys of one sequence, and optionally their writes.

    hidden_in: [T, D] the layer's input (before input_layernorm); rotary: (cos, sin) [T, d] or
    None; rows: [R] long; heads: [h] long.  Returns probs [h, R, T] (float32, zero after each
    row) and, with_writes, writes [R, h, D] = z_h W_O^h.
    """
    keys = layer_keys(layer, hidden_in, rotary)
    groups = kv_groups(layer, heads)
    return rows_from_keys(layer, keys.x.index_select(0, rows), keys.k.index_select(1, groups),
                          keys.v.index_select(1, groups), keys.rotary, rows, heads, with_writes=with_writes)


@dataclass
class LayerPool:
    """The heads of one pool inside one layer, with their pool weights."""

    layer: int
    heads: torch.Tensor    # [h] long
    weights: torch.Tensor  # [h] float (w_h of the whole pool, not renormalised per layer)

    def to_device(self, device) -> LayerPool:
        return LayerPool(self.layer, self.heads.to(device), self.weights.to(device))


@dataclass
class RowRequest:
    """One kind of supervised row: its positions, bucket index and pool (already on the device)."""

    key: str                      # "P1" | "P2" | "P2C" | "window"
    rows: torch.Tensor            # [R] long
    bucket_index: torch.Tensor    # [R, T] (carved per row) or [T]
    layer_pools: list[LayerPool]
    with_writes: bool = False


def _batch_row(table: torch.Tensor, row: int) -> torch.Tensor:
    """Row `row` of a [B, T, d] rotary table; a table of batch size one (positions shared) serves every row."""
    return table[row if table.shape[0] > 1 else 0]


@dataclass
class RowPlan:
    """One sequence's row requests in a (possibly padded) batch: its requests, its bucket count and
    its real length (None: the whole padded width, a batch of one)."""

    requests: list[RowRequest]
    n_buckets: int
    length: int | None = None


class SupervisedRows:
    """Forward pre-hooks that compute the supervised rows inside each pooled layer's own forward.

    Running inside the decoder layer's call puts the computation inside the layer's gradient
    checkpoint: nothing of it is kept after the forward, it is recomputed with the layer during
    backward, and its gradient reaches the layer input exactly when the layer's own backward runs,
    so no [T, D] gradient waits across layers.  Row chunks get their own nested checkpoint, so a
    recompute holds one chunk's [heads, rows, T] probabilities at a time (only for requests whose
probabilities exceed `nested_min_elements`; smaller ones are simply kept for the recompute).  The
layer's normalised input, keys and values are computed once per layer and shared by all rows.  The hook also runs during
    the backward recompute (the checkpoint needs the same saved tensors); only the forward's results
    are kept (`recording`).  The final norm's input (the residual stream at every position) is
    kept for the margin direction of Eq. D.

    A forward may carry several notes, right-padded to the longest (`arm_rows`): each batch row is
    read over its own length only, so its keys, probabilities and buckets are the ones its own
    forward would give (causal attention keeps the padding out of every real position).
    """

    def __init__(self, model, layers: Sequence[int], *, row_chunk: int = 256, nested_checkpoint: bool = True,
                 nested_min_elements: int = 1 << 27):
        self.row_chunk = row_chunk
        self.nested_checkpoint = nested_checkpoint
        self.nested_min_elements = nested_min_elements
        self.plans: list[RowPlan] = []
        self.results: list[dict[int, dict[str, tuple]]] = []
        self.final_input: torch.Tensor | None = None
        self.recording = False
        self._handles = [decoder_layers(model)[i].register_forward_pre_hook(self._make_hook(i), with_kwargs=True)
                         for i in sorted(set(layers))]
        self._handles.append(model.model.norm.register_forward_pre_hook(self._final_hook))

    @property
    def requests(self) -> list[RowRequest]:
        """The first (or only) batch row's requests."""
        return self.plans[0].requests if self.plans else []

    def arm(self, requests: list[RowRequest], n_buckets: int) -> None:
        """One sequence's requests, for a forward of batch size one."""
        self.arm_rows([RowPlan(list(requests), n_buckets)])

    def arm_rows(self, plans: list[RowPlan]) -> None:
        """One plan per batch row of the next forward."""
        self.plans = list(plans)
        self.results, self.final_input, self.recording = [{} for _ in plans], None, True

    def stop_recording(self) -> None:
        self.recording = False

    def release(self) -> None:
        self.plans, self.results, self.final_input = [], [], None

    def remove(self) -> None:
        self.release()
        for h in self._handles:
            h.remove()

    def _final_hook(self, module, args):
        if self.recording and self.final_input is None:
            self.final_input = args[0]

    def final_stream(self, row: int = 0) -> torch.Tensor:
        """[T, D] the residual stream at every real position of batch row `row` (the final norm's input)."""
        return self.final_input[row, :self.plans[row].length]

    def _rows(self, layer, keys: LayerKeys, req: RowRequest, lp: LayerPool, n_buckets: int):
        groups = kv_groups(layer, lp.heads)
        k, v = keys.k.index_select(1, groups), keys.v.index_select(1, groups)
        # nested checkpoints only when one request's probabilities in this layer are large: they
        # cost one more pass over the rows in backward
        nested = self.nested_checkpoint and torch.is_grad_enabled() and \
            len(req.rows) * len(lp.heads) * k.shape[0] > self.nested_min_elements
        pooled_chunks, write_chunks = [], []
        for start in range(0, len(req.rows), self.row_chunk):
            r = req.rows[start:start + self.row_chunk]
            bidx = req.bucket_index[start:start + self.row_chunk] if req.bucket_index.dim() == 2 else req.bucket_index
            x_rows = keys.x.index_select(0, r)

            def run(x_rows, k, v, r=r, bidx=bidx):
                probs, writes = rows_from_keys(layer, x_rows, k, v, keys.rotary, r, lp.heads,
                                               with_writes=req.with_writes)
                pooled = pool_bucket_attention(probs, bidx, lp.weights.float(), n_buckets)
                return (pooled, writes) if req.with_writes else (pooled,)

            out = checkpoint(run, x_rows, k, v, use_reentrant=False) if nested else run(x_rows, k, v)
            pooled_chunks.append(out[0])
            if req.with_writes:
                write_chunks.append(out[1])
        return torch.cat(pooled_chunks, 0), (torch.cat(write_chunks, 0) if req.with_writes else None)

    def _make_hook(self, idx: int):
        def hook(module, args, kwargs):
            hidden_all = args[0] if args else kwargs["hidden_states"]
            rotary = kwargs.get("position_embeddings")
            for row, plan in enumerate(self.plans):
                items = [(req, lp) for req in plan.requests for lp in req.layer_pools if lp.layer == idx]
                if not items:
                    continue
                span = slice(0, plan.length)
                row_rotary = None if rotary is None else tuple(_batch_row(t, row)[span] for t in rotary)
                keys = layer_keys(module, hidden_all[row, span], row_rotary)
                outs = {req.key: self._rows(module, keys, req, lp, plan.n_buckets) for req, lp in items}
                if self.recording and idx not in self.results[row]:
                    self.results[row][idx] = outs
        return hook

    def collect(self, row: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """Per request of batch row `row`: pooled rows summed over the pool's layers (Eq. A) and the
        heads' writes [R, H_pool, D] in the order of `layer_pools`."""
        out = {}
        results = self.results[row]
        for req in self.plans[row].requests:
            missing = [lp.layer for lp in req.layer_pools if req.key not in results.get(lp.layer, {})]
            if missing:
                raise RuntimeError(f"supervised rows of {req.key} missing for layers {missing}: did the forward run?")
            parts = [results[lp.layer][req.key] for lp in req.layer_pools]
            pooled = parts[0][0]
            for p in parts[1:]:
                pooled = pooled + p[0]
            writes = torch.cat([p[1] for p in parts], 1) if req.with_writes else None
            out[req.key] = (pooled, writes)
        return out
