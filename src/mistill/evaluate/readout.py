"""Shared reading of the distillation evaluations (R-D1, R-D2, R-D5 readers).

Each arm's evaluation directory `<artifacts>/DT-eval/<label>-s<seed>/` is written by one
`mistill evaluate arm --model <spec> --out-dir <dir> --m1-notes <test notes>`, which runs

    mistill evaluate generate --model <spec> --out <dir>/generations.jsonl   (test-note generations)
    mistill evaluate task --generations <dir>/generations.jsonl --out <dir>/task.json
    mistill evaluate fidelity --generations ... --model <spec> --out <dir>/fidelity.json
    mistill evaluate m1 --model <spec> --notes <test notes> --out <dir>/m1.json

with arm labels from params `evaluate.own_heads.arms` (an untrained arm has seed 0 only, the
sampling seeds being per note).  Helpers: locating an arm's seeds, its corpus metrics, its
per-note F1 on the test notes, its M1, the teacher's own score on the same notes (the top of
the gap in "gap recovered"), and writing the registered keys.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mistill.errors import UserError
from mistill.io import read_json
from mistill.params import load_params

EVAL_DIR = "DT-eval"
KINDS = ("P1", "P2", "P2C")


def value(v, statistic: str, artifact) -> dict:
    return {"value": v, "statistic": statistic, "artifact": str(artifact)}


@dataclass
class ArmSeed:
    """One arm at one training seed: its evaluation directory and what it holds."""

    label: str
    seed: int
    path: Path
    las_file: Path | None = None                     # stage LAS's las.json of this run (read when present)
    task: dict = field(default_factory=dict)        # task.json metrics
    fidelity: dict = field(default_factory=dict)    # fidelity.json metrics
    m1: dict = field(default_factory=dict)          # m1.json m1 (per kind)
    generations: dict = field(default_factory=dict)  # note_id -> generation record

    def files(self) -> list[Path]:
        return [p for p in (self.path / n for n in ("generations.jsonl", "task.json", "fidelity.json", "m1.json"))
                if p.is_file()]


def eval_root(params: dict) -> Path:
    return Path((params.get("paths") or {}).get("artifacts", "artifacts")) / EVAL_DIR


def null_control(roots: list[Path]) -> dict[Path, float]:
    """Every evaluation under `roots` whose M1 was read at the NULL events too (`mistill evaluate arm
    --m1-null`): its m1.json -> P(margin > 0) there (App. K's control, near zero for every arm)."""
    from mistill.io import read_json

    out = {}
    for root in roots:
        for path in sorted(Path(root).glob("*/m1.json")):
            null = read_json(path, "M1 readout").get("m1", {}).get("NULL")
            if null and null.get("events"):
                out[path] = float(null["p_margin_positive"])
    return out


def arm_labels(params: dict) -> dict[str, str]:
    """Table 2 row -> arm label (params evaluate.own_heads.arms)."""
    labels = ((params.get("evaluate") or {}).get("own_heads") or {}).get("arms") or {}
    if not labels:
        raise UserError("params.yaml evaluate.own_heads.arms: no arm labels")
    return dict(labels)


def training_seeds(params: dict) -> list[int]:
    """The training seeds the profile runs (params distill.seeds): what keys a reader declares for s.d.
    over seeds and for seed 0 depends on them."""
    return list((params.get("distill") or {}).get("seeds") or [0])


def _section(path: Path, key: str, what: str) -> dict:
    """One section of an evaluation's json (`metrics`, `m1`); a corrupt file is a one-line UserError."""
    data = read_json(path, what)
    if not isinstance(data, dict) or not isinstance(data.get(key), dict):
        raise UserError(f"{path}: no {key!r} section; rerun the evaluation that writes it")
    return data[key]


def read_arm(path: Path, label: str, seed: int, las_file: Path | None = None) -> ArmSeed:
    """One evaluation directory (task.json, and fidelity.json, m1.json, generations.jsonl where present)."""
    from mistill.io import read_jsonl

    arm = ArmSeed(label, seed, path, las_file)
    arm.task = _section(path / "task.json", "metrics", "task metrics")
    if (path / "fidelity.json").is_file():
        arm.fidelity = _section(path / "fidelity.json", "metrics", "fidelity metrics")
    if (path / "m1.json").is_file():
        arm.m1 = _section(path / "m1.json", "m1", "M1 readout")
    if (path / "generations.jsonl").is_file():
        arm.generations = {r.get("note_id"): r for r in read_jsonl(path / "generations.jsonl", "generations")}
    return arm


def load_arm(root: Path, label: str, las_root: Path | None = None) -> dict[int, ArmSeed]:
    """Every seed of one arm whose directory holds a task.json, by seed; `las_root` (default: `LAS` beside
    `root`) holds stage LAS's `<label>-s<seed>/las.json`."""
    seeds: dict[int, ArmSeed] = {}
    pattern = re.compile(re.escape(label) + r"-s(\d+)$")
    for path in sorted(root.glob(f"{label}-s*")) if root.is_dir() else []:
        match = pattern.match(path.name)
        if not match or not (path / "task.json").is_file():
            continue
        seed = int(match.group(1))
        seeds[seed] = read_arm(path, label, seed, (las_root or root.parent / LAS_DIR) / path.name / "las.json")
    return seeds


def load_arms(params: dict) -> dict[str, dict[int, ArmSeed]]:
    """Table 2 row -> {seed: ArmSeed} for every row with at least one evaluated seed."""
    root = eval_root(params)
    arms = {row: load_arm(root, label) for row, label in arm_labels(params).items()}
    return {row: seeds for row, seeds in arms.items() if seeds}


def test_notes(params: dict):
    from mistill.world.notes import load_notes

    path = Path(params["evaluate"]["test_notes"])
    if not path.is_file():
        raise UserError(f"{path}: no test notes")
    return load_notes(path)


def answers(records: dict, notes, source: str | Path | None = None) -> list[list[str]]:
    """Each note's scored answer: its parsed list when the generation is valid, else empty (App. K).
    `source` (the generations file) is named when a test note has no generation."""
    missing = [n.note_id for n in notes if n.note_id not in records]
    if missing:
        where = f"{source}: " if source is not None else ""
        raise UserError(f"{where}no generation for {len(missing)} test notes (e.g. {missing[0]}): the "
                        "generations and the test notes differ; regenerate for these test notes")
    return [list(records[n.note_id].get("answer") or []) if records[n.note_id].get("valid") else [] for n in notes]


def per_note_f1(arm: ArmSeed, notes) -> list[float]:
    from mistill.evaluate.task import per_note_f1 as note_f1s

    return note_f1s(answers(arm.generations, notes, arm.path / "generations.jsonl"),
                    [list(n.gold_codes) for n in notes])


def note_counts(arm: ArmSeed, notes):
    """Each test note's tp / fp / fn for this run, after reproducing the run's stored corpus micro-F1
    from them (App. L: "each run's pooled micro-F1 is first reproduced from its predictions")."""
    from mistill.stats import NoteCounts, micro_f1

    rows = [(set(pred), set(n.gold_codes))
            for pred, n in zip(answers(arm.generations, notes, arm.path / "generations.jsonl"), notes)]
    counts = NoteCounts(tp=[len(p & g) for p, g in rows], fp=[len(p - g) for p, g in rows],
                        fn=[len(g - p) for p, g in rows])
    pooled = float(micro_f1(counts.tp.sum(), counts.fp.sum(), counts.fn.sum()))
    stored = arm.task.get("micro_f1")
    if stored is None or abs(pooled - float(stored)) > 1e-9:
        raise UserError(f"{arm.path}: micro-F1 from the generations ({pooled:.6f}) differs from task.json's "
                        f"({stored}); re-score the run (mistill evaluate task) before reading it")
    return counts


def completed_precision_recall(arm: ArmSeed, notes) -> list[float]:
    """Corpus precision and recall over the notes whose generation is valid (App. L.1 "completed answers")."""
    tp = fp = fn = 0
    for note in notes:
        record = arm.generations[note.note_id]
        if not record.get("valid"):
            continue
        pred, gold = set(record.get("answer") or []), set(note.gold_codes)
        tp, fp, fn = tp + len(pred & gold), fp + len(pred - gold), fn + len(gold - pred)
    if tp + fp == 0 or tp + fn == 0:
        raise UserError(f"{arm.path}: no completed answer with a prediction")
    return [tp / (tp + fp), tp / (tp + fn)]


def teacher_micro_f1(params: dict, notes) -> tuple[float, Path]:
    """The teacher's corpus micro-F1 on the same test notes (its TR-008 traces, invalid = empty)."""
    from mistill.evaluate.task import micro_f1
    from mistill.io import read_jsonl

    path = Path(params["evaluate"]["teacher_traces"])
    if not path.is_file():
        raise UserError(f"{path}: no teacher traces")
    records = {r.get("note_id"): r for r in read_jsonl(path, "teacher traces")}
    return micro_f1(answers(records, notes, path), [list(n.gold_codes) for n in notes]), path


def seed_mean_sd(seeds: dict[int, ArmSeed], metric: str) -> tuple[float, float | None, list[float]]:
    """Mean and sample s.d. (ddof 1; None under two seeds) of a task metric over seeds, and per seed."""
    per_seed = [float(seeds[s].task[metric]) for s in sorted(seeds)]
    return (statistics.fmean(per_seed), statistics.stdev(per_seed) if len(per_seed) > 1 else None, per_seed)


def cap_share(arm: ArmSeed) -> float:
    """Share of the arm's generations that reached the token cap."""
    rows = list(arm.generations.values())
    if not rows or any("hit_cap" not in r for r in rows):
        raise UserError(f"{arm.path}/generations.jsonl: no per-note hit_cap; regenerate")
    return statistics.fmean(bool(r["hit_cap"]) for r in rows)


GENERATION_BEHAVIOUR = ("cap_share", "mean_new_tokens")


def generation_behaviour(seeds: dict[int, ArmSeed], row: str) -> dict[str, dict]:
    """`<row>_cap_share` (share of test generations that reached the token cap) and `<row>_mean_new_tokens`
    (generated tokens per test note), each the mean over seeds of the per-seed value (Table 46's columns);
    nothing when a seed's generations lack the per-note `hit_cap` and `n_new_tokens` fields."""
    caps, tokens = [], []
    for seed in sorted(seeds):
        rows = list(seeds[seed].generations.values())
        if not rows or any("hit_cap" not in r or "n_new_tokens" not in r for r in rows):
            return {}
        caps.append(statistics.fmean(bool(r["hit_cap"]) for r in rows))
        tokens.append(statistics.fmean(int(r["n_new_tokens"]) for r in rows))
    over = f"mean over {seeds_text(seeds)}"
    return {f"{row}_cap_share": value(statistics.fmean(caps), f"share of test generations that reached the "
                                      f"token cap, {over}", where(seeds)),
            f"{row}_mean_new_tokens": value(statistics.fmean(tokens), f"generated tokens per test note, {over}",
                                            where(seeds))}


def seeds_text(seeds: dict) -> str:
    ordered = sorted(seeds)
    return f"{len(ordered)} seed{'s' if len(ordered) != 1 else ''} ({', '.join(map(str, ordered))})"


def where(seeds: dict[int, ArmSeed]) -> str:
    first = seeds[min(seeds)]
    return str(first.path.with_name(f"{first.label}-s*")) if len(seeds) > 1 else str(first.path)


def m1_shares(arm: ArmSeed, kinds=KINDS) -> list[float] | None:
    """P(margin > 0) per kind, pooled over the kind's events on the test notes (App. K, M1)."""
    shares = [arm.m1.get(k, {}).get("p_margin_positive") for k in kinds]
    if any(s is None or s != s for s in shares):
        return None
    return [float(s) for s in shares]


def m1_text(arm: ArmSeed, kinds=KINDS) -> str:
    counts = ", ".join(f"{k} {arm.m1.get(k, {}).get('events', 0)}" for k in kinds)
    notes = {n for k in kinds for n in (arm.m1.get(k, {}).get("per_note_share") or {})}
    return (f"M1: share of the teacher's events at which the student's margin is > 0, pooled over the events of "
            f"{len(notes)} test notes with teacher events ({counts} events), [{', '.join(kinds)}]")


def n_notes_text(arm: ArmSeed) -> str:
    return f"{len(arm.generations)} test notes"


def write(result_id: str, reader: str, values: dict, inputs: list[Path], params: dict,
          declared: list[str] = ()) -> int:
    """Write the keys the registry knows or the reader declares; name (stderr) any other computed key."""
    from mistill.repro.numbers import write_numbers
    from mistill.repro.registry import load_registry

    known = set(load_registry().registered_keys(result_id)) | set(declared)
    unknown = sorted(set(values) - known)
    if unknown:
        print(f"{reader}: not registered for {result_id}, left out: {', '.join(unknown)}", file=sys.stderr)
    values = {k: v for k, v in values.items() if k in known}
    if not values:
        raise UserError(f"{result_id}: no registered value could be read (build its inputs: dvc repro {result_id})")
    path = write_numbers(result_id, values, reader=reader, inputs=sorted(set(map(str, inputs))), params=params,
                         declared_keys=declared)
    print(f"{reader}: wrote {path} ({len(values)} values)")
    return 0


def main_for(result_id: str, reader: str, compute, keys=None) -> int:
    """A reader's entry point: compute under the active params, write; `keys(params)` is what it declares."""
    parser = argparse.ArgumentParser(description=f"{result_id} reader")
    parser.add_argument("--profile", default=None, help="params.yaml profile (default: the active one)")
    args = parser.parse_args()
    try:
        params = load_params(profile=args.profile)
        values, inputs = compute(params)
        return write(result_id, reader, values, inputs, params, declared=keys(params) if keys else ())
    except UserError as err:
        print(f"{reader}: error: {err}", file=sys.stderr)
        return 2


def paired_text(comparison, what: str) -> str:
    iv = comparison.mean_difference
    return (f"{what}: mean over {comparison.n} test notes of the per-note F1 difference (seeds averaged per note), "
            f"{iv.confidence:.0%} percentile bootstrap [{iv.low:+.4f}, {iv.high:+.4f}] ({iv.n_resamples} resamples, "
            f"seed {iv.seed}); Wilcoxon p {comparison.wilcoxon.p_value:.3g}, sign test p {comparison.sign.p_value:.3g}")


def per_note_mean_over_seeds(seeds, notes):
    from mistill.stats import mean_over_seeds

    return mean_over_seeds({s: per_note_f1(arm, notes) for s, arm in seeds.items()})


# ---- the baseline arms of Table 2 (R-D3, R-D4) ----------------------------------------------------------------

FAMILIES = {"qwen": "qwen", "smol": "smollm"}   # student label (params distill.students) -> the paper's key prefix


def baseline_label(params: dict, arm: str, student: str) -> str:
    """The evaluation label of a baseline arm's run for one student (runs of params baselines.<arm>.runs)."""
    return f"student-{student}-{arm}-{params['baselines'][arm]['precision']}"


def baseline_seeds(params: dict, arm: str) -> dict[str, list[int]]:
    """student -> the training seeds the profile runs for a baseline arm."""
    runs = ((params.get("baselines") or {}).get(arm) or {}).get("runs") or {}
    out: dict[str, list[int]] = {}
    for run in runs.values():
        out.setdefault(run["student"], []).append(int(run["seed"]))
    return out


def load_baseline(params: dict, arm: str, student: str) -> dict[int, ArmSeed]:
    """A baseline arm's evaluated runs (<baselines.dir>/DT-eval), their LAS where the other arms' is."""
    return load_arm(Path(params["baselines"]["dir"]) / EVAL_DIR, baseline_label(params, arm, student),
                    las_root=eval_root(params).parent / LAS_DIR)


def fp32_reference(params: dict, student: str) -> dict[int, ArmSeed]:
    """The fp32 Vanilla CoT-KD row of a student (params evaluate.own_heads.arms), by seed; empty when not named."""
    label = arm_labels(params).get(f"{FAMILIES[student]}_vanilla_fp32")
    return load_arm(eval_root(params), label) if label else {}


def run_inputs(seeds: dict[int, ArmSeed]) -> list[Path]:
    """The files a reader reads of these runs: their evaluation files and, where stage LAS ran, their LAS."""
    return [p for run in seeds.values() for p in [*run.files(), las_path(run)] if p.is_file()]


# ---- LAS (stage LAS: <artifacts>/LAS/<label>-s<seed>/las.json, beside the arm's evaluation) ---------------
# App. K's LAS is a simulatability gain (`mistill.evaluate.fidelity`); the paper's keys keep its name. Hase et
# al.'s leakage-adjusted LAS (`mistill.evaluate.leakage_adjusted`) is read beside it, a key beyond the paper.

LAS_DIR = "LAS"
SIMULATABILITY_GAIN = "simulatability gain (App. K's LAS)"


def las_path(arm: ArmSeed) -> Path:
    return arm.las_file or arm.path.parent.parent / LAS_DIR / arm.path.name / "las.json"


def simulatability_gain_of(arm: ArmSeed) -> tuple[float, dict[str, float]] | None:
    """(mean simulatability gain over the test notes, per-note gain) of one evaluated run: App. K's LAS; None
    before stage LAS ran for it."""
    path = las_path(arm)
    if not path.is_file():
        return None
    record = read_json(path, "LAS")
    return float(record["metrics"]["las"]), {k: float(v) for k, v in record["per_note"]["las"].items()}


def simulatability_gain_text(arm: ArmSeed) -> str:
    return (f"{SIMULATABILITY_GAIN}: mean over test notes of F1(simulator with the rationale, teacher answer) minus "
            f"F1(simulator without it), seed {arm.seed}")


def leakage_adjusted_of(arm: ArmSeed) -> dict | None:
    """Hase et al.'s leakage-adjusted LAS of one evaluated run and its two groups ({value, leaking: {notes,
    mean_gain}, nonleaking: {...}}); None before stage LAS answered from the rationale alone for it."""
    path = las_path(arm)
    if not path.is_file():
        return None
    return read_json(path, "LAS").get("leakage_adjusted")


def leakage_adjusted_text(arm: ArmSeed, adjusted: dict) -> str:
    def group(name: str) -> str:
        n, gain = adjusted[name]["notes"], adjusted[name]["mean_gain"]
        return f"{n} note{'s' if n != 1 else ''}, gain {gain:.3f}" if gain is not None else "no notes"

    return (f"leakage-adjusted LAS (Hase et al. 2020): the mean of two means of the {SIMULATABILITY_GAIN}, over "
            f"test notes whose rationale alone gives the simulator the teacher answer ({group('leaking')}) and over "
            f"the other notes ({group('nonleaking')}), seed {arm.seed}")


def simulatability_gain_minus_reference(key: str, seeds: dict[int, ArmSeed], reference: dict[int, ArmSeed], notes,
                                        stats, what: str) -> dict:
    """`key`: the paired per-note simulatability-gain (App. K's LAS) difference of an arm against a reference
    row (averaged per note over the seeds whose gain was measured: params simulator.arms names the runs it reads),
    bootstrap interval and Wilcoxon; nothing when neither row has a run with LAS yet."""
    from mistill.stats import paired_comparison

    def measured(runs: dict[int, ArmSeed]) -> dict[int, tuple]:
        return {s: gain for s, run in runs.items() if (gain := simulatability_gain_of(run)) is not None}

    a, b = measured(seeds), measured(reference)
    if not a or not b:
        return {}
    c = paired_comparison(*([sum(x[1][n.note_id] for x in gain.values()) / len(gain) for n in notes] for gain in (a, b)),
                          n_resamples=stats.bootstrap_resamples, seed=stats.bootstrap_seed, confidence=stats.confidence)
    iv = c.mean_difference
    runs = [*(seeds[s] for s in a), *(reference[s] for s in b)]
    return {key: value(iv.estimate, f"{what}: mean over {c.n} test notes of the per-note {SIMULATABILITY_GAIN} "
                       f"difference (seeds {'/'.join(map(str, a))} against {'/'.join(map(str, b))}, averaged per note), "
                       f"{iv.confidence:.0%} percentile bootstrap [{iv.low:+.4f}, {iv.high:+.4f}] ({iv.n_resamples} "
                       f"resamples, seed {iv.seed}); Wilcoxon p {c.wilcoxon.p_value:.3g}",
                       ", ".join(str(las_path(r)) for r in runs))}


ROW_CELLS = ("microf1", "microf1_seeds", "valid_rate", *GENERATION_BEHAVIOUR, "bleu4", "trace_ppl", "las",
             "las_leakage_adjusted", "m1_p1_p2_p2c")


def row_cell_keys(prefix: str, n_seeds: int) -> list[str]:
    """The keys `row_cells` writes for a row trained at `n_seeds` seeds."""
    return [f"{prefix}_{cell}" for cell in ROW_CELLS] + ([f"{prefix}_microf1_sd"] if n_seeds >= 2 else [])


def row_cells(prefix: str, seeds: dict[int, ArmSeed], notes) -> dict:
    """One Table 2 row: micro-F1 (mean over seeds, s.d. with two or more, per seed), validity and generation
    behaviour (means over seeds), and the lowest seed's fidelity (BLEU-4, median teacher-trace PPL, LAS: App. K's
    simulatability gain, and beside it Hase et al.'s leakage-adjusted LAS, beyond the paper) and M1."""
    first = seeds[min(seeds)]
    for arm in seeds.values():
        answers(arm.generations, notes, arm.path / "generations.jsonl")   # every test note generated
    mean, sd, per_seed = seed_mean_sd(seeds, "micro_f1")
    over = f"{seeds_text(seeds)}, {len(notes)} test notes"
    out = {f"{prefix}_microf1": value(mean, f"corpus micro-F1, mean over {over}", where(seeds)),
           f"{prefix}_microf1_seeds": value(per_seed, f"corpus micro-F1 per seed, {over}", where(seeds)),
           f"{prefix}_valid_rate": value(seed_mean_sd(seeds, "valid_rate")[0],
                                         f"share of generations valid, mean over {over}", where(seeds))}
    if sd is not None:
        out[f"{prefix}_microf1_sd"] = value(sd, f"s.d. over {seeds_text(seeds)}", where(seeds))
    out.update(generation_behaviour(seeds, prefix))
    seed = f"seed {first.seed}"
    if "bleu4" in first.fidelity:
        out[f"{prefix}_bleu4"] = value(first.fidelity["bleu4"], "mean over test notes of sentence BLEU-4 of the "
                                       f"reasoning block against the teacher's, {seed}", first.path / "fidelity.json")
    if "ppl_median" in first.fidelity:
        out[f"{prefix}_trace_ppl"] = value(first.fidelity["ppl_median"], "median over test notes of teacher-trace "
                                           f"perplexity, {seed}", first.path / "fidelity.json")
    gain = simulatability_gain_of(first)
    if gain is not None:
        out[f"{prefix}_las"] = value(gain[0], simulatability_gain_text(first), las_path(first))
    adjusted = leakage_adjusted_of(first)
    if adjusted is not None:
        out[f"{prefix}_las_leakage_adjusted"] = value(adjusted["value"], leakage_adjusted_text(first, adjusted),
                                                      las_path(first))
    shares = m1_shares(first)
    if shares is not None:
        out[f"{prefix}_m1_p1_p2_p2c"] = value(shares, f"{m1_text(first)}, {seed}", first.path / "m1.json")
    return out


def minus_reference(key: str, seeds: dict[int, ArmSeed], reference: dict[int, ArmSeed], notes, stats,
                    what: str) -> dict:
    """`key`: the paired per-note F1 difference of an arm against a reference row (seeds averaged per note),
    with its bootstrap interval, Wilcoxon and sign tests (App. K "Statistics"); `<key>_interval`: the interval."""
    from mistill.stats import paired_comparison

    c = paired_comparison(per_note_mean_over_seeds(seeds, notes), per_note_mean_over_seeds(reference, notes),
                          n_resamples=stats.bootstrap_resamples, seed=stats.bootstrap_seed, confidence=stats.confidence)
    artifact, iv = f"{where(seeds)} vs {where(reference)}", c.mean_difference
    return {key: value(iv.estimate, paired_text(c, what), artifact),
            f"{key}_interval": value([iv.low, iv.high], f"{iv.confidence:.0%} percentile bootstrap interval of the mean per-note F1 "
                                     f"difference ({iv.n_resamples} resamples, seed {iv.seed})", artifact)}
