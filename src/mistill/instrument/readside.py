"""The read side: where a head panel attends at decision events (Sec. 3.3, App. E; App. K, M2/M3).

One prefill per note captures each panel layer's queries (at the event rows only) and keys,
after the layer's own q/k norms and RoPE (none on SmolLM3's NoPE layers), at the input of the
model's attention function.  Each panel head's causal attention row at the decision row q is then

    alpha^h_{q,j} = softmax_j( <Q^h_q, K^{g(h)}_j> * scaling ),   j <= q   (within a sliding window)

exactly the row the model itself used (tested against eager attention's probabilities).

Every key position j <= q falls in one of 15 categories (App. E; precedence: sink > template >
the specific inventory and trace categories > the generic ones; a token belongs where its first
non-blank character lies):

    sink (first 8 tokens), template, own_line, category_lines, chapter_lines, other_chapter_lines,
    near_miss_line, inventory_other (list header, blank lines), note, instruction,
    trace_S (earlier mentions of the code), trace_N (earlier mentions of the near-miss),
    trace_other_codes, trace_prefix (the current mention's characters already emitted),
    trace_prose

A head's category shares at one event sum to 1.  From them (App. K):

* M2 region lift = (A_region / A_lines) / (n_region / n_lines): the share of the head's
  shortlist-line attention on the emitted code's chapter region (own line, category and
  near-miss lines, the rest of its chapter = its first letter), over the region's share of
  shortlist-line tokens; 1 = indifferent reading.
* M3 loop-back: the share on N (earlier mentions of the near-miss) against the share on S.
* prefix share: the share on the code's already-emitted prefix.
* n_eff = 1 / sum_j p_j^2 over the attention renormalised on shortlist-line tokens.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mistill.errors import UserError
from mistill.world import prompt as prompt_format

CATEGORIES = ("sink", "template", "own_line", "category_lines", "chapter_lines", "other_chapter_lines",
              "near_miss_line", "inventory_other", "note", "instruction", "trace_S", "trace_N",
              "trace_other_codes", "trace_prefix", "trace_prose")
CAT = {name: i for i, name in enumerate(CATEGORIES)}
LINE_CATEGORIES = ("own_line", "category_lines", "chapter_lines", "other_chapter_lines", "near_miss_line")
REGION_CATEGORIES = ("own_line", "category_lines", "chapter_lines", "near_miss_line")
SINK_TOKENS = 8  # App. E: the attention sink is the first 8 tokens (the loss buckets use position 0 only)

# Any code-shaped string in the trace (in the inventory or not): a mention of "a code".
_CODE = re.compile(r"(?<![A-Za-z0-9.])[A-Z][0-9][0-9A-Z](?:\.[0-9A-Z]{1,4})?(?![A-Za-z0-9])(?!\.[A-Za-z0-9])")

# static token sections (before the event-specific split)
_SINK, _TEMPLATE, _LINE, _INV_OTHER, _NOTE, _INSTRUCTION, _TRACE = range(7)


# ---- capture of queries and keys -------------------------------------------------------------------

_CAPTURE_ATTENTION = "mistill_readside_capture"
_ACTIVE: list[QueryKeyCapture] = []


def _capturing_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Record this layer's (post-norm, post-RoPE) queries at the wanted rows and its keys, then run
    the model's own attention function unchanged."""
    capture = _ACTIVE[-1]
    layer = int(module.layer_idx)
    if layer in capture.layers:
        rows = torch.as_tensor(capture.rows, device=query.device)
        capture.queries[layer] = query[0].index_select(1, rows).detach()   # [H, R, D]
        capture.keys[layer] = key[0].detach()                               # [KV, T, D]
        capture.scaling[layer] = float(scaling if scaling is not None else module.scaling)
        capture.window[layer] = kwargs.get("sliding_window")
    return capture.original(module)(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                    **kwargs)


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(_CAPTURE_ATTENTION, _capturing_attention)


_register()


class QueryKeyCapture:
    """Queries at chosen rows and all keys of chosen layers, from one ordinary forward."""

    def __init__(self, model, layers: Sequence[int], rows: Sequence[int]):
        self.model = model
        self.layers = {int(x) for x in layers}
        self.rows = [int(r) for r in rows]
        self.queries: dict[int, torch.Tensor] = {}
        self.keys: dict[int, torch.Tensor] = {}
        self.scaling: dict[int, float] = {}
        self.window: dict[int, int | None] = {}
        self._implementation = model.config._attn_implementation

    def original(self, module):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        eager = sys.modules[type(module).__module__].eager_attention_forward
        return ALL_ATTENTION_FUNCTIONS.get_interface(self._implementation, eager)

    @contextlib.contextmanager
    def active(self) -> Iterator[QueryKeyCapture]:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

        # transformers builds no mask for an attention name it has no mask function for: without this,
        # an eager model's prefill would run non-causal under the capture (sdpa alone falls back to is_causal)
        AttentionMaskInterface.register(_CAPTURE_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS[self._implementation])
        config = self.model.config
        _ACTIVE.append(self)
        config._attn_implementation = _CAPTURE_ATTENTION
        try:
            yield self
        finally:
            config._attn_implementation = self._implementation
            _ACTIVE.pop()

    def attention_rows(self, layer: int, heads: Sequence[int], row_index: int) -> np.ndarray:
        """[len(heads), q+1] float64 attention probabilities of `heads` at rows[row_index] = q."""
        q = self.rows[row_index]
        query = self.queries[layer][list(heads), row_index].double()             # [h, D]
        n_heads, n_kv = self.queries[layer].shape[0], self.keys[layer].shape[0]
        groups = n_heads // n_kv
        keys = self.keys[layer][[h // groups for h in heads], : q + 1].double()  # [h, q+1, D]
        scores = torch.einsum("hd,hjd->hj", query, keys) * self.scaling[layer]
        window = self.window[layer]
        if window:
            # transformers' sliding window: a row sees the last `window` keys, itself included
            scores[:, : max(0, q + 1 - window)] = float("-inf")
        return torch.softmax(scores, dim=-1).cpu().numpy()

    def query_key_contrast(self, layer: int, heads: Sequence[int], row_index: int, first: np.ndarray,
                           second: np.ndarray) -> np.ndarray:
        """[len(heads)]: cos(Q_q, mean K over `first`) - cos(Q_q, mean K over `second`) (masks over keys 0..q);
        NaN where either set is empty."""
        if not first.any() or not second.any():
            return np.full(len(heads), np.nan)
        query = self.queries[layer][list(heads), row_index].double()                     # [h, D]
        groups = self.queries[layer].shape[0] // self.keys[layer].shape[0]
        keys = self.keys[layer][[h // groups for h in heads]].double()                   # [h, T, D]
        out = []
        for mask in (first, second):
            at = torch.as_tensor(np.flatnonzero(mask), device=keys.device)
            mean_key = keys.index_select(1, at).mean(1)                                  # [h, D]
            out.append(torch.nn.functional.cosine_similarity(query, mean_key, dim=-1))
        return (out[0] - out[1]).cpu().numpy()


# ---- key-position categories ---------------------------------------------------------------------


@dataclass
class NoteLayout:
    """One note's static token sections in a model's tokenization of chat_prompt(prompt) + completion."""

    section: np.ndarray       # [T] one of the static sections
    line_code: list[str | None]  # the shortlist line's code, for line tokens
    mention: np.ndarray       # [T] index into `mentions` for trace tokens inside a code mention, else -1
    mentions: list[tuple[str, int, int]]  # (code, start, end) character spans in the completion
    token_char: np.ndarray    # [T] first non-blank character of each token in the model text
    completion_at: int


def _first_non_blank(text: str, start: int, end: int) -> int:
    for c in range(start, end):
        if not text[c].isspace():
            return c
    return start


def parse_prompt(prompt: str) -> tuple[list[tuple[str, int, int]], int, int, int]:
    """(lines as (code, start, end), lines_end, note_start, instruction_start) in the untemplated prompt."""
    head = prompt_format.LIST_HEADER + "\n\n"
    if not prompt.startswith(head):
        raise UserError("read side: the prompt does not start with the frozen list header (App. B prompt)")
    note_marker = "\n\n" + prompt_format.NOTE_HEADER
    lines_end = prompt.find(note_marker, len(head))
    instruction_start = prompt.rfind("\n\n") + 2
    if lines_end < 0 or instruction_start <= lines_end + len(note_marker):
        raise UserError("read side: cannot find the note header and the instruction in the prompt")
    lines, pos = [], len(head)
    for raw in prompt[len(head):lines_end].split("\n"):
        if raw.strip():
            lines.append((raw.split()[0], pos, pos + len(raw)))
        pos += len(raw) + 1
    return lines, lines_end, lines_end + 2, instruction_start


def note_layout(text: str, offsets: Sequence[tuple[int, int]], prompt: str, completion_at: int) -> NoteLayout:
    """Static sections of every token of `text` (= chat prompt + completion)."""
    prompt_at = text.rfind(prompt, 0, completion_at)
    if prompt_at < 0:
        raise UserError("read side: the prompt is not inside the model input")
    lines, lines_end, _, instruction_start = parse_prompt(prompt)
    completion = text[completion_at:]
    mentions = [(m.group(0), m.start(), m.end()) for m in _CODE.finditer(completion)]
    starts = np.array([s for _, s, _ in lines])
    mention_starts = np.array([s for _, s, _ in mentions])
    T = len(offsets)
    section = np.empty(T, dtype=np.int64)
    mention = np.full(T, -1, dtype=np.int64)
    line_code: list[str | None] = [None] * T
    token_char = np.empty(T, dtype=np.int64)
    for j, (s, e) in enumerate(offsets):
        c = _first_non_blank(text, s, e)
        token_char[j] = c
        if j < SINK_TOKENS:
            section[j] = _SINK
        elif c >= completion_at:
            section[j] = _TRACE
            k = int(np.searchsorted(mention_starts, c - completion_at, side="right")) - 1
            if k >= 0 and mentions[k][1] <= c - completion_at < mentions[k][2]:
                mention[j] = k
        elif not prompt_at <= c < prompt_at + len(prompt):
            section[j] = _TEMPLATE
        else:
            p = c - prompt_at
            k = int(np.searchsorted(starts, p, side="right")) - 1
            if p < lines_end and k >= 0 and lines[k][1] <= p < lines[k][2]:
                section[j], line_code[j] = _LINE, lines[k][0]
            elif p < lines_end + 2:
                section[j] = _INV_OTHER
            elif p < instruction_start:
                section[j] = _NOTE
            else:
                section[j] = _INSTRUCTION
    return NoteLayout(section, line_code, mention, mentions, token_char, completion_at)


# the categories a key's section decides alone (shortlist lines and the trace depend on the event)
_SECTION_CATEGORY = {_SINK: CAT["sink"], _TEMPLATE: CAT["template"], _INV_OTHER: CAT["inventory_other"],
                     _NOTE: CAT["note"], _INSTRUCTION: CAT["instruction"]}


def line_category(line: str, *, code: str, near_miss: str | None) -> int:
    """A shortlist line's category for an event deciding `code` (near-miss `near_miss`)."""
    if line == code:
        return CAT["own_line"]
    if near_miss and line == near_miss:
        return CAT["near_miss_line"]
    if line[:3] == code[:3]:
        return CAT["category_lines"]
    if line[:1] == code[:1]:
        return CAT["chapter_lines"]
    return CAT["other_chapter_lines"]


def mention_category(mentioned: str, *, code: str, near_miss: str | None) -> int:
    """An earlier code mention's category in the trace: the decided code, its near-miss, or another."""
    if mentioned == code:
        return CAT["trace_S"]
    if near_miss and mentioned == near_miss:
        return CAT["trace_N"]
    return CAT["trace_other_codes"]


def event_categories(layout: NoteLayout, *, code: str, near_miss: str | None, anchor: int, prefix: str,
                     upto: int) -> np.ndarray:
    """Category index of every key position 0..upto for one event (anchor: in the completion).

    In the trace, the characters of the decided code written so far (`prefix`, ending at `anchor`)
    are the prefix; a token in an earlier mention of a code takes that code's category; the rest of
    the trace, and the current mention, are prose.
    """
    n = upto + 1
    section = np.asarray(layout.section[:n])
    cats = np.empty(n, dtype=np.int64)
    for sec, cat in _SECTION_CATEGORY.items():
        cats[section == sec] = cat
    lines = np.flatnonzero(section == _LINE)
    by_line = {line: line_category(line, code=code, near_miss=near_miss)
               for line in {layout.line_code[j] for j in lines}}
    cats[lines] = [by_line[layout.line_code[j]] for j in lines]
    trace = np.flatnonzero(~np.isin(section, [*_SECTION_CATEGORY, _LINE]))
    if trace.size:
        mention_start = anchor - len(prefix or "")
        c = np.asarray(layout.token_char)[trace] - layout.completion_at
        k = np.asarray(layout.mention)[trace]
        starts = np.array([start for _, start, _ in layout.mentions] or [0])
        mentioned = np.array([mention_category(m, code=code, near_miss=near_miss)
                              for m, _, _ in layout.mentions] or [CAT["trace_prose"]])
        k_or_0 = np.where(k >= 0, k, 0)
        prose = (k < 0) | (starts[k_or_0] >= mention_start)   # prose, or the current mention's rest
        trace_cats = np.where(prose, CAT["trace_prose"], mentioned[k_or_0])
        cats[trace] = np.where((mention_start <= c) & (c < anchor), CAT["trace_prefix"], trace_cats)
    return cats


def category_shares(probs: np.ndarray, cats: np.ndarray) -> np.ndarray:
    """[heads, 15]: each head's attention mass per category (rows of `probs` sum to 1)."""
    onehot = np.zeros((cats.size, len(CATEGORIES)))
    onehot[np.arange(cats.size), cats] = 1.0
    return probs @ onehot


def region_lift(probs: np.ndarray, cats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(M2 lift, n_eff on shortlist lines) per head; NaN where the head puts no mass on the lines."""
    lines = np.isin(cats, [CAT[c] for c in LINE_CATEGORIES])
    region = np.isin(cats, [CAT[c] for c in REGION_CATEGORIES])
    n_lines, n_region = lines.sum(), region.sum()
    a_lines = probs[:, lines].sum(1)
    a_region = probs[:, region].sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        lift = (a_region / a_lines) / (n_region / n_lines) if n_lines and n_region else np.full(len(probs), np.nan)
        renorm = probs[:, lines] / a_lines[:, None]
        n_eff = 1.0 / (renorm ** 2).sum(1)
    lift = np.where(a_lines > 0, lift, np.nan)
    return lift, np.where(a_lines > 0, n_eff, np.nan)


# ---- one note ------------------------------------------------------------------------------------


@dataclass
class ReadEvent:
    """What the read side needs of a decision event, in the reading model's tokenization."""

    kind: str
    pos: int          # index of the decided token; the attention row read is q = pos - 1
    anchor: int       # character offset in the completion of the decided character
    code: str
    prefix: str = ""
    near_miss: str | None = None


@torch.no_grad()
def read_note(model, ids: Sequence[int], layout: NoteLayout, events: Sequence[ReadEvent],
              heads: Sequence[tuple[int, int]]) -> list[dict]:
    """One prefill; per event, every panel head's category shares, region lift and n_eff.

    Returns one row per event: {"kind", "pos", "code", "heads": [flat ids], "shares": [[15]],
    "lift": [...], "n_eff": [...], "qk_s_minus_n": [...]}; flat id = layer * n_heads + head.
    `qk_s_minus_n` is App. E's query-key score: the cosine of the head's query at q with its mean key
    over the code's earlier mentions (S) minus that with its mean key over the near-miss's (N); None
    where the event has no S or no N.
    """
    if not events:
        return []
    n_heads = model.config.num_attention_heads
    rows = [e.pos - 1 for e in events]
    capture = QueryKeyCapture(model, {layer for layer, _ in heads}, rows)
    device = next(model.parameters()).device
    with capture.active():
        model(input_ids=torch.as_tensor([list(ids)], device=device), use_cache=False, logits_to_keep=1)
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    out = []
    for r, ev in enumerate(events):
        q = rows[r]
        cats = event_categories(layout, code=ev.code, near_miss=ev.near_miss, anchor=ev.anchor,
                                prefix=ev.prefix, upto=q)
        flat, shares, lifts, neffs, qk = [], [], [], [], []
        for layer, hs in sorted(by_layer.items()):
            probs = capture.attention_rows(layer, hs, r)
            lift, n_eff = region_lift(probs, cats)
            flat += [layer * n_heads + h for h in hs]
            shares.append(category_shares(probs, cats))
            lifts.append(lift)
            neffs.append(n_eff)
            qk.append(capture.query_key_contrast(layer, hs, r, cats == CAT["trace_S"], cats == CAT["trace_N"]))
        out.append({"kind": ev.kind, "pos": ev.pos, "code": ev.code, "heads": flat,
                    "shares": np.concatenate(shares).round(8).tolist(),
                    "lift": [None if np.isnan(x) else float(x) for x in np.concatenate(lifts)],
                    "n_eff": [None if np.isnan(x) else float(x) for x in np.concatenate(neffs)],
                    "qk_s_minus_n": [None if np.isnan(x) else float(x) for x in np.concatenate(qk)]})
    return out


# ---- aggregation over notes (App. K: M2, M3, prefix share) ------------------------------------------


def _head_values(rows: Sequence[dict], phase: str, head: int, field: str, category: str | None = None
                 ) -> list[float]:
    vals = []
    for row in rows:
        if row["kind"] != phase or head not in row["heads"]:
            continue
        i = row["heads"].index(head)
        v = row["shares"][i][CAT[category]] if category else row[field][i]
        if v is not None:
            vals.append(float(v))
    return vals


def panel_note_values(rows: Sequence[dict], phase: str, panel: Sequence[int]) -> dict[str, float]:
    """One note's panel values at one phase (NaN where undefined).

    lift: per head the median over the note's events, then the mean over the panel's heads (App. K);
    shares (N, S, prefix, region on all attention): per head the mean over events, then over heads;
    the top head's N and S shares separately (M3 reads the group and its top head).
    """
    out: dict[str, float] = {}
    per_head_lift = [np.median(v) for h in panel if (v := _head_values(rows, phase, h, "lift"))]
    out["lift"] = float(np.mean(per_head_lift)) if per_head_lift else float("nan")
    for name, category in (("share_N", "trace_N"), ("share_S", "trace_S"), ("share_prefix", "trace_prefix"),
                           ("share_own_line", "own_line")):
        per_head = [np.mean(v) for h in panel if (v := _head_values(rows, phase, h, "shares", category))]
        out[name] = float(np.mean(per_head)) if per_head else float("nan")
        if panel:
            top = _head_values(rows, phase, panel[0], "shares", category)
            out[f"top_head_{name}"] = float(np.mean(top)) if top else float("nan")
    return out


def summarize_panels(rows_by_note: Mapping[str, Sequence[dict]], panels: Mapping[str, Mapping[str, Sequence[int]]]
                     ) -> dict:
    """Medians over notes of per-note values, per phase and panel (own top-k, random): readside.json."""
    from mistill.stats import sign_test

    out: dict = {}
    for phase, by_panel in panels.items():
        entry: dict = {}
        per_note: dict[str, dict[str, dict[str, float]]] = {}
        for name, heads in by_panel.items():
            values = {note: panel_note_values(rows, phase, list(heads)) for note, rows in rows_by_note.items()}
            values = {n: v for n, v in values.items() if not all(np.isnan(x) for x in v.values())}
            per_note[name] = values
            cell = {"heads": [int(h) for h in heads], "n_notes": len(values)}
            for measure in next(iter(values.values()), {}):
                col = np.array([v[measure] for v in values.values()], dtype=float)
                col = col[~np.isnan(col)]
                cell[measure] = float(np.median(col)) if col.size else None
            entry[name] = cell
        if "top" in per_note and "random" in per_note:
            shared = sorted(n for n in per_note["top"] if n in per_note["random"]
                            and not np.isnan(per_note["top"][n]["lift"]) and not np.isnan(per_note["random"][n]["lift"]))
            if shared:
                test = sign_test([per_note["top"][n]["lift"] for n in shared],
                                 [per_note["random"][n]["lift"] for n in shared])
                entry["lift_top_vs_random"] = {"notes_top_above": test.n_positive, "notes": test.n,
                                               "p_value": test.p_value}
        if phase == "P2C" and "top" in per_note:
            shared = sorted(n for n, v in per_note["top"].items()
                            if not np.isnan(v["share_N"]) and not np.isnan(v["share_S"]))
            if shared:
                test = sign_test([per_note["top"][n]["share_N"] for n in shared],
                                 [per_note["top"][n]["share_S"] for n in shared])
                entry["N_vs_S"] = {"notes_N_above": test.n_positive, "notes": test.n, "p_value": test.p_value}
        entry["per_note"] = per_note
        out[phase] = entry
    return out
