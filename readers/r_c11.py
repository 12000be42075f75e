"""R-C11 (Sec. 3.3, App. E, Tables 21 and 23): editing the earlier sibling mention, and the note's words.

From HD-001-read's prefix_edit.jsonl and evidence_edit.jsonl (`mistill instrument edits`,
`mistill.instrument.edits`).  At a seeded subset of each note's contrastive (P2C) events,

    effect_v = margin(identity re-feed) - margin(variant v)          (positive: the edit lowered it)

Trace edits (Table 21): v replaces the most recent earlier mention of the near-miss by filler (the
neutral edit), an unrelated same-shape code of another chapter, or a same-chapter code of another
category.  The neutral edit's mean, median and positive events (sign test), the paired differences
neutral minus each string-copy control (median, sign test p), and the mediated share: with the two
contrastive readers mean-ablated at the decision during both reads,

    mediated share = 1 - (effect under ablation) / effect,

its median over events whose neutral effect exceeds read_side.edits.mediation_min_effect (the paper's
0.5 nats), and 1 - mean(effect under ablation) / mean(effect) (the share of the mean).  The pair's
share of the clean margin: mean over events of margin(identity) - margin(identity, pair ablated),
over the mean identity margin.

Note edits (Table 23): v replaces every occurrence in the note of the emitted code's distinguishing
description words (evidence), of the near-miss's, of as many words found only in other chapters'
descriptions (the matched control) or in no description.  Per note the mean over its edited events of
evidence minus control; the mean over notes with its bootstrap interval; notes higher (sign test).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.instrument.edits import NOTE_VARIANTS, PREFIX_VARIANTS
from mistill.instrument.margin import bf16_spacing
from mistill.instrument.proxy_readout import ARTIFACT as PROXY_ARTIFACT
from mistill.instrument.proxy_readout import load_proxy
from mistill.instrument.read_passes import ReadSide
from mistill.instrument.readout import load_json, proxy_dir, reader_settings, run_reader, value
from mistill.io import read_jsonl
from mistill.stats import StatsParams, bootstrap_mean, sign_test

READER = "readers/r_c11.py"
NEUTRAL = "filler"


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params` (the mediation pair from params)."""
    pair = reader_settings(params).named_heads.contrastive_readers[:2]
    out = ["neutral_edit_mean_effect", "neutral_edit_median_effect", "neutral_edit_positive_events",
           "string_copy_vs_neutral_paired_median", "neutral_minus_unrelated_p", "neutral_minus_other_category_p",
           "evidence_minus_control_per_note", "evidence_minus_control_per_note_interval", "evidence_edit_events",
           "evidence_notes_higher", "evidence_minus_nodescription_control",
           "evidence_minus_nodescription_control_interval"]
    if pair:
        out += [f"mediated_share_{'_'.join(pair)}", "mediated_share_of_mean", "pair_share_of_clean_margin"]
    out += [f"{v}_edit_effects" for v in PREFIX_VARIANTS] + [f"note_{v}_edit_effects" for v in NOTE_VARIANTS]
    return [*out, "bf16_logit_grid"]


def teacher_logits(proxies: Path) -> np.ndarray:
    """The teacher's logit of the decided token at every P2C event of the proxy pass (HD-001-proxy)."""
    rows = [load_proxy(p) for p in sorted(proxies.glob(f"*/{PROXY_ARTIFACT}"))]
    return np.concatenate([r["target_logit"][r["kinds"] == "P2C"] for r in rows]) if rows else np.zeros(0)


def load(out: Path) -> tuple[list[dict], list[dict], list[str], dict]:
    summary = load_json(out / "edits.json")
    prefix, evidence = [], []
    for note in summary["notes"]:
        for name, rows in (("prefix_edit.jsonl", prefix), ("evidence_edit.jsonl", evidence)):
            path = out / note / name
            if not path.exists():
                raise UserError(f"{path}: missing; run `mistill instrument edits` (stage HD-001-edits)")
            rows += [{**r, "note": note} for r in read_jsonl(path)]
    return prefix, evidence, summary["notes"], summary


def effects(rows: list[dict], variant: str, *, ablated: bool = False) -> np.ndarray:
    """effect_v per event (NaN where the variant could not be built)."""
    ref, field = ("margin_identity_ablated", "margin_ablated") if ablated else ("margin_identity", "margin")
    return np.array([r[ref] - r[field][variant] if r[field][variant] is not None and r[ref] is not None else np.nan
                     for r in rows], dtype=float)


def per_note_difference(rows: list[dict], a: str, b: str) -> dict[str, float]:
    """note -> the mean over its events (both variants present) of effect_a - effect_b."""
    by_note: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r["margin"][a] is not None and r["margin"][b] is not None:
            by_note[r["note"]].append(r["margin"][b] - r["margin"][a])   # (m_id - m_a) - (m_id - m_b)
    return {note: float(np.mean(v)) for note, v in by_note.items()}


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    side = ReadSide.from_params(params)
    out = side.pass_dir("edits")
    prefix, evidence, notes, summary = load(out)
    if not prefix:
        raise UserError(f"{out}: no edited contrastive events; the notes have no P2C event with an earlier near-miss")
    stats = StatsParams.from_params(params)
    pair = reader_settings(params).named_heads.contrastive_readers[:2]
    art_p, art_e = f"{out}/*/prefix_edit.jsonl", f"{out}/*/evidence_edit.jsonl"
    v: dict[str, dict] = {}
    neutral = effects(prefix, NEUTRAL)
    ok = ~np.isnan(neutral)
    n = int(ok.sum())
    if n:
        v["neutral_edit_mean_effect"] = value(float(neutral[ok].mean()), f"nats, mean over {n} events", art_p)
        v["neutral_edit_median_effect"] = value(float(np.median(neutral[ok])), f"nats, median over {n} events", art_p)
        test = sign_test(neutral[ok])
        v["neutral_edit_positive_events"] = value(test.n_positive, f"count of {n} events (sign test p "
                                                  f"{test.p_value:.3g})", art_p)
    for variant in PREFIX_VARIANTS:
        e = effects(prefix, variant)
        e = e[~np.isnan(e)]
        v[f"{variant}_edit_effects"] = value(
            [float(e.mean()) if e.size else 0.0, float(np.median(e)) if e.size else 0.0, int((e > 0).sum()), int(e.size)],
            "[mean effect, median effect, positive events, events], nats", art_p)
    # the string-copy controls against the neutral edit, paired per event (events where both were built)
    for control, key in (("unrelated", "neutral_minus_unrelated_p"), ("other_category", "neutral_minus_other_category_p")):
        both = ok & ~np.isnan(effects(prefix, control))
        diff = neutral[both] - effects(prefix, control)[both]
        if not diff.size:
            continue
        v[key] = value(sign_test(diff).p_value, "p, sign test over events", art_p)
        if control == "unrelated":
            v["string_copy_vs_neutral_paired_median"] = value(
                float(np.median(diff)), f"nats, paired median over {diff.size} events of neutral minus unrelated", art_p)
    if pair:
        ablated = effects(prefix, NEUTRAL, ablated=True)
        big = ok & (neutral > side.edits.mediation_min_effect) & ~np.isnan(ablated)
        if big.any():
            v[f"mediated_share_{'_'.join(pair)}"] = value(
                float(np.median(1.0 - ablated[big] / neutral[big])),
                f"median over {int(big.sum())} events with a neutral effect above {side.edits.mediation_min_effect} nats",
                art_p)
        both = ok & ~np.isnan(ablated)
        if both.any() and neutral[both].mean() != 0:
            v["mediated_share_of_mean"] = value(float(1.0 - ablated[both].mean() / neutral[both].mean()),
                                                "share, one minus the mean effect under ablation over the mean effect",
                                                art_p)
        clean = np.array([r["margin_identity"] for r in prefix])
        clean_ablated = np.array([r["margin_identity_ablated"] for r in prefix])
        v["pair_share_of_clean_margin"] = value(float(100.0 * (clean - clean_ablated).mean() / clean.mean()),
                                                "percent of the mean identity margin the pair carries", art_p)
    inputs = [out / "edits.json", *(out / n / f for n in notes for f in ("prefix_edit.jsonl", "evidence_edit.jsonl"))]
    # the grid a bf16 teacher's logits of this size sit on (the demo's fp32 teacher has none)
    logits = teacher_logits(proxy_dir(params))
    if logits.size:
        v["bf16_logit_grid"] = value(bf16_spacing(float(np.median(np.abs(logits)))),
                                     "nats, bf16 spacing at the median logit of the decided token (P2C events)",
                                     str(proxy_dir(params) / f"*/{PROXY_ARTIFACT}"))
        inputs += sorted(proxy_dir(params).glob(f"*/{PROXY_ARTIFACT}"))
    # the note's words
    v["evidence_edit_events"] = value(len(evidence), f"count of the {len(prefix)} edited events with words to edit",
                                      art_e)
    for key, control in (("evidence_minus_control_per_note", "other_chapter"),
                         ("evidence_minus_nodescription_control", "no_description")):
        per_note = per_note_difference(evidence, "evidence", control)
        if not per_note:
            continue
        interval = bootstrap_mean(list(per_note.values()), n_resamples=stats.bootstrap_resamples,
                                  seed=stats.bootstrap_seed, confidence=stats.confidence)
        v[key] = value(interval.estimate, f"nats per note, mean over {len(per_note)} notes", art_e)
        v[f"{key}_interval"] = value([interval.low, interval.high],
                                     f"{stats.confidence:.0%} percentile bootstrap over notes", art_e)
        if control == "other_chapter":
            test = sign_test(list(per_note.values()))
            v["evidence_notes_higher"] = value(test.n_positive, f"count of {test.n} notes (sign test p "
                                               f"{test.p_value:.3g})", art_e)
    for variant in NOTE_VARIANTS:
        e = np.array([r["margin_identity"] - r["margin"][variant] for r in evidence
                      if r["margin"][variant] is not None], dtype=float)
        v[f"note_{variant}_edit_effects"] = value(
            [float(e.mean()) if e.size else 0.0, float(np.median(e)) if e.size else 0.0, int(e.size)],
            "[mean effect, median effect, events], nats", art_e)
    return v, inputs


def main() -> int:
    return run_reader("R-C11", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
