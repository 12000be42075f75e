"""R-D21 (Sec. 4.3, App. L.1, Table 44): the retriever alone as the prediction, and a re-run of it.

* The first k codes of each test note's RT-003 ranking (k = 20 and 10, the ranking every shortlist
  starts from) and the whole category-completed shortlist, scored as the answer with the task
  scorer (`mistill.evaluate.task`: micro-F1 over pooled counts; precision and recall pooled too).
* `mistill world shortlists --rerun` (stage RT-003-rerun) fits the retriever again under the same
  params and seed; on the test notes: how many re-run shortlists equal the stored ones exactly,
  and the median Jaccard of the two.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.evaluate.readout import main_for, test_notes, value
from mistill.evaluate.task import code_universe, micro_f1, per_label_counts
from mistill.io import read_jsonl
from mistill.models.world_files import data_dir

__all__ = ["compute_values", "keys"]

READER = "readers/r_d21.py"
CUTS = (20, 10)
SCORES = ("microf1", "precision", "recall")
LABEL = {"microf1": "micro-F1", "precision": "pooled precision", "recall": "pooled recall"}


def keys(params: dict) -> list[str]:
    """Every key this reader writes (the same under every profile)."""
    return [*(f"retriever_top{k}_{s}" for k in CUTS for s in SCORES),
            *(f"retriever_shortlist_{s}" for s in SCORES),
            "rerun_shortlist_exact_match_notes", "rerun_shortlist_median_jaccard"]


def pooled_scores(predictions: list[list[str]], gold: list[list[str]]) -> dict[str, float]:
    """micro-F1, and precision and recall over the counts pooled across notes."""
    tp, fp, fn = (x.sum() for x in per_label_counts(predictions, gold, code_universe(predictions, gold)))
    return {"microf1": micro_f1(predictions, gold),
            "precision": float(tp / (tp + fp)) if tp + fp else 0.0,
            "recall": float(tp / (tp + fn)) if tp + fn else 0.0}


def _rows(path: Path, stage: str) -> dict[str, dict]:
    if not path.exists():
        raise UserError(f"{path}: missing; run the retriever first (dvc repro {stage})")
    return {r["note_id"]: r for r in read_jsonl(path)}


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    stored_path = data_dir(params) / "shortlists.jsonl"
    rerun_path = data_dir(params) / "shortlists_rerun.jsonl"
    stored, rerun = _rows(stored_path, "RT-003"), _rows(rerun_path, "RT-003-rerun")
    notes = test_notes(params)
    missing = [n.note_id for n in notes if n.note_id not in stored or n.note_id not in rerun]
    if missing:
        raise UserError(f"{len(missing)} test notes (e.g. {missing[0]}) have no stored or re-run shortlist")
    gold = [list(n.gold_codes) for n in notes]
    v: dict = {}
    for k in CUTS:
        short = [n.note_id for n in notes if len(stored[n.note_id]["ranked"]) < k]
        if short:
            raise UserError(f"{stored_path}: note {short[0]} keeps fewer than {k} ranked codes")
        scores = pooled_scores([stored[n.note_id]["ranked"][:k] for n in notes], gold)
        for name, score in scores.items():
            v[f"retriever_top{k}_{name}"] = value(score, f"{LABEL[name]} of the top-{k} retrieved codes as the answer "
                                                  f"({len(notes)} test notes)", stored_path)
    scores = pooled_scores([stored[n.note_id]["codes"] for n in notes], gold)
    for name, score in scores.items():
        v[f"retriever_shortlist_{name}"] = value(score, f"{LABEL[name]} of the whole category-completed shortlist as "
                                                 f"the answer ({len(notes)} test notes)", stored_path)
    jaccard = [len(set(stored[n.note_id]["codes"]) & set(rerun[n.note_id]["codes"]))
               / len(set(stored[n.note_id]["codes"]) | set(rerun[n.note_id]["codes"])) for n in notes]
    exact = sum(stored[n.note_id]["codes"] == rerun[n.note_id]["codes"] for n in notes)
    v["rerun_shortlist_exact_match_notes"] = value(exact, f"count of {len(notes)} test notes whose re-run "
                                                   "shortlist equals the stored one", rerun_path)
    v["rerun_shortlist_median_jaccard"] = value(float(np.median(jaccard)), f"median Jaccard of re-run and stored "
                                                f"shortlists over {len(notes)} test notes", rerun_path)
    return v, [stored_path, rerun_path, Path(params["evaluate"]["test_notes"])]


if __name__ == "__main__":
    raise SystemExit(main_for("R-D21", READER, compute_values, keys))
