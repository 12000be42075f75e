"""The demo's training step with one note per forward and with several, side by side (distill.train.notes_per_forward).

Reads the demo chain's own inputs (run `dvc repro pipelines/distill/dvc.yaml:DT-targets HD-S-untrained` first):
the Qwen3 student, its teacher targets and its untrained head sets. For each arm (Vanilla CoT-KD, Mistill at
lambda 1) and each setting, a fresh copy of the student takes the same optimiser steps of the demo's recipe
(a batch of 8 notes, fp32 master weights under bf16 autocast), the settings alternating step by step so both
meet the same machine load. Prints one JSON summary: median seconds per optimiser step per setting, their
ratio, and the largest relative difference of the steps' losses.

    python benchmarks/bench_batched_training.py [--steps 6] [--per-forward 8] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from mistill.distill import arms
from mistill.distill import pools as pl
from mistill.distill.commands import train_config
from mistill.distill.targets import read_note_targets
from mistill.distill.trainer import Trainer, precision_dtype
from mistill.io import read_json
from mistill.models.loading import ModelSpec, load_model, load_tokenizer, set_threads
from mistill.params import load_params


def trainer_for(params: dict, arm_name: str, per_forward: int, out: Path) -> Trainer:
    cfg = params["distill"]
    precision = "fp32"
    student, student_tok = load_model(ModelSpec.from_params(params["models"], "student_qwen",
                                                            dtype=precision_dtype(precision), attn_implementation="sdpa"))
    teacher_tok = load_tokenizer(ModelSpec.from_params(params["models"], params["models"]["teacher"], base="teacher"))
    arm = arms.ArmConfig(arm=arm_name, **({"lambda_p1": 1.0, "lambda_p2": 1.0} if arm_name == "mistill" else {}),
                         window=int(cfg["window"]))
    pools = None
    if arm_name == "mistill":
        pools = pl.build_pools(pl.load_head_sets(cfg["student_head_sets"]["student_qwen"]),
                               int(cfg["pool_k"]["student"]), mode=cfg["heads"])
    targets = Path(cfg["targets_dir"])
    notes = [arms.prepare_note(*read_note_targets(targets / f"{n}.npz"), student_tok, teacher_tok, arm)
             for n in read_json(targets / "manifest.json", "targets manifest")["notes"]]
    recipe = train_config({**cfg["train"], "notes_per_forward": per_forward}, precision, seed=0)
    torch.manual_seed(0)
    return Trainer(student, notes, arm, recipe, out, pools=pools)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--per-forward", type=int, default=8)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    params = load_params()
    needs = [Path(params["distill"]["targets_dir"]) / "manifest.json",
             Path(params["distill"]["student_head_sets"]["student_qwen"])]
    if not all(p.exists() for p in needs):
        print("bench_batched_training: no teacher targets or student head sets (run `dvc repro "
              "pipelines/distill/dvc.yaml:DT-targets HD-S-untrained` first); skipped")
        return 0
    set_threads(params["models"])
    settings = (1, args.per_forward)
    summary = {"benchmark": "batched_training", "machine": platform.processor() or platform.machine(),
               "threads": torch.get_num_threads(), "steps": args.steps, "arms": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for arm_name in ("vanilla", "mistill"):
            trainers = {n: trainer_for(params, arm_name, n, Path(tmp) / f"{arm_name}-{n}") for n in settings}
            times = {n: [] for n in settings}
            losses = {n: [] for n in settings}
            batches = list(trainers[1]._batches())[:args.steps]
            for _, _, indices in batches:
                for n in settings:
                    t0 = time.perf_counter()
                    row = trainers[n].train_step(indices)
                    times[n].append(time.perf_counter() - t0)
                    losses[n].append(row["loss"])
            one, many = (statistics.median(times[n]) for n in settings)
            summary["arms"][arm_name] = {
                "seconds_per_step": {str(n): round(statistics.median(times[n]), 4) for n in settings},
                "speedup": round(one / many, 2),
                "max_rel_loss_difference": max(abs(a - b) / abs(a) for a, b in zip(*(losses[n] for n in settings))),
            }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
