"""The key-side intervention: a named head that cannot read chosen keys (Sec. 3.3, App. E; R-C10).

At a decision event the logits of the decided token (index pos) are read at row q = pos - 1.
Head h of layer l attends there over the keys j <= q,

    alpha_{q,j} = softmax_j( <Q^h_q, K^{g(h)}_j> * scaling + m_j ),     g(h) = h // (H / KV),

with m the causal mask.  Blocking a key set K sets m_j to the dtype's most negative value for j in K:
those keys leave the head's softmax and its attention renormalises over the remaining keys,

    alpha'_{q,j} = alpha_{q,j} / (1 - sum_{k in K} alpha_{q,k})   for j not in K,   0 on K.

Only row q of the named heads changes; every other head, layer and position runs unchanged.

Measurement, per event and named head set R (one head, or several blocked together):

    D_named   = margin(R blocked on K = {})  -  margin(R blocked on the named keys)
    D_control = margin(R blocked on K = {})  -  margin(R blocked on the matched control keys)
    E         = margin(clean)                -  margin(R mean-ablated at q)

The reference K = {} runs the same masked path as the blocked variants, so kernel differences
cancel in D; E is the head's whole effect through the ordinary patch path (`patching.forward_at`
with the prefill's means mu).  Share = D / E over events where the head matters (E > 0.1).

Named keys, from the key-position categories of `readside.event_categories` at the event:

    region          the emitted code's chapter region: own line, category lines, chapter lines and the
                    near-miss line (`readside.REGION_CATEGORIES`); read at P1
    near_miss       the earlier mentions of the near-miss (trace_N); read at P2C
    near_miss_line  the near-miss's inventory line; read at P2C

Matched control: the same number of tokens, from whole units of the matching kind: other chapters'
inventory lines (for region and near_miss_line) or earlier mentions of other codes (for near_miss).
The units are drawn in a random order seeded per (seed, note, event position, role) and
concatenated; the first n tokens are kept.  Where fewer exist, all are used (n_control < n_named).

Mechanics.  As in `patching.forward_at`, the B variants of one event are B copies of the token at q,
all at RoPE position q, each seeing the cache [0, q) and itself (the 4D mask `positions_mask`,
[1, 1, B, q + B]).  A registered attention function runs every layer that holds a named head of
some variant through the model module's own `eager_attention_forward`, with the additive mask
widened per query head to [1, H, B, q + B] and the blocked (variant, head, key) entries set to the
most negative value (torch.where, never added).  Every variant of the forward passes through that
path in that layer, the empty-key reference included; a key-value head shared under GQA is left
alone (eager repeats it per query head, and only the query head's row is masked).  Every other
layer calls the model's own attention implementation.  Key q itself is the variant's own column
q + b.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from mistill.instrument.events import Event, note_rng
from mistill.instrument.hook import HeadHook
from mistill.instrument.margin import margin
from mistill.instrument.patching import Prefill, forward_at, forward_variants_chunked
from mistill.instrument.readside import CAT, REGION_CATEGORIES, NoteLayout, event_categories

KEY_KINDS = ("region", "near_miss", "near_miss_line")
NAMED_CATEGORIES = {"region": REGION_CATEGORIES, "near_miss": ("trace_N",), "near_miss_line": ("near_miss_line",)}
CONTROL_CATEGORY = {"region": "other_chapter_lines", "near_miss_line": "other_chapter_lines",
                    "near_miss": "trace_other_codes"}

Head = tuple[int, int]


@dataclass(frozen=True)
class KeyBlock:
    """One variant: the heads (layer, head) whose softmax at q loses the key positions `keys`.

    Empty `keys` is the reference: the same masked path, nothing removed.
    """

    heads: tuple[Head, ...]
    keys: tuple[int, ...] = ()


@dataclass(frozen=True)
class NamedRead:
    """A read-side role: heads blocked together, the phase they are read at, the kind of their keys."""

    role: str
    heads: tuple[Head, ...]
    phase: str
    keys: str

    def __post_init__(self):
        if self.keys not in KEY_KINDS:
            raise ValueError(f"NamedRead.keys must be one of {KEY_KINDS}, not {self.keys!r}")


# ---- the blocked attention ------------------------------------------------------------------------


_KEYMASK_ATTENTION = "mistill_keymask"


@dataclass
class _Blocking:
    blocked: dict[int, torch.Tensor]  # layer -> [1, H, B, q + B] bool: variant b's head h may not read key s
    implementation: str               # the model's own attention implementation


_ACTIVE: list[_Blocking] = []


def _blocked_mask(attention_mask: torch.Tensor | None, blocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask with the blocked entries at the most negative value: [1, H, B, S]."""
    n_rows, n_keys = blocked.shape[-2:]
    if attention_mask is None:  # one variant: it sees every key
        base = torch.zeros(1, 1, n_rows, n_keys, dtype=dtype, device=blocked.device)
    elif attention_mask.dtype == torch.bool:
        base = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
        base = base.masked_fill(~attention_mask, torch.finfo(dtype).min)
    else:
        base = attention_mask
    if tuple(base.shape[-2:]) != (n_rows, n_keys):
        raise RuntimeError(f"key mask: attention mask {tuple(base.shape)} does not match [.., {n_rows}, {n_keys}]")
    lowest = torch.tensor(torch.finfo(base.dtype).min, dtype=base.dtype, device=base.device)
    return torch.where(blocked.to(base.device), lowest, base)


def keymask_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention with the blocked keys removed in layers that hold a named head; elsewhere the
    model's own attention function, unchanged."""
    state = _ACTIVE[-1]
    eager = sys.modules[type(module).__module__].eager_attention_forward
    scaling = scaling if scaling is not None else module.scaling
    blocked = state.blocked.get(int(module.layer_idx))
    if blocked is None:
        original = ALL_ATTENTION_FUNCTIONS.get_interface(state.implementation, eager)
        return original(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    mask = _blocked_mask(attention_mask, blocked, query.dtype)
    return eager(module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs)


AttentionInterface.register(_KEYMASK_ATTENTION, keymask_attention)
# The model builds its masks for this implementation as for eager (additive, padding included, never
# skipped); an unregistered implementation would get none, and a padded batch row would read its padding.
AttentionMaskInterface.register(_KEYMASK_ATTENTION, eager_mask)


@contextlib.contextmanager
def _blocking(model, blocked: dict[int, torch.Tensor]) -> Iterator[None]:
    config = model.config
    own = config._attn_implementation
    if own == _KEYMASK_ATTENTION:
        raise RuntimeError("key mask: already inside a key-blocked forward")
    _ACTIVE.append(_Blocking(blocked, own))
    config._attn_implementation = _KEYMASK_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = own
        _ACTIVE.pop()


def decode_key_mask(model, heads: Sequence[Head], keys: Sequence[Sequence[int]]):
    """A decode-time key mask (App. N.4, R-D34) for `mistill.models.sampling.sample_rows`: after a clean
    prefill, at every decoding step the heads `heads` cannot read row i's prompt keys `keys[i]` (token
    indices into row i's chat-prompt ids); every other head, key and the prefill run unchanged.  Keys
    cached before the mask (the prefill's) keep what they absorbed: only the heads' direct reads go."""
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    bad = [(layer, head) for layer, head in heads if not (0 <= layer < n_layers and 0 <= head < n_heads)]
    if bad:
        raise ValueError(f"decode key mask: heads {bad} outside {n_layers} layers x {n_heads} heads")
    layers = sorted({layer for layer, _ in heads})

    def context(rows: Sequence[int], pads: Sequence[int], seq_len: int):
        if len(pads) != len(keys):
            raise ValueError(f"decode key mask: {len(keys)} rows of keys for a batch of {len(pads)}")
        device = next(model.parameters()).device
        blocked = {layer: torch.zeros(len(rows), n_heads, 1, seq_len, dtype=torch.bool) for layer in layers}
        for b, i in enumerate(rows):   # batch position b holds prompt i
            columns = [pads[i] + int(k) for k in keys[i]]
            if any(not pads[i] <= c < seq_len for c in columns):
                raise ValueError(f"decode key mask: row {i}'s keys reach outside its {seq_len - pads[i]} tokens")
            for layer, head in heads:
                blocked[layer][b, head, 0, columns] = True
        return _blocking(model, {layer: t.to(device) for layer, t in blocked.items()})

    return context


def _block_tensors(blocks: Sequence[KeyBlock], layers: Sequence[int], q: int, n_heads: int, device
                   ) -> dict[int, torch.Tensor]:
    """layer -> [1, H, B, q + B] bool; key j < q is cache column j, key q is the variant's own column q + b."""
    n = len(blocks)
    blocked = {layer: torch.zeros(1, n_heads, n, q + n, dtype=torch.bool) for layer in layers}
    for b, block in enumerate(blocks):
        columns = [j if j < q else q + b for j in block.keys]
        for layer, head in block.heads:
            blocked[layer][0, head, b, columns] = True
    return {layer: t.to(device) for layer, t in blocked.items()}


def _check(blocks: Sequence[KeyBlock], q: int, n_layers: int, n_heads: int) -> None:
    for block in blocks:
        for layer, head in block.heads:
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise ValueError(f"key block: no head ({layer}, {head})")
        keys = set(block.keys)
        if keys and (min(keys) < 0 or max(keys) > q):
            raise ValueError(f"key block: keys must lie in [0, {q}]")
        if block.heads and len(keys) == q + 1:
            raise ValueError("key block: blocking every key leaves the softmax empty")


@torch.no_grad()
def key_blocked_logits(model, hook: HeadHook, cache, q: int, token_id: int, blocks: Sequence[KeyBlock], *,
                       max_batch: int = 64) -> torch.Tensor:
    """Logits [B, V] (fp32) of the token at q against the cache [0, q), variant b with blocks[b] applied.

    The layers run through the masked path are those holding any block's heads (the same in every chunk
    of at most `max_batch` variants).  Visit positions in decreasing order (the cache only crops).
    """
    blocks = list(blocks)
    if not blocks:
        raise ValueError("key_blocked_logits: no variants")
    _check(blocks, q, hook.n_layers, hook.n_heads)
    layers = sorted({layer for block in blocks for layer, _ in block.heads})
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(blocks), max_batch):
        chunk = blocks[start:start + max_batch]
        with _blocking(model, _block_tensors(chunk, layers, q, hook.n_heads, device)):
            out.append(forward_at(model, hook, cache, [q] * len(chunk), [int(token_id)] * len(chunk), None,
                                  split_attention=False))
    return torch.cat(out)


@torch.no_grad()
def head_ablated_logits(model, hook: HeadHook, cache, q: int, token_id: int, head_sets: Sequence[Sequence[Head]],
                        mu: torch.Tensor, *, max_batch: int = 64) -> torch.Tensor:
    """Logits [B, V] (fp32) through the ordinary patch path; variant b mean-ablates head_sets[b] at q
    (an empty set: the clean logits)."""
    mask = torch.zeros(hook.n_layers, len(head_sets), hook.n_heads, dtype=torch.bool)
    for b, heads in enumerate(head_sets):
        for layer, head in heads:
            mask[layer, b, head] = True
    return forward_variants_chunked(model, hook, cache, q, int(token_id), mask, mu, max_batch)


# ---- named and control keys -----------------------------------------------------------------------


def named_keys(cats: np.ndarray, kind: str) -> tuple[int, ...]:
    """Key positions of the named categories of `kind` (cats: `event_categories` up to q)."""
    wanted = [CAT[c] for c in NAMED_CATEGORIES[kind]]
    return tuple(int(j) for j in np.flatnonzero(np.isin(cats, wanted)))


def control_units(layout: NoteLayout, cats: np.ndarray, kind: str) -> list[list[int]]:
    """The whole units a control draws from, in text order: other chapters' lines or other codes' mentions."""
    positions = np.flatnonzero(cats == CAT[CONTROL_CATEGORY[kind]])
    units: dict[object, list[int]] = {}
    for j in positions:
        unit = layout.line_code[j] if CONTROL_CATEGORY[kind] == "other_chapter_lines" else int(layout.mention[j])
        units.setdefault(unit, []).append(int(j))
    return list(units.values())


def control_keys(layout: NoteLayout, cats: np.ndarray, kind: str, n: int, rng: np.random.Generator
                 ) -> tuple[int, ...]:
    """n control positions: whole units in a seeded random order, concatenated, the first n kept."""
    units = control_units(layout, cats, kind)
    drawn = [j for u in rng.permutation(len(units)) for j in units[u]]
    return tuple(sorted(drawn[:n]))


def event_keys(layout: NoteLayout, event: Event, read: NamedRead, *, seed: int, note_id: str
               ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(named, control) key positions of one role at one event, both <= q = pos - 1."""
    q = event.pos - 1
    cats = event_categories(layout, code=event.code, near_miss=event.near_miss, anchor=event.anchor,
                            prefix=event.prefix or "", upto=q)
    named = named_keys(cats, read.keys)
    rng = note_rng(seed, f"{note_id}:{event.pos}:{read.role}")
    return named, control_keys(layout, cats, read.keys, len(named), rng)


# ---- one note -------------------------------------------------------------------------------------


@torch.no_grad()
def key_intervention_note(model, hook: HeadHook, pre: Prefill, ids: Sequence[int], events: Sequence[Event],
                          layout: NoteLayout, named: Sequence[NamedRead], *, seed: int, note_id: str,
                          max_batch: int = 64) -> list[dict]:
    """D_named, D_control and E of every role at every event of its phase with named keys.

    `pre` = patching.prefill(model, hook, ids, reserve=max_batch), fresh for this note.  Events are
    visited in decreasing position; rows come back in the order of `events`, roles in the order of
    `named`.  A row: {"role", "kind", "pos", "heads": [layer * n_heads + head], "n_named", "n_control",
    "margin_clean", "margin_reference", "margin_named", "margin_control", "margin_ablated", "D_named",
    "D_control", "E"}; with no control tokens at all, margin_control and D_control are None.
    """
    by_event: dict[int, list[dict]] = {}
    order = sorted(range(len(events)), key=lambda i: -events[i].pos)
    for i in order:
        ev = events[i]
        if ev.code is None:
            continue
        plans = []
        for read in named:
            if read.phase != ev.kind:
                continue
            keys, control = event_keys(layout, ev, read, seed=seed, note_id=note_id)
            if keys:
                plans.append((read, keys, control))
        if not plans:
            continue
        q, token = ev.pos - 1, int(ids[ev.pos - 1])
        blocks = [b for read, keys, control in plans
                  for b in (KeyBlock(read.heads), KeyBlock(read.heads, keys), KeyBlock(read.heads, control))]
        blocked = margin(key_blocked_logits(model, hook, pre.cache, q, token, blocks, max_batch=max_batch),
                         ev.target_id, ev.competitor_ids).tolist()
        ablated = margin(head_ablated_logits(model, hook, pre.cache, q, token, [()] + [r.heads for r, _, _ in plans],
                                             pre.mu, max_batch=max_batch),
                         ev.target_id, ev.competitor_ids).tolist()
        clean = float(ablated[0])
        rows = []
        for k, (read, keys, control) in enumerate(plans):
            reference, blocked_named, blocked_control = (float(m) for m in blocked[3 * k:3 * k + 3])
            has_control = len(control) > 0
            rows.append({
                "role": read.role, "kind": ev.kind, "pos": int(ev.pos),
                "heads": [int(layer * hook.n_heads + head) for layer, head in read.heads],
                "n_named": len(keys), "n_control": len(control),
                "margin_clean": clean, "margin_reference": reference, "margin_named": blocked_named,
                "margin_control": blocked_control if has_control else None,
                "margin_ablated": float(ablated[k + 1]),
                "D_named": reference - blocked_named,
                "D_control": reference - blocked_control if has_control else None,
                "E": clean - float(ablated[k + 1]),
            })
        by_event[i] = rows
    return [row for i in range(len(events)) for row in by_event.get(i, [])]
