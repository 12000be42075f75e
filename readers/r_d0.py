"""R-D0 (Sec. 4.2, App. A, App. J): the distillation setup facts.

* The retriever (RT-003): category-completed code-level macro recall of the shortlists on the
  validation notes (the characterization corpus), the distillation test notes and the whole
  corpus, at the chosen K; the recall without category completion; App. A's K sweep.
* The teacher on shortlist prompts: micro-F1 on the validation traces (TR-007) and on the test
  notes (TR-008's test split); how many training notes have a valid trace (TR-008's train split,
  the notes every arm trains on); the median length of its shortlist traces.

Everything is read from what the stages wrote: `<artifacts>/data/shortlists_recall.json` and each
trace set's `summary.json` beside its traces (params `evaluate.own_heads.validation_traces`,
`evaluate.teacher_traces`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.evaluate.readout import main_for, value
from mistill.io import read_json
from mistill.models.world_files import data_dir

__all__ = ["compute_values", "keys"]

READER = "readers/r_d0.py"
SPLITS = ("validation", "test", "corpus")
SWEEP_KEYS = ["k_sweep_k", *(f"k_sweep_completed_recall_{s}" for s in SPLITS), "k_sweep_median_shortlist_length"]


def keys(params: dict) -> list[str]:
    """Every key this reader writes (the same under every profile)."""
    return [*(f"retriever_recall_{s}" for s in SPLITS), "teacher_microf1_validation", "teacher_microf1_test",
            "valid_training_traces", "recall_without_completion_corpus_vs_val", "shortlist_size_k",
            "teacher_shortlist_trace_tokens", *SWEEP_KEYS]


def _summary(traces: str) -> tuple[dict, Path]:
    path = Path(traces).with_name("summary.json")
    if not path.exists():
        raise UserError(f"{path}: missing; run the trace set's stage first (dvc repro {path.parent.name})")
    return read_json(path, "trace-set summary"), path


def _sweep_row(sweep: list[dict], k: int, path: Path) -> dict:
    for row in sweep:
        if row["k"] == k:
            return row
    raise UserError(f"{path}: the sweep has no row for the chosen K={k}")


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    recall_path = data_dir(params) / "shortlists_recall.json"
    if not recall_path.exists():
        raise UserError(f"{recall_path}: missing; run the retriever first (dvc repro RT-003)")
    recall = read_json(recall_path, "shortlist recall report")
    k = int(recall["k"])
    missing = [s for s in SPLITS if s not in recall["completed_recall"]]
    if missing:
        raise UserError(f"{recall_path}: no recall for {', '.join(missing)}")
    completion = f"the top-{k} codes plus the category siblings of the top {recall['sibling_top']}"
    v: dict = {}
    for split in SPLITS:
        v[f"retriever_recall_{split}"] = value(recall["completed_recall"][split], f"code-level macro recall over "
                                               f"{split} notes, category-completed ({completion})", recall_path)
    chosen = _sweep_row(recall["sweep"], k, recall_path)
    v["recall_without_completion_corpus_vs_val"] = value(
        [chosen["corpus"]["recall"], chosen["validation"]["recall"]],
        f"code-level macro recall of the top-{k} codes alone (corpus, validation)", recall_path)
    v["shortlist_size_k"] = value(k, f"codes ranked into each shortlist (+ category siblings of the top "
                                  f"{recall['sibling_top']}; median length {recall['shortlist_length']['median']:g})",
                                  recall_path)
    rows = recall["sweep"]
    v["k_sweep_k"] = value([r["k"] for r in rows], "the K grid of the sweep (App. A)", recall_path)
    for split in SPLITS:
        v[f"k_sweep_completed_recall_{split}"] = value(
            [r[split]["completed_recall"] for r in rows], f"category-completed macro recall per K ({split})",
            recall_path)
    v["k_sweep_median_shortlist_length"] = value([r["corpus"]["median_length"] for r in rows],
                                                 "median codes per shortlist, per K (corpus notes)", recall_path)

    validation, validation_path = _summary(params["evaluate"]["own_heads"]["validation_traces"])
    distill, distill_path = _summary(params["evaluate"]["teacher_traces"])
    v["teacher_microf1_validation"] = value(validation["overall"]["teacher"]["micro_f1"],
                                            f"micro-F1 over {validation['overall']['notes']} validation notes, "
                                            "shortlist prompts, one sample per note", validation_path)
    v["teacher_microf1_test"] = value(distill["test"]["teacher"]["micro_f1"],
                                      f"micro-F1 over {distill['test']['notes']} test notes, shortlist prompts, "
                                      "one sample per note", distill_path)
    train = [n for n in distill["per_note"].values() if n["split"] == "train"]
    if not train:
        raise UserError(f"{distill_path}: no training-split note")
    v["valid_training_traces"] = value(sum(bool(n["valid"]) for n in train),
                                       f"count of {len(train)} training notes with a valid teacher trace",
                                       distill_path)
    tokens = np.array([n["n_new_tokens"] for n in distill["per_note"].values()], dtype=float)
    v["teacher_shortlist_trace_tokens"] = value(float(np.median(tokens)),
                                                f"median tokens of {tokens.size} shortlist traces (90th percentile "
                                                f"{np.percentile(tokens, 90):.0f})", distill_path)
    return v, [recall_path, validation_path, distill_path]


if __name__ == "__main__":
    raise SystemExit(main_for("R-D0", READER, compute_values, keys))
