"""R-D9 (Sec. 6, App. I.5): what a training run costs, read from the runs' own logs.

Every training step appends to its run's metrics.jsonl the notes it took, its wall time and the peak
memory so far (`distill.trainer`: peak GPU memory allocated on CUDA, the process's peak resident
memory on a CPU).  Per arm:

* Qwen Mistill: the largest logged peak (GiB) and the seconds per training note (all steps' time
  over all notes they took);
* the time of a run per 100 training notes (a run's summed step time scaled by 100 over its training
  notes, at its epochs), as the range over the arm's runs (every student, precision and seed);
* the whole training set: a Qwen Mistill run's minutes and an fp32 Vanilla run's hours (mean over
  seeds), and the fp32 ("tier-1") runs' largest logged peak;
* the median step time of each Mistill run, in minutes per step of the batch's notes (range over runs);
* Mistill with fp32 master weights (R-D17's runs, recipe variants of params variants.arms): the largest
  logged peak.

Beside them, the same figures at the paper's shape from the GPU benchmark of one training note
(`benchmarks/bench_training.py --shape qwen3-4b` on an H200, committed in benchmarks/results): a
~28k-token shortlist prompt plus a ~6k-token trace, Qwen3-4B's shape, bf16 weights.  Every number is
hardware-dependent and indicative only (App. Q).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from mistill.distill.runs import FP32_MISTILL_VARIANTS, run_dir, variant, variant_run_dir
from mistill.errors import UserError
from mistill.evaluate.readout import main_for, training_seeds, value
from mistill.io import read_json, read_jsonl

READER = "readers/r_d9.py"
BENCHMARK = Path("benchmarks/results/training_qwen3_4b_h200.json")
GIB = 2 ** 30


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params` (the same under every profile)."""
    return ["qwen_mistill_step_peak_memory", "qwen_mistill_time_per_note", "vanilla_100_notes_train_time",
            "mistill_100_notes_train_time", "mistill_493_notes_train_time", "tier1_logged_peak_memory",
            "mistill_step_time", "vanilla_fp32_493_train_time", "fp32_mistill_memory",
            "mistill_over_vanilla_time_per_note",
            "paper_shape_qwen_mistill_step_peak_memory", "paper_shape_qwen_mistill_time_per_note",
            "paper_shape_qwen_vanilla_step_peak_memory", "paper_shape_qwen_vanilla_time_per_note"]


class Run:
    """One training run's log: its steps, notes and configuration."""

    def __init__(self, path: Path, student: str, arm: str, precision: str, seed: int):
        self.path, self.student, self.arm, self.precision, self.seed = path, student, arm, precision, seed
        if not (path / "metrics.jsonl").is_file():
            raise UserError(f"{path}: no metrics.jsonl; train the run first (dvc repro)")
        self.steps = read_jsonl(path / "metrics.jsonl", "training log")
        self.training_notes = len(read_json(path / "config.json", "run config")["example_ids"])
        if not self.steps or self.training_notes == 0:
            raise UserError(f"{path}: an empty training log")

    @property
    def seconds(self) -> float:
        return sum(s["step_time_s"] for s in self.steps)

    @property
    def notes_taken(self) -> int:
        return sum(s["notes"] for s in self.steps)

    @property
    def peak_gib(self) -> float:
        return max(s["peak_memory_bytes"] for s in self.steps) / GIB

    def minutes_per_100_notes(self) -> float:
        return self.seconds * 100 / self.training_notes / 60


def runs(params: dict) -> list[Run]:
    cfg = params["distill"]
    out = []
    for student in cfg["students"]:
        for seed in training_seeds(params):
            for arm, precision in [("mistill", "bf16"), *(("vanilla", p) for p in cfg["vanilla_precisions"])]:
                out.append(Run(run_dir(cfg["runs_dir"], f"student_{student}", arm, precision, seed),
                               student, arm, precision, seed))
    return out


def fp32_mistill_runs(params: dict) -> list[Run]:
    """R-D17's Mistill runs with fp32 master weights (recipe variants), one per seed."""
    variants = params.get("variants") or {}
    out = []
    for name in FP32_MISTILL_VARIANTS:
        entry = variant(variants, name)
        out.append(Run(variant_run_dir(variants["dir"], name, entry), f"student_{entry['student']}", "mistill",
                       entry["precision"], int(entry["seed"])))
    return out


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    every = runs(params)
    fp32_mistill = fp32_mistill_runs(params)
    qwen = next(iter(params["distill"]["students"]))   # the first student is Qwen3-4B's stand-in
    mistill = [r for r in every if r.arm == "mistill"]
    vanilla = [r for r in every if r.arm == "vanilla"]
    qwen_mistill = [r for r in mistill if r.student == qwen]
    fp32 = [r for r in vanilla if r.precision == "fp32"]
    qwen_fp32 = [r for r in fp32 if r.student == qwen]
    where = f"{params['distill']['runs_dir']}/DT-00*/*/metrics.jsonl"
    peak = "GiB, the largest peak memory logged by a step (GPU allocated; on a CPU the process's resident set)"

    def spread(values):
        return [min(values), max(values)]

    def per_note(group):
        return sum(r.seconds for r in group) / sum(r.notes_taken for r in group)

    batch = max(s["notes"] for r in mistill for s in r.steps)
    v = {
        "qwen_mistill_step_peak_memory": value(max(r.peak_gib for r in qwen_mistill),
                                               f"{peak}, Qwen Mistill runs", where),
        "qwen_mistill_time_per_note": value(per_note(qwen_mistill), "seconds per training note, Qwen Mistill runs "
                                            "(summed step time over the notes of the steps)", where),
        "vanilla_100_notes_train_time": value(spread([r.minutes_per_100_notes() for r in vanilla]),
                                              f"minutes per 100 training notes, range over {len(vanilla)} Vanilla "
                                              "CoT-KD runs", where),
        "mistill_100_notes_train_time": value(spread([r.minutes_per_100_notes() for r in mistill]),
                                              f"minutes per 100 training notes, range over {len(mistill)} Mistill "
                                              "runs", where),
        "mistill_493_notes_train_time": value(statistics.mean(r.seconds / 60 for r in qwen_mistill),
                                              f"minutes of a Qwen Mistill run on the whole training set "
                                              f"({qwen_mistill[0].training_notes} notes), mean over seeds", where),
        "tier1_logged_peak_memory": value(max(r.peak_gib for r in fp32), f"{peak}, fp32 Vanilla CoT-KD runs", where),
        "mistill_step_time": value(spread([statistics.median(s["step_time_s"] for s in r.steps) / 60
                                           for r in mistill]),
                                   f"minutes per step of {batch} notes, median per run, range over "
                                   f"{len(mistill)} Mistill runs", where),
        "vanilla_fp32_493_train_time": value(statistics.mean(r.seconds / 3600 for r in qwen_fp32),
                                             f"hours of a Qwen fp32 Vanilla CoT-KD run on the whole training set "
                                             f"({qwen_fp32[0].training_notes} notes), mean over seeds", where),
        "fp32_mistill_memory": value(max(r.peak_gib for r in fp32_mistill), f"{peak}, Mistill runs with fp32 master "
                                     f"weights ({', '.join(FP32_MISTILL_VARIANTS)})",
                                     f"{params['variants']['dir']}/DT-001/*/metrics.jsonl"),
        "mistill_over_vanilla_time_per_note": value(
            per_note(mistill) / per_note(vanilla), "ratio of seconds per training note, Mistill over Vanilla CoT-KD "
            "runs", where),
    }
    if not BENCHMARK.is_file():
        raise UserError(f"{BENCHMARK}: missing; run benchmarks/bench_training.py --shape qwen3-4b on a GPU")
    bench = json.loads(BENCHMARK.read_text())
    shape = (f"{bench['gpu']}, Qwen3-4B shape, {bench['prompt_tokens']} prompt and {bench['trace_tokens']} trace "
             "tokens, one note")
    for arm in ("mistill", "vanilla"):
        cell = bench["arms"][arm]
        v[f"paper_shape_qwen_{arm}_step_peak_memory"] = value(cell["peak_memory_gib"], f"GiB, peak GPU memory "
                                                              f"allocated, {shape}", BENCHMARK)
        v[f"paper_shape_qwen_{arm}_time_per_note"] = value(cell["seconds_per_note"], f"seconds per training note, "
                                                           f"forward and backward, {shape}", BENCHMARK)
    return v, [*(r.path / "metrics.jsonl" for r in (*every, *fp32_mistill)), BENCHMARK]


if __name__ == "__main__":
    raise SystemExit(main_for("R-D9", READER, compute_values, keys))
