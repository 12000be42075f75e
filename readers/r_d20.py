"""R-D20 (Sec. 2.2, App. C): how faithful the interaction term's contribution proxy c is to exact importance.

Reads HD-001's knock-in rows (`<note>/patch2.jsonl`, the P2C events whose nominees were each patched
exactly: `p2c_exact`) and the proxy pass's per-head c and m at the same events
(`<proxy_dir>/<note>/proxy.npz`, stage HD-001-proxy) and reports `mistill.instrument.proxy_readout.proxy_faithfulness`:
per-event medians and pooled Spearman of c, of m * c and of first-order importance with exact importance,
the magnitude of c's direct-logit effect against the exact effect, and c beside exact importance for the
heads params `readers.named_heads` names (`direct_path`, then `contrastive_specialist`: the paper's
L39H12, L39H10 and L30H11).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mistill.errors import UserError
from mistill.instrument.proxy_readout import ARTIFACT, exact_rows, load_proxy, proxy_faithfulness
from mistill.instrument.readout import (
    head_index,
    instrument_dir,
    load_json,
    proxy_dir,
    reader_settings,
    run_reader,
    value,
)

READER = "readers/r_d20.py"


def named(params: dict) -> list[str]:
    heads = reader_settings(params).named_heads
    return [*heads.direct_path, *([heads.contrastive_specialist] if heads.contrastive_specialist else [])]


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params`."""
    out = ["c_vs_exact_spearman_pooled", "c_vs_exact_spearman_per_event", "firstorder_vs_exact_spearman_pooled",
           "c_vs_exact_pearson_per_event", "firstorder_vs_exact_per_event", "mc_form_per_event_pooled",
           "c_magnitude_ratio", "contrastive_events_with_exact_patches", "heads_with_exact_patches",
           "events_without_per_event_correlation"]
    if named(params):
        heads = "_".join(named(params))
        out += [f"c_vs_exact_{heads}", f"exact_importance_{heads}"]
    return out


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    hd, px = instrument_dir(params), proxy_dir(params)
    notes = sorted(p.parent.name for p in px.glob(f"*/{ARTIFACT}"))
    if not notes:
        raise UserError(f"{px}: no {ARTIFACT}; run the proxy pass first (dvc repro HD-001-proxy)")
    rows = {n: exact_rows(hd / n / "patch2.jsonl") for n in notes}
    summary = proxy_faithfulness(rows, {n: load_proxy(px / n / ARTIFACT) for n in notes})
    med, pooled = summary["per_event_median"], summary["pooled_spearman"]
    n_ev, n_heads = summary["events"], summary["heads"]
    where = f"{hd}/*/patch2.jsonl, {px}/*/{ARTIFACT}"
    per_event = f"median over {n_ev} P2C events of the per-event"
    v = {
        "c_vs_exact_spearman_pooled": value(pooled["c"], f"Spearman over {n_heads} heads of mean c and mean exact "
                                            "importance, pooled over events", where),
        "c_vs_exact_spearman_per_event": value(med["c_spearman"], f"{per_event} Spearman of c and exact importance "
                                               "over the patched heads", where),
        "firstorder_vs_exact_spearman_pooled": value(pooled["first_order"], f"Spearman over {n_heads} heads of mean "
                                                     "first-order and mean exact importance", where),
        "c_vs_exact_pearson_per_event": value(med["c_pearson"], f"{per_event} Pearson of c and exact importance",
                                              where),
        "firstorder_vs_exact_per_event": value(med["first_order_spearman"], f"{per_event} Spearman of first-order "
                                               "and exact importance", where),
        "mc_form_per_event_pooled": value([med["mc_spearman"], pooled["mc"]], "Spearman of m c and exact importance: "
                                          f"[median over {n_ev} events, pooled over {n_heads} heads]", where),
        "c_magnitude_ratio": value(summary["magnitude_ratio"], "ratio of summed abs direct-logit effect c max(|margin|, "
                                   "0.1) to summed abs exact importance over patched heads and events", where),
        "contrastive_events_with_exact_patches": value(n_ev, "count of P2C events with exact single-head patches",
                                                       where),
        "heads_with_exact_patches": value(n_heads, "count of heads with exact patches at P2C events", where),
        "events_without_per_event_correlation": value(
            summary["events_without_correlation"], f"count of {n_ev} P2C events with no per-event correlation: fewer than "
            "three patched heads, constant c, constant exact importance", where),
    }
    names = named(params)
    if names:
        sets = load_json(hd / "head_sets_contrast.json")
        flat = [head_index(name, sets["n_layers"], sets["n_heads"]) for name in names]
        means = summary["head_means"]
        absent = [name for name, i in zip(names, flat) if i not in means]
        if absent:   # the key is left out, said on stderr; the check reports it as not reproduced
            print(f"{READER}: {', '.join(absent)} never patched exactly at a P2C event; c_vs_exact_* left out",
                  file=sys.stderr)
        else:
            joined = "_".join(names)
            exact = ", ".join(f"{means[i]['exact']:.3g}" for i in flat)
            v[f"c_vs_exact_{joined}"] = value(
                [means[i]["c"] for i in flat], f"mean c over P2C events with exact patches, per head "
                f"({', '.join(names)}; exact importance {exact})", where)
            v[f"exact_importance_{joined}"] = value(
                [means[i]["exact"] for i in flat], f"nats, mean exact importance over P2C events with exact patches, "
                f"per head ({', '.join(names)})", where)
    return v, [*(hd / n / "patch2.jsonl" for n in notes), *(px / n / ARTIFACT for n in notes)]


def main() -> int:
    return run_reader("R-D20", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
