"""R-C2 (Table 8): attribution fidelity against exact patching, the noise floor, the hook validation
and the NULL calibration checks.

Direct-logit attribution in the full run: each decision event's DLA (HD-001-proxy, `proxy.npz`'s c,
the write projected on the margin direction over a positive per-event constant) against the
attribution pass's first-order importance over every head (`proxy.dla_vs_first_order`).

The self-test's top-k (`instrument.selftest.selftest_top_k`) and the NULL summary's top-k
(`instrument.calibration.summary_top_k`) name their keys (the paper's top-20 and top-16); the
artifacts record the k they used, and the keys are named from those.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.instrument.proxy_readout import ARTIFACT, dla_vs_first_order, load_proxy
from mistill.instrument.readout import instrument_dir, load_json, proxy_dir, run_reader, value
from mistill.io import read_jsonl, read_npz

READER = "readers/r_c2.py"


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params`."""
    instrument = params["instrument"]
    k = instrument["selftest"]["selftest_top_k"]
    kk = instrument["calibration"]["summary_top_k"]
    return ["attr_vs_exact_corr_detached_hook", "attr_vs_exact_corr_intact_graph",
            "attr_vs_exact_corr_detached_above_noise", "attr_vs_exact_corr_intact_above_noise",
            "forward_margin_noise_sd", "forward_noise_range", "single_head_detection_floor",
            "integrated_gradients_corr_intact", "intact_spearman", "detached_spearman",
            f"detached_top{k}_effect_recovered", f"intact_top{k}_effect_recovered", f"intact_top{k}_overlap_with_exact",
            "heads_above_noise_floor_per_event", "null_bh_positive_heads_raw", "null_bh_negative_heads_raw",
            "ic_split_half_null_discoveries", f"null_top{kk}_mean_effect", "raw_vs_null_ranking_spearman",
            "all_heads_knockin_minus_clean_margin", "all_heads_knockin_minus_clean_max_abs",
            "dla_vs_firstorder_pearson_full_run", "dla_vs_firstorder_pearson_by_phase", "dla_vs_firstorder_events"]


def compute_values(params: dict) -> tuple[dict, list]:
    out = instrument_dir(params)
    st = load_json(out / "selftest.json")
    cal = load_json(out / "calibration.json")
    sa, ca = out / "selftest.json", out / "calibration.json"
    k = st["top_k"]
    v = {
        "attr_vs_exact_corr_detached_hook": value(st["detached"]["pearson"], "Pearson over all heads x events", sa),
        "attr_vs_exact_corr_intact_graph": value(st["intact"]["pearson"], "Pearson over all heads x events", sa),
        "attr_vs_exact_corr_detached_above_noise": value(st["detached"]["pearson_above_noise"],
                                                         "Pearson over heads above the noise floor", sa),
        "attr_vs_exact_corr_intact_above_noise": value(st["intact"]["pearson_above_noise"],
                                                       "Pearson over heads above the noise floor", sa),
        "forward_margin_noise_sd": value(st["forward_margin_noise_sd"], "nats, s.d. of identical forwards", sa),
        "forward_noise_range": value(st["forward_noise_range"], "nats, range of identical forwards", sa),
        "single_head_detection_floor": value(st["single_head_detection_floor"], "nats (3 s.d.)", sa),
        "integrated_gradients_corr_intact": value(st["integrated_gradients"]["pearson"],
                                                  "Pearson over all heads x events (5 steps)", sa),
        "intact_spearman": value(st["intact"]["spearman"], "Spearman over all heads x events", sa),
        "detached_spearman": value(st["detached"]["spearman"], "Spearman over all heads x events", sa),
        f"detached_top{k}_effect_recovered": value(100 * st["detached"]["top_k_effect_recovered"],
                                                   f"percent of the exact top-{k} effect", sa),
        f"intact_top{k}_effect_recovered": value(100 * st["intact"]["top_k_effect_recovered"],
                                                 f"percent of the exact top-{k} effect", sa),
        f"intact_top{k}_overlap_with_exact": value(st["intact"]["top_k_overlap"], f"mean count of {k}", sa),
        "heads_above_noise_floor_per_event": value([st["intact"]["heads_above_noise_per_event_min"],
                                                    st["intact"]["heads_above_noise_per_event_max"]],
                                                   "range of counts over events", sa),
    }
    if "null_raw_bh_positive" in cal:
        v["null_bh_positive_heads_raw"] = value(cal["null_raw_bh_positive"], "count (BH, raw NULL I)", ca)
        v["null_bh_negative_heads_raw"] = value(cal["null_raw_bh_negative"], "count (BH, raw NULL I)", ca)
    if "split_half_null_discoveries" in cal:
        v["ic_split_half_null_discoveries"] = value(cal["split_half_null_discoveries"],
                                                    "count (BH, NULL half A - half B)", ca)
    if "null_top_mean_effect" in cal:
        kk = cal["null_top_mean_effect"]["k"]
        v[f"null_top{kk}_mean_effect"] = value(cal["null_top_mean_effect"]["value"], "nats", ca)
    if "raw_vs_null_ranking_spearman" in cal:
        v["raw_vs_null_ranking_spearman"] = value(cal["raw_vs_null_ranking_spearman"], "Spearman", ca)
    # the hook validation: every head knocked in returns the clean margin (Sec. 2.3)
    diffs = [r["margin_all"] - r["margin_clean"] for p in sorted(out.glob("*/patch2.jsonl"))
             for r in read_jsonl(p) if r.get("margin_all") is not None]
    if diffs:
        pa = out / "<note>/patch2.jsonl"
        v["all_heads_knockin_minus_clean_margin"] = value(float(np.median(diffs)), "nats, median difference", pa)
        v["all_heads_knockin_minus_clean_max_abs"] = value(float(np.max(np.abs(diffs))), "nats, max |diff|", pa)
    dla = dla_vs_first_order(*_attributions_and_proxies(out, proxy_dir(params)))
    pr = proxy_dir(params) / f"<note>/{ARTIFACT}"
    v["dla_vs_firstorder_pearson_full_run"] = value(dla["median"], "median per-event Pearson over every head "
                                                    f"({dla['events']} P1, P2 and P2C events)", pr)
    v["dla_vs_firstorder_pearson_by_phase"] = value([dla["median_by_kind"][k] for k in ("P1", "P2", "P2C")],
                                                    "median per-event Pearson, [P1, P2, P2C]", pr)
    v["dla_vs_firstorder_events"] = value([dla["events"], dla["without_correlation"], dla["unmatched"]],
                                          "counts of events: [with a correlation, constant (no correlation), without a proxy row]", pr)
    return v, [sa, ca, *sorted(out.glob("*/patch2.jsonl")), *sorted(out.glob("*/attr.npz")),
               *sorted(proxy_dir(params).glob(f"*/{ARTIFACT}"))]


def _attributions_and_proxies(out: Path, proxies: Path) -> tuple[dict, dict]:
    """HD-001's attr.npz and the proxy pass's proxy.npz, by note."""
    attributions = {p.parent.name: read_npz(p) for p in sorted(out.glob("*/attr.npz"))}
    return attributions, {n: load_proxy(proxies / n / ARTIFACT) for n in attributions
                          if (proxies / n / ARTIFACT).is_file()}


def main() -> int:
    return run_reader("R-C2", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
