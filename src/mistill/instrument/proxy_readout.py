"""Reading the proxy pass's artifacts (R-C2, R-D20): the per-note proxy.npz and its readouts.

`mistill.instrument.proxy` computes every head's contribution proxy c and region mass m at the decision
events of a note (stage HD-001-proxy); this module reads them without a model (readers import it, never
torch).

The readout (`proxy_faithfulness`), reconstructed from App. C's sentence (its table was lost):

* per event, Spearman and Pearson of c with the exact importance over the event's patched heads,
  and Spearman of first-order importance and of m * c with it; medians over events (events whose
  patched heads are fewer than three or constant in either vector have no correlation and are counted);
* pooled over events: each patched head's mean c (first-order, m * c) and mean exact importance over
  the events where it was patched, and the Spearman of the two across those heads ("across 395 heads");
* the magnitude: sum over patched (event, head) pairs of |c * max(|margin|, 0.1)| (the direct-logit
  effect in nats) over the sum of |exact importance| ("about a quarter of the exact effect").

Direct-logit attribution in the full run (App. C, R-C2): c_{e,h} is a head's direct-logit projection
over max(|margin_e|, 0.1), a positive constant per event, so the per-event Pearson of c with the
attribution pass's first-order importance is the Pearson of DLA with it (`dla_vs_first_order`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from scipy import stats

from mistill.errors import UserError
from mistill.io import read_jsonl

MIN_MARGIN = 0.1          # Eq. D's floor on |margin|
MIN_HEADS = 3             # fewer patched heads than this: no per-event correlation
ARTIFACT = "proxy.npz"
DECISION_KINDS = ("P1", "P2", "P2C")


def load_proxy(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    for key in ("kinds", "positions", "occurrence", "c", "m", "margin", "target_logit"):
        if key not in arrays:
            raise ValueError(f"missing array {key}")
    return arrays


def occurrences_within_kind(rows: Sequence[dict]) -> list[int]:
    """For each row in order, how many earlier rows of its kind share its position."""
    seen: dict[tuple[str, int], int] = {}
    out = []
    for row in rows:
        key = (str(row.get("kind")), int(row["pos"]))
        out.append(seen.get(key, 0))
        seen[key] = out[-1] + 1
    return out


def exact_rows(path: Path) -> list[dict]:
    """A note's P2C knock-in rows that carry exact single-head patches, each with its `occurrence`
    (rows follow the note's events, so (pos, occurrence) names the same event in proxy.npz)."""
    rows = [r for r in read_jsonl(path) if r.get("kind") == "P2C"]
    return [{**r, "occurrence": n} for r, n in zip(rows, occurrences_within_kind(rows)) if r.get("p2c_exact")]


def _correlation(test, x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < MIN_HEADS or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(test(x, y).statistic)


def proxy_faithfulness(patch_rows: Mapping[str, Sequence[dict]], proxies: Mapping[str, Mapping[str, np.ndarray]]
                       ) -> dict:
    """Per-event and pooled agreement of c, m * c and first-order importance with exact importance.

    patch_rows: note -> its P2C rows with `p2c_exact` (heads as flat layer * H + head indices);
    proxies: note -> proxy.npz arrays.  An event with exact patches but no proxy row is an error:
    the two passes disagree about the note's events.
    """
    per_event = {name: [] for name in ("c_spearman", "c_pearson", "mc_spearman", "first_order_spearman")}
    undefined = 0
    by_head: dict[int, dict[str, list[float]]] = {}
    dla_total = exact_total = 0.0
    n_events = 0
    for note, rows in patch_rows.items():
        arrays = proxies[note]
        index = {(int(p), int(k)): i for i, (kind, p, k) in
                 enumerate(zip(arrays["kinds"], arrays["positions"], arrays["occurrence"])) if kind == "P2C"}
        c_all = arrays["c"].reshape(arrays["c"].shape[0], -1)
        m_all = arrays["m"].reshape(arrays["m"].shape[0], -1)
        for row in rows:
            key = (int(row["pos"]), int(row["occurrence"]))
            if key not in index:
                raise UserError(f"note {note}: P2C event at {row['pos']} has exact patches but no proxy row; "
                                "rerun the proxy pass")
            e = index[key]
            heads = np.asarray(row["p2c_exact"]["heads"], dtype=int)
            exact = np.asarray(row["p2c_exact"]["exact"], dtype=float)
            first = np.asarray(row["p2c_exact"]["first_order"], dtype=float)
            c, m = c_all[e, heads].astype(float), m_all[e, heads].astype(float)
            n_events += 1
            pairs = {"c_spearman": (stats.spearmanr, c), "c_pearson": (stats.pearsonr, c),
                     "mc_spearman": (stats.spearmanr, m * c), "first_order_spearman": (stats.spearmanr, first)}
            values = {name: _correlation(test, x, exact) for name, (test, x) in pairs.items()}
            undefined += values["c_spearman"] is None
            for name, v in values.items():
                if v is not None:
                    per_event[name].append(v)
            for h, ex, ch, mh, fo in zip(heads.tolist(), exact, c, m, first):
                cell = by_head.setdefault(h, {"exact": [], "c": [], "mc": [], "first_order": []})
                for key, v in (("exact", ex), ("c", ch), ("mc", mh * ch), ("first_order", fo)):
                    cell[key].append(float(v))
            scale = max(abs(float(arrays["margin"][e])), MIN_MARGIN)
            dla_total += float(np.abs(c * scale).sum())
            exact_total += float(np.abs(exact).sum())
    if not by_head:
        raise UserError("no P2C event with exact patches: nothing to compare the proxy with")
    heads = sorted(by_head)
    mean = {key: np.asarray([np.mean(by_head[h][key]) for h in heads]) for key in ("exact", "c", "mc", "first_order")}

    def pooled(key: str) -> float:
        return float(stats.spearmanr(mean[key], mean["exact"]).statistic)

    return {
        "events": n_events, "events_without_correlation": undefined, "heads": len(heads),
        "per_event_median": {k: (float(np.median(v)) if v else None) for k, v in per_event.items()},
        "pooled_spearman": {"c": pooled("c"), "mc": pooled("mc"), "first_order": pooled("first_order")},
        "magnitude_ratio": dla_total / exact_total if exact_total else None,
        "head_means": {int(h): {k: float(mean[k][i]) for k in mean} for i, h in enumerate(heads)},
    }


def dla_vs_first_order(attributions: Mapping[str, Mapping[str, np.ndarray]],
                       proxies: Mapping[str, Mapping[str, np.ndarray]]) -> dict:
    """Per-event Pearson, over every head, of direct-logit attribution with first-order importance.

    attributions: note -> HD-001's attr.npz arrays (kinds, positions, first_order [E, L, H]);
    proxies: note -> proxy.npz arrays.  Events are matched by (kind, position, occurrence within the
    kind); an attribution event of a decision kind without a proxy row is counted as unmatched (the
    student-side realisation can drop an event whose token the tokenizer merges), and events whose
    DLA or first-order vector is constant have no correlation.  Returns the median over events, the
    median per phase and the counts.
    """
    per_kind: dict[str, list[float]] = {kind: [] for kind in DECISION_KINDS}
    unmatched = undefined = 0
    for note, attr in attributions.items():
        rows = [{"kind": str(k), "pos": int(p)} for k, p in zip(attr["kinds"], attr["positions"])]
        if note not in proxies:
            if any(row["kind"] in DECISION_KINDS for row in rows):
                raise UserError(f"note {note}: attributed decision events but no proxy.npz; rerun the proxy pass")
            continue
        arrays = proxies[note]
        index = {(str(k), int(p), int(o)): i
                 for i, (k, p, o) in enumerate(zip(arrays["kinds"], arrays["positions"], arrays["occurrence"]))}
        for e, (row, occurrence) in enumerate(zip(rows, occurrences_within_kind(rows))):
            if row["kind"] not in DECISION_KINDS:
                continue
            i = index.get((row["kind"], row["pos"], occurrence))
            if i is None:
                unmatched += 1
                continue
            r = _correlation(stats.pearsonr, arrays["c"][i].ravel().astype(float),
                             attr["first_order"][e].ravel().astype(float))
            if r is None:
                undefined += 1
            else:
                per_kind[row["kind"]].append(r)
    pooled = [r for values in per_kind.values() for r in values]
    if not pooled:
        raise UserError("no decision event has both a first-order row and a proxy row")
    return {"median": float(np.median(pooled)), "events": len(pooled), "unmatched": unmatched,
            "without_correlation": undefined,
            "median_by_kind": {k: (float(np.median(v)) if v else None) for k, v in per_kind.items()}}
