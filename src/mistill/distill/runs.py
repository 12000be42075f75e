"""Where a training run lives: the one naming rule that `dvc.yaml`'s outputs and the code share.

    <runs_dir>/<campaign>/student-<label>-<arm>-<precision>-s<seed>

`label` is the student's params key without its `student_` prefix (`student_qwen` -> `qwen`), never
the model's id or directory, so a run is named the same whichever checkpoint the profile loads.
The campaign is the paper's artifact name: DT-001 for Mistill, DT-000 for the baselines.

A variant of the Mistill recipe (params `variants.arms`: the no-window arm of R-D25, ...)
is named like an arm, by its entry's name, under the variants' own directory:

    <variants.dir>/DT-001/student-<label>-<variant>-<precision>-s<seed>

so a result that reads the main arms' directories whole never waits on a variant.
"""

from __future__ import annotations

from pathlib import Path

from mistill.errors import UserError

# what a variant may change of the recipe: `mistill distill train` options of the same names
# what a variant may change; `arm` names its objective (Mistill unless "vanilla": the Vanilla CoT-KD controls)
VARIANT_SWITCHES = ("arm", "window", "lambda_p1", "lambda_p2", "lambda_from", "dose", "terms", "write_norm", "heads", "k",
                    "pool_seed", "positions", "event_weight", "n_train", "targets_from")
VARIANT_IDENTITY = ("student", "seed", "precision")
VARIANT_RUN_OPTIONS = ("retrain",)   # how the run is made, not its recipe: train even where a main run has it
POSITION_RULES = ("events", "random")   # where the loss rows sit: the teacher's events, or RandPos (App. M.1)
# Mistill with fp32 master weights at the λ selected in bf16, three seeds (App. L.3): R-D17's arm, whose training
# logs also give R-D9 its fp32 memory
FP32_MISTILL_VARIANTS = ("fp32mistill", "fp32mistill1", "fp32mistill2")


def student_label(student_key: str) -> str:
    if not student_key.startswith("student_") or student_key == "student_":
        raise UserError(f"student {student_key!r}: students are params keys student_<label> (student_qwen, ...)")
    return student_key.removeprefix("student_")


def campaign(arm: str) -> str:
    return "DT-001" if arm == "mistill" else "DT-000"


def run_name(student_key: str, arm: str, precision: str, seed: int) -> str:
    return f"student-{student_label(student_key)}-{arm}-{precision}-s{int(seed)}"


def run_dir(runs_dir: str | Path, student_key: str, arm: str, precision: str, seed: int) -> Path:
    return Path(runs_dir) / campaign(arm) / run_name(student_key, arm, precision, seed)


def variant(variants: dict, name: str) -> dict:
    """One entry of params `variants.arms` (the section given), checked: its student, seed and precision (which name
    its run) and the recipe switches it changes."""
    arms = (variants or {}).get("arms") or {}
    if name not in arms:
        raise UserError(f"unknown recipe variant {name!r}; params variants.arms names "
                        f"{', '.join(sorted(arms)) or 'none'}")
    entry = dict(arms[name])
    missing = [k for k in VARIANT_IDENTITY if k not in entry]
    unknown = sorted(set(entry) - set(VARIANT_IDENTITY) - set(VARIANT_SWITCHES) - set(VARIANT_RUN_OPTIONS))
    if missing or unknown:
        raise UserError(f"params variants.arms.{name}: "
                        + "; ".join([f"missing {', '.join(missing)}"] * bool(missing)
                                    + [f"unknown switches {', '.join(unknown)} (known: "
                                       f"{', '.join(VARIANT_SWITCHES)})"] * bool(unknown)))
    return entry


def switch_options(entry: dict, switches) -> dict[str, object]:
    """The values `distill train` takes for those of `switches` an entry (a variant, a selection grid) sets, keyed
    by the switch, which is the option's name (`terms` as the option's comma list)."""
    return {s: ",".join(entry[s]) if s == "terms" else entry[s] for s in switches if s in entry}


def variant_label(name: str, entry: dict) -> str:
    """The variant's arm label (its run, evaluation and own-heads directories without the seed)."""
    return f"student-{entry['student']}-{name}-{entry['precision']}"


def variant_run_dir(variants_dir: str | Path, name: str, entry: dict) -> Path:
    return Path(variants_dir) / "DT-001" / f"{variant_label(name, entry)}-s{int(entry['seed'])}"
