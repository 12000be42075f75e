"""Exact interventions at one position, against the clean prefill's key-value cache (App. C).

The unit of intervention is one head's output at one position q.  The slow,
obvious measurement is a full forward of tokens [0, q] with the head replaced at
q (`brute_force_logits`).  The fast paths give the same numbers:

* cached: one prefill builds the cache (and each head's mean); an event at q
  crops the cache to [0, q) and runs the single token at q.  Events are visited
  in decreasing position so the cache is only ever cropped (App. C).
* cached + batched: B variants of one event (different heads replaced, or none)
  run as ONE forward of B copies of the token at q against the shared cache,
  all at RoPE position q, each attending to the cache and to itself only
  (a 4D additive mask).  Nothing is copied per variant.
* cached + batched across events: variants of different events of one note share
  a forward too; variant b sits at its own position q_b and sees the cache
  [0, q_b) and itself (the same mask, cut at q_b).  `run_variants` packs any
  list of variants into forwards of at most `max_batch`, visited in decreasing
  position, so that the cache is still only cropped.

`PatchCache` preallocates the keys and values so that appending the B variant
tokens writes in place and cropping only moves a length; transformers'
DynamicCache would copy the whole cache on every forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, DynamicLayer

from mistill.instrument.hook import HeadHook, Replacement


class _ScratchLayer(DynamicLayer):
    """A cache layer with fixed capacity; `length` is the logical sequence length."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self.intact: int | None = None  # once sealed: how many leading slots still hold the prefill's keys

    def lazy_initialization(self, key_states, value_states):
        self.dtype, self.device = key_states.dtype, key_states.device
        shape = (*key_states.shape[:-2], self.capacity, key_states.shape[-1])
        self.key_buffer = torch.empty(shape, dtype=self.dtype, device=self.device)
        self.value_buffer = torch.empty(shape, dtype=self.dtype, device=self.device)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, start = key_states.shape[-2], self.length
        if start + n > self.capacity:
            raise RuntimeError(f"PatchCache capacity {self.capacity} exceeded ({start} + {n})")
        if key_states.requires_grad or value_states.requires_grad:
            # A gradient forward keeps the graph: concatenate instead of writing in place.
            keys = torch.cat([self.key_buffer[..., :start, :], key_states], dim=-2)
            values = torch.cat([self.value_buffer[..., :start, :], value_states], dim=-2)
        else:
            self.key_buffer[..., start:start + n, :] = key_states
            self.value_buffer[..., start:start + n, :] = value_states
            keys = self.key_buffer[..., :start + n, :]
            values = self.value_buffer[..., :start + n, :]
            if self.intact is not None:
                self.intact = min(self.intact, start)
        self.length = start + n
        self.keys, self.values = keys, values
        return keys, values

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        self.length = max(0, self.length + tokens_to_remove)


class PatchCache(Cache):
    """Preallocated key-value cache: in-place appends, cropping without copies."""

    def __init__(self, n_layers: int, capacity: int):
        super().__init__(layers=[_ScratchLayer(capacity) for _ in range(n_layers)])

    def seal(self) -> None:
        """From now on every write is a variant's: it spoils the prefill's keys from where it starts."""
        for layer in self.layers:
            layer.intact = layer.length

    def crop_to(self, length: int) -> None:
        for layer in self.layers:
            if layer.intact is not None and length > layer.intact:
                raise RuntimeError(f"PatchCache: positions from {layer.intact} on were overwritten by variants; "
                                   f"cannot serve position {length} (visit positions in decreasing order)")
            layer.length = min(layer.length, length)


def crop_to(cache: Cache, length: int) -> None:
    """Crop any transformers cache to `length` tokens (transformers 5 crop takes a negative count)."""
    if isinstance(cache, PatchCache):
        cache.crop_to(length)
        return
    remove = cache.get_seq_length() - length
    if remove > 0:
        cache.crop(-remove)


@dataclass
class Prefill:
    cache: Cache
    mu: torch.Tensor  # [L, H, D] fp32: each head's mean over the whole input (App. C)
    logits: torch.Tensor | None  # [len(logit_positions), V] fp32
    length: int


def _fp32(t: torch.Tensor) -> torch.Tensor:
    """At least float32 (a float64 model keeps float64)."""
    return t if t.dtype == torch.float64 else t.float()


def _device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def prefill(model, hook: HeadHook, input_ids: Sequence[int], *, reserve: int = 256,
            logit_positions: Sequence[int] | None = None) -> Prefill:
    """One forward over the whole input: builds the cache and accumulates mu_h (App. C).

    `reserve`: cache slots beyond the input, at least the most variants run in one batch.
    """
    ids = torch.as_tensor(list(input_ids), device=_device(model))[None]
    cache = PatchCache(hook.n_layers, ids.shape[1] + reserve)
    keep = torch.as_tensor(list(logit_positions), device=ids.device) if logit_positions else 1
    with hook.accumulating_mean() as acc:
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=keep)
    cache.seal()
    logits = _fp32(out.logits[0]) if logit_positions else None
    return Prefill(cache, acc["mu"], logits, ids.shape[1])


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, T, S] additive attention mask of a [T, S] boolean one: 0 where a query sees a key, the
    dtype's lowest value elsewhere."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]


def positions_mask(positions: torch.Tensor, n_cached: int, dtype: torch.dtype, device) -> torch.Tensor:
    """[1, 1, B, n_cached + B] additive mask: variant b sees the cache [0, positions[b]) and itself only."""
    positions = torch.as_tensor(positions, device=device)
    n_variants = positions.shape[0]
    sees_cache = torch.arange(n_cached, device=device)[None, :] < positions[:, None]
    sees_self = torch.eye(n_variants, dtype=torch.bool, device=device)
    return additive_mask(torch.cat([sees_cache, sees_self], dim=1), dtype)


def variant_mask(n_variants: int, n_cached: int, dtype: torch.dtype, device) -> torch.Tensor:
    """[1, 1, B, n_cached + B] additive mask: every variant sees the cache and itself only."""
    return positions_mask(torch.full((n_variants,), n_cached), n_cached, dtype, device)


def _attend_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale) v and its log-sum-exp [.., T], no mask.

    On CUDA (bf16/fp16) one flash-attention kernel reads the cache once and returns the
    log-sum-exp; elsewhere the same function in explicit float32 arithmetic.
    """
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] <= 256:
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)
        return out[0], out[1]
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.softmax(scores, dim=-1), v.float()), lse


def variant_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Attention of T variant tokens that each see the cache [0, n) and themselves only.

    query [1, H, T, D]; key, value [1, KV, n + T, D].  The cache part runs as one unmasked
    attention with the H/KV query heads of each key head stacked (GQA without copying the
    cache); the self part is one score per token; the two are merged exactly by their
    log-sum-exps:  out = (e^{lse_c} o_c + e^{s} v_self) / (e^{lse_c} + e^{s}).
    Equal to masked attention with `variant_mask` (tested against it).
    """
    _, H, T, D = query.shape
    KV = key.shape[1]
    G, n = H // KV, key.shape[2] - T
    # query head h reads key head h // G (transformers' repeat_kv): group by key head
    q_grouped = query.reshape(1, KV, G * T, D)
    out_c, lse_c = _attend_with_lse(q_grouped, key[:, :, :n], value[:, :, :n], scaling)
    out_c = out_c.reshape(1, H, T, D).float()
    lse_c = lse_c.reshape(1, H, T).float()
    k_self = key[:, :, n:].repeat_interleave(G, dim=1)
    v_self = value[:, :, n:].repeat_interleave(G, dim=1).float()
    s_self = (query.float() * k_self.float()).sum(-1) * scaling
    top = torch.maximum(lse_c, s_self)
    w_c, w_s = torch.exp(lse_c - top)[..., None], torch.exp(s_self - top)[..., None]
    out = (w_c * out_c + w_s * v_self) / (w_c + w_s)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


_VARIANT_ATTENTION = "mistill_variants"


def _register_variant_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(_VARIANT_ATTENTION, variant_attention)


_register_variant_attention()


def forward_at(model, hook: HeadHook, cache: Cache, positions: Sequence[int], token_ids: Sequence[int],
               replacement: Replacement | None, *, split_attention: bool | None = None) -> torch.Tensor:
    """Logits [B, V] of B variant tokens, variant b at position positions[b] seeing the cache [0, positions[b]).

    The cache is cropped to max(positions) first, so every position below it must still hold
    the prefill's keys (visit positions in decreasing order).  `replacement.mask` is [L, B, H]:
    variant b replaces the heads selected in mask[:, b].  With `split_attention` and one shared
    position, the variants' attention runs as `variant_attention` (the cache read once, no mask;
    the default on CUDA, where it is one flash kernel); otherwise as the model's own attention
    under the 4D `positions_mask` (the default on CPU, where it is faster).
    """
    positions = [int(p) for p in positions]
    n_variants, n_cached = len(positions), max(positions)
    crop_to(cache, n_cached)
    device = _device(model)
    tokens = torch.as_tensor([int(t) for t in token_ids], device=device)[None]
    position_ids = torch.as_tensor(positions, device=device)[None]
    one_position = min(positions) == n_cached
    kwargs = {}
    if n_variants > 1 or not one_position:
        kwargs["attention_mask"] = positions_mask(torch.as_tensor(positions), n_cached, model.dtype, device)
    config = model.config
    own_attention = config._attn_implementation
    if split_attention is None:
        split_attention = device.type == "cuda"
    use_split = split_attention and one_position and n_variants > 1 and n_cached > 0
    try:
        if use_split:
            config._attn_implementation = _VARIANT_ATTENTION
        with hook.replacing(replacement):
            out = model(input_ids=tokens, position_ids=position_ids, past_key_values=cache, use_cache=True,
                        **kwargs)
    finally:
        config._attn_implementation = own_attention
    crop_to(cache, n_cached)
    return _fp32(out.logits[0])


def forward_variants(model, hook: HeadHook, cache: Cache, q: int, token_id: int,
                     replacement: Replacement | None, n_variants: int, *, split_attention: bool | None = None
                     ) -> torch.Tensor:
    """Logits [B, V] of B variants of the token at position q, against the cache cropped to [0, q)."""
    return forward_at(model, hook, cache, [q] * n_variants, [token_id] * n_variants, replacement,
                      split_attention=split_attention)


def forward_variants_chunked(model, hook: HeadHook, cache: Cache, q: int, token_id: int,
                             mask: torch.Tensor, values: torch.Tensor, max_batch: int) -> torch.Tensor:
    """`forward_variants` over mask [L, B, H] in chunks of at most `max_batch` variants."""
    out = []
    for start in range(0, mask.shape[1], max_batch):
        chunk = mask[:, start:start + max_batch]
        vals = values if values.dim() == 3 else values[:, start:start + max_batch]
        out.append(forward_variants(model, hook, cache, q, token_id, Replacement(chunk, vals), chunk.shape[1]))
    return torch.cat(out)


@dataclass
class Variants:
    """N single-token variants against one note's cache (the unit of every batched pass).

    Variant b is the token token_ids[b] at position positions[b], seeing the cache [0, positions[b])
    and itself; mask [L, N, H] selects the heads it replaces.  The values written there are
    `values` [L, H, D], shared by every variant (the means: mean-ablation), or, with `value_rows`,
    values[value_rows[b]] of a stack [R, L, H, D] (outputs recorded in another run: knock-in).
    """

    positions: list[int]
    token_ids: list[int]
    mask: torch.Tensor | None = None
    values: torch.Tensor | None = None
    value_rows: list[int] | None = None

    def __len__(self) -> int:
        return len(self.positions)

    def chunks(self, max_batch: int) -> list[list[int]]:
        """Variant indices in forwards of at most `max_batch`, in decreasing position (the cache only crops)."""
        order = sorted(range(len(self)), key=lambda b: -self.positions[b])
        return [order[start:start + max_batch] for start in range(0, len(order), max_batch)]

    def replacement(self, index: Sequence[int]) -> Replacement | None:
        if self.mask is None:
            return None
        index = list(index)
        if self.value_rows is None:
            values = self.values
        else:  # [B, L, H, D] -> [L, B, H, D], only this forward's rows
            values = self.values[torch.as_tensor([self.value_rows[b] for b in index])].transpose(0, 1)
        return Replacement(self.mask[:, torch.as_tensor(index)], values)


@dataclass
class EventVariants(Variants):
    """Variants of several events: each event's token once per head set, at a position per event.

    spans[i] is the variant range of event i; event_of[b] the event of variant b.
    """

    spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    event_of: list[int] = field(default_factory=list)

    @classmethod
    def build(cls, positions: Mapping[int, int], token_ids: Mapping[int, int],
              sets: Mapping[int, Sequence[torch.Tensor]]) -> EventVariants:
        """positions and token_ids: event index -> where its variants sit and their token;
        sets: event index -> its [L, H] head masks, one variant each."""
        out = cls([], [])
        columns = []
        for i, q in positions.items():
            out.spans[i] = (len(out.positions), len(out.positions) + len(sets[i]))
            out.positions += [q] * len(sets[i])
            out.token_ids += [int(token_ids[i])] * len(sets[i])
            out.event_of += [i] * len(sets[i])
            columns += sets[i]
        out.mask = torch.stack(columns, dim=1)
        return out


def one_head_mask(n_layers: int, n_heads: int, head: tuple[int, int]) -> torch.Tensor:
    """[L, H] mask selecting one (layer, head)."""
    mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    mask[head] = True
    return mask


@dataclass
class VariantOutputs:
    logits: torch.Tensor  # [N, V] fp32, in the variants' order
    recorded: torch.Tensor | None  # [N, L, H, D] head outputs after the replacement, if recorded


@torch.no_grad()
def run_variants(model, hook: HeadHook, cache: Cache, variants: Variants, max_batch: int, *,
                 record_rows: Sequence[int] = ()) -> VariantOutputs:
    """Every variant, in forwards of at most `max_batch` that may mix positions (`forward_at`).

    `record_rows`: the variants whose head outputs (after their replacement) to return, in that order.
    """
    logits: torch.Tensor | None = None
    recorded: torch.Tensor | None = None
    wanted = {b: n for n, b in enumerate(record_rows)}
    for index in variants.chunks(max_batch):
        keep = [(n, wanted[b]) for n, b in enumerate(index) if b in wanted]
        with hook.recording() if keep else contextlib.nullcontext() as rec:
            out = forward_at(model, hook, cache, [variants.positions[b] for b in index],
                             [variants.token_ids[b] for b in index], variants.replacement(index))
        if logits is None:
            logits = out.new_empty(len(variants), out.shape[-1])
        logits[torch.as_tensor(index)] = out
        if keep:
            at, to = (torch.as_tensor(x) for x in zip(*keep))
            heads = torch.stack([r[0, at.to(r.device)] for r in rec], dim=1)  # [kept, L, H, D]
            if recorded is None:
                recorded = heads.new_empty(len(record_rows), *heads.shape[1:])
            recorded[to] = heads
    if logits is None:
        raise ValueError("run_variants: no variants")
    return VariantOutputs(logits, recorded)


@torch.no_grad()
def brute_force_logits(model, hook: HeadHook, context_ids: Sequence[int], token_id: int,
                       head_mask: torch.Tensor | None, values: torch.Tensor | None) -> torch.Tensor:
    """The slow reference: a full forward of context + [token], heads replaced at the last position.

    head_mask [L, H] selects heads; values [L, H, D] are written there.  Returns logits [V].
    """
    ids = torch.as_tensor([*context_ids, int(token_id)], device=_device(model))[None]
    T = ids.shape[1]
    replacement = None
    if head_mask is not None:
        mask = torch.zeros(hook.n_layers, T, hook.n_heads, dtype=torch.bool)
        mask[:, T - 1] = head_mask
        replacement = Replacement(mask, values)
    with hook.replacing(replacement):
        out = model(input_ids=ids, use_cache=False, logits_to_keep=1)
    return _fp32(out.logits[0, -1])


def one_head_per_variant(n_layers: int, n_heads: int, heads: Sequence[tuple[int, int]],
                         include_clean: bool = True) -> torch.Tensor:
    """Mask [L, B, H]: variant 0 intervenes on nothing (if include_clean), variant b on heads[b-1]."""
    offset = 1 if include_clean else 0
    mask = torch.zeros(n_layers, len(heads) + offset, n_heads, dtype=torch.bool)
    for b, (layer, head) in enumerate(heads):
        mask[layer, b + offset, head] = True
    return mask
