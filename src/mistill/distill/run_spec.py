"""One distillation run with every choice resolved: what `distill train`, a recipe variant and a λ-grid cell train.

A run is named by options (the `distill train` options, a variant entry's switches, a selection grid cell), and
each is resolved here, once, in one precedence: an option given (the command line, a grid cell), then the
variant entry it names (params `variants.arms.<name>`), then params `distill`. λ likewise, in one step:

* a Vanilla CoT-KD run has none (its record keeps `ArmConfig`'s defaults);
* a Mistill run takes each of λ_P1, λ_P2 given, and the other from the pick of the selection grid its
  `lambda_from` names (the option, the variant's, else params `distill.lambda_from`; the pick is the stage
  DT-select@<grid>'s file) or from fixed params `distill.lambda_p1` / `lambda_p2`;
* `dose: match` (App. M.1) replaces both with the value that matches Mistill's first-step extra loss once the
  trainer is built (`mistill.distill.training_run`), so it takes neither given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mistill.distill.runs import VARIANT_SWITCHES, run_dir, variant, variant_run_dir
from mistill.distill.selection_grids import selected_lambdas
from mistill.errors import UserError

OPTIONS = ("arm", "student", "teacher", "targets", "head_sets", "precision", "seed", "lambda_p1", "lambda_p2",
           "lambda_from", "terms", "write_norm", "window", "dose", "heads", "pool_seed", "event_weight", "positions",
           "k", "n_train", "lr", "max_steps", "retrain", "variant", "out", "targets_from")
TARGET_SOURCES = ("own", "other_notes")   # whose teacher targets a note is trained towards (other_notes: a mutant)


@dataclass(frozen=True)
class RunSpec:
    arm: str                                  # vanilla | mistill
    student: str                              # params models key or a model spec
    precision: str                            # bf16 | fp32
    seed: int
    out: Path                                 # the run directory
    lambdas: tuple[float, float] | None       # (λ_P1, λ_P2) of a Mistill run, before a dose match
    terms: tuple[str, ...]
    write_norm: bool
    window: int
    event_weight: float
    heads: str                                # top | bottom | random | uniform
    k: int                                    # the student's pool size
    pool_seed: int
    positions: str                            # events | random (RandPos)
    targets_from: str                         # own | other_notes (mistill.distill.other_notes, a mutant)
    head_sets: str | None                     # the student's head sets (a Mistill run)
    targets: Path
    teacher: str
    n_train: int | None
    lr: float | None
    dose: str | None
    retrain: bool
    max_steps: int | None

    @classmethod
    def resolve(cls, params: Mapping[str, Any], options: Mapping[str, Any]) -> RunSpec:
        """The run `options` name (keys of OPTIONS, None where not given) under `params`."""
        unknown = sorted(set(options) - set(OPTIONS) - {"func", "group", "command"})
        if unknown:
            raise UserError(f"distill run: unknown options {', '.join(unknown)}")
        given = {name: options.get(name) for name in OPTIONS}
        cfg = params["distill"]
        out = Path(given["out"]) if given["out"] else None
        if given["variant"]:   # its switches always apply; an option given overrides them; `out` moves the directory
            entry = variant(params.get("variants") or {}, given["variant"])
            if given["arm"] is not None and given["arm"] != entry.get("arm", "mistill"):
                raise UserError(f"--variant {given['variant']} trains the {entry.get('arm', 'mistill')} objective, "
                                f"not --arm {given['arm']}")
            given["student"] = given["student"] or f"student_{entry['student']}"
            for name in ("seed", "precision", *VARIANT_SWITCHES):
                if given[name] is None and name in entry:
                    given[name] = ",".join(entry[name]) if name == "terms" else entry[name]
            given["retrain"] = bool(given["retrain"]) or bool(entry.get("retrain", False))
            out = out or variant_run_dir(params["variants"]["dir"], given["variant"], entry)
        if given["arm"] is None and not given["variant"]:
            raise UserError("name the objective with --arm (vanilla or mistill), or a recipe variant with --variant")
        arm = given["arm"] or "mistill"   # a variant that names no arm varies the Mistill recipe
        if given["dose"] == "match" and (arm != "mistill" or given["lambda_p1"] is not None
                                         or given["lambda_p2"] is not None):
            raise UserError("--dose match sets lambda_p1 and lambda_p2 of a Mistill run itself; give neither")
        student = given["student"] or "student_qwen"
        precision = given["precision"] or cfg["precision"][arm]
        seed = int(given["seed"] if given["seed"] is not None else cfg["seeds"][0])
        terms = given["terms"] or ",".join(cfg["terms"])
        return cls(
            arm=arm, student=student, precision=precision, seed=seed,
            out=out or run_dir(cfg["runs_dir"], student, arm, precision, seed),
            lambdas=mistill_lambdas(params, given) if arm == "mistill" else None,
            terms=tuple(t.strip() for t in str(terms).split(",") if t.strip()),
            write_norm=bool(given["write_norm"] or cfg["write_norm"]),
            window=int(given["window"] if given["window"] is not None else cfg["window"]),
            event_weight=float(given["event_weight"] if given["event_weight"] is not None else 1.0),
            heads=given["heads"] or cfg["heads"],
            k=int(given["k"] or cfg["pool_k"]["student"]),
            pool_seed=int(cfg["pool_seed"] if given["pool_seed"] is None else given["pool_seed"]),
            positions=given["positions"] or "events",
            targets_from=target_source(given["targets_from"] or cfg.get("targets_from") or "own"),
            head_sets=given["head_sets"] or (cfg["student_head_sets"].get(student) if arm == "mistill" else None),
            targets=Path(given["targets"] or cfg["targets_dir"]),
            teacher=given["teacher"] or params["models"]["teacher"],
            n_train=None if given["n_train"] is None else int(given["n_train"]),
            lr=None if given["lr"] is None else float(given["lr"]),
            dose=given["dose"], retrain=bool(given["retrain"]),
            max_steps=None if given["max_steps"] is None else int(given["max_steps"]))


def target_source(name: str) -> str:
    if name not in TARGET_SOURCES:
        raise UserError(f"distill run: targets_from {name!r} is not one of {', '.join(TARGET_SOURCES)}")
    return name


def mistill_lambdas(params: Mapping[str, Any], given: Mapping[str, Any]) -> tuple[float, float]:
    """(λ_P1, λ_P2): each given one, the other from the recipe (`recipe_lambdas`)."""
    p1, p2 = given.get("lambda_p1"), given.get("lambda_p2")
    if p1 is not None and p2 is not None:
        return float(p1), float(p2)
    base = recipe_lambdas(params, given.get("lambda_from"))
    return float(base[0] if p1 is None else p1), float(base[1] if p2 is None else p2)


def recipe_lambdas(params: Mapping[str, Any], grid: str | None = None) -> tuple[float, float]:
    """The recipe's λ_P1, λ_P2: the pick of the selection grid `grid` or, without one, of the grid params
    distill.lambda_from names (App. I.3; the stage DT-select@<grid>, a dependency of every run that reads it),
    or fixed distill.lambda_p1/lambda_p2."""
    if grid:
        return selected_lambdas(params.get("selection") or {}, grid)
    cfg = params["distill"]
    fixed = "lambda_p1" in cfg or "lambda_p2" in cfg
    if cfg.get("lambda_from") and fixed:
        raise UserError("params distill: give lambda_from (a selection grid) or lambda_p1 and lambda_p2, not both")
    if cfg.get("lambda_from"):
        return selected_lambdas(params.get("selection") or {}, cfg["lambda_from"])
    if not ("lambda_p1" in cfg and "lambda_p2" in cfg):
        raise UserError("params distill: no loss weights; give lambda_from (a selection grid) or lambda_p1 and lambda_p2")
    return float(cfg["lambda_p1"]), float(cfg["lambda_p2"])
