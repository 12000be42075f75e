"""Replicates: the distillation chain rerun under what another machine brings.

A demo value is worth checking only to the precision at which it holds on someone else's
computer. This module measures that: it reruns the distillation chain (params
`calibration.stages`) several times, each time under one perturbation a user's machine or the
paper's protocol brings, and collects the numbers files each rerun writes. `calibration.py`
turns their spread into tolerances.

The perturbations (`calibration.replicates`, one mapping per replicate):

* ``threads``: the stages' thread count (`models.threads`): another core count changes the
  order of floating-point reductions inside matrix products and softmaxes;
* ``train_seed``: another training seed (`distill.seeds`), as the paper's protocol reruns arms;
* ``weight_jitter`` (with ``jitter_seed``): every floating-point weight of each student
  multiplied by ``1 + weight_jitter * N(0, 1)`` before anything reads it, a perturbation of a
  few units in the last place that stands in for a CPU whose kernels round differently. The
  teacher is not perturbed: its traces are byte-identical across the machines we compared.
* ``env``: environment variables for every stage command, such as
  ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI`` and ``MKL_ENABLE_INSTRUCTIONS=AVX512``, which make
  oneDNN and MKL take the kernels of a CPU without AVX512-BF16 and AMX.

``not_read`` names results of `calibration.results` the replicate does not read: a ``train_seed``
replicate trains one seed, and the seed readouts (seed-to-seed differences, the third seed's values)
need the profile's seeds. Their reader stages are left out of its run, and their values' spreads
come from the other replicates.

`calibration.held_out` lists replicates of the same form that are run, after the others, but never
measured: they test the calibrated tolerances on a perturbation the calibration did not see (the demo's emulates
the instruction set of a second machine on which an uncalibrated run failed).

A replicate runs in a scratch workspace of its own (`<calibration.scratch>/<name>`): a DVC
project whose inputs (`calibration.inputs`: the world data, the teacher's traces, events, head
sets and distillation targets) are hard links to this checkout's artifacts, whose model
directory is a copy (perturbed or not), and whose `params.yaml` is this one with the
replicate's overrides. The very stage definitions of the pipeline files run there, one
`dvc repro --single-item <stage>` after another, so a replicate executes the commands the
pipeline executes. None of those stages writes an input (`check_inputs_not_written`), so the
hard links never let a replicate touch this checkout.

Every run lays each workspace out again from this checkout (code, pipeline files, params, fresh
links to the inputs) and keeps the workspace's own DVC state, so DVC decides what is still valid:
a killed calibration resumes stage by stage, and a replicate whose numbers were written
(`replicate.json`) is skipped only while `dvc status` finds all its stages up to date. After a
re-bless from new inputs, or a change of the code a stage depends on, the stages that read them
run again instead of the old numbers being reused. Each replicate runs under a lock of its own, so
on a machine with more cores several `mistill repro calibrate run` processes share the replicates.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from filelock import FileLock, Timeout

from mistill.errors import UserError
from mistill.io import write_json
from mistill.repro.families import FamilyStage, family_files, pipeline_families, stale_items
from mistill.repro.machine import cpu_type, describe_machine
from mistill.repro.pipeline import pipeline_files, stage_addresses

# What a replicate workspace needs besides its inputs: the pipeline files (mistill.repro.pipeline), the
# registry and the readers (DVC hashes them as dependencies; the commands run the installed package).
PROJECT_FILES = ("registry.yaml", ".dvcignore")
PROJECT_TREES = ("src", "readers", "results/expected")
DONE_FILE = "replicate.json"


@dataclass(frozen=True)
class Replicate:
    """One rerun of the chain and the one perturbation it brings (None / 0: as the pipeline runs)."""

    name: str
    threads: int | None = None
    train_seed: int | None = None
    weight_jitter: float = 0.0
    jitter_seed: int = 0
    env: tuple[tuple[str, str], ...] = ()
    not_read: tuple[str, ...] = ()     # results its perturbation leaves unreadable (the module docstring)
    params: tuple[tuple[str, Any], ...] = ()   # (dotted key of the active profile, value; None removes the key)

    def describe(self) -> str:
        parts = [" ".join(f"{k}={v}" for k, v in self.env)] if self.env else []
        parts += [f"{key}={'(removed)' if value is None else value}" for key, value in self.params]
        if self.threads is not None:
            parts.append(f"{self.threads} thread(s)")
        if self.train_seed is not None:
            parts.append(f"training seed {self.train_seed}")
        if self.weight_jitter:
            parts.append(f"student weights x (1 + {self.weight_jitter:g} N(0,1)), seed {self.jitter_seed}")
        return ", ".join(parts) or "no perturbation"


@dataclass(frozen=True)
class CalibrationConfig:
    """params.yaml `calibration` of the active profile."""

    scratch: Path
    out: Path
    inputs: tuple[str, ...]
    stages: tuple[str, ...]
    results: tuple[str, ...]
    family_alpha: float                 # the chance a whole run may breach any calibrated tolerance (calibration.py)
    replicates: tuple[Replicate, ...]
    held_out: tuple[Replicate, ...] = ()
    reference: Path | None = None       # the replicates' machine's unperturbed numbers files, if not the goldens'

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> CalibrationConfig:
        section = params.get("calibration")
        if not isinstance(section, dict):
            raise UserError("params.yaml: the active profile has no `calibration` section")
        try:
            config = cls(scratch=Path(section["scratch"]), out=Path(section["out"]),
                         inputs=tuple(section["inputs"]), stages=tuple(section["stages"]),
                         results=tuple(section["results"]), family_alpha=float(section["family_alpha"]),
                         replicates=_replicates(section["replicates"], "replicates"),
                         held_out=_replicates(section.get("held_out"), "held_out"),
                         reference=Path(section["reference"]) if section.get("reference") else None)
        except KeyError as err:
            raise UserError(f"params.yaml calibration: missing {err}") from None
        names = [r.name for r in config.replicates + config.held_out]
        if len(set(names)) != len(names):
            raise UserError("params.yaml calibration: replicates and held_out need distinct names")
        if not 0 < config.family_alpha < 1:
            raise UserError(f"params.yaml calibration.family_alpha must lie in (0, 1), got {config.family_alpha}")
        for where, reps in (("replicates", config.replicates), ("held_out", config.held_out)):
            for rep in reps:
                if rep.weight_jitter < 0 or (rep.threads is not None and rep.threads < 1):
                    raise UserError(f"params.yaml calibration.{where}.{rep.name}: weight_jitter >= 0 and threads >= 1")
                unknown = [rid for rid in rep.not_read if rid not in config.results]
                if unknown:
                    raise UserError(f"params.yaml calibration.{where}.{rep.name}.not_read: {', '.join(unknown)} "
                                    "not in calibration.results")
        return config


REPLICATE_FIELDS = ("threads", "train_seed", "weight_jitter", "jitter_seed", "env", "not_read")


def _replicates(section: dict[str, Any] | None, where: str) -> tuple[Replicate, ...]:
    out = []
    for name, spec in (section or {}).items():
        spec = dict(spec or {})
        unknown = set(spec) - set(REPLICATE_FIELDS)
        if unknown:
            raise UserError(f"params.yaml calibration.{where}.{name}: unknown field(s) {', '.join(sorted(unknown))} "
                            f"({', '.join(REPLICATE_FIELDS)})")
        env = spec.pop("env", None) or {}
        if not isinstance(env, dict):
            raise UserError(f"params.yaml calibration.{where}.{name}.env: a mapping of variable -> value")
        not_read = spec.pop("not_read", None) or []
        if not isinstance(not_read, list):
            raise UserError(f"params.yaml calibration.{where}.{name}.not_read: a list of result ids")
        out.append(Replicate(name=str(name), env=tuple(sorted((str(k), str(v)) for k, v in env.items())),
                             not_read=tuple(str(rid) for rid in not_read), **spec))
    return tuple(out)


def replicate_params(data: dict[str, Any], rep: Replicate) -> dict[str, Any]:
    """The whole params.yaml mapping with `rep`'s overrides applied to the active profile.

    `profile: *demo` loads as the very same dict as `demo`, so one change reaches both, and
    `yaml.safe_dump` writes the shared dict back as an anchor and its alias.
    """
    data = copy.deepcopy(data)
    active = data["profile"]
    if rep.threads is not None:
        active["models"]["threads"] = rep.threads
    if rep.train_seed is not None:
        base = int(active["distill"]["seeds"][0])
        active["distill"]["seeds"] = [rep.train_seed]
        # a recipe variant is read beside Mistill at its own seed (R-D25), so it moves with the arms, keeping
        # its offset from the first seed (R-D14's RandHeads at seed 1)
        for entry in ((active.get("variants") or {}).get("arms") or {}).values():
            entry["seed"] = rep.train_seed + int(entry["seed"]) - base
    for dotted, value in rep.params:
        *path, last = dotted.split(".")
        section = active
        for name in path:
            if not isinstance(section.get(name), dict):
                raise UserError(f"replicate {rep.name}: params {dotted}: no section {name!r} in the active profile")
            section = section[name]
        if value is None:
            section.pop(last, None)
        else:
            section[last] = value
    return data


def jitter_weights(src: Path, dst: Path, scale: float, seed: int) -> int:
    """Copy a model directory, multiplying each floating tensor of its safetensors files by
    ``1 + scale * N(0, 1)`` (one generator per file, seeded by ``(seed, file index)``); returns the
    number of tensors perturbed. The arithmetic is float64, then cast back to the tensor's dtype."""
    import numpy as np
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    shutil.copytree(src, dst, dirs_exist_ok=True)
    perturbed = 0
    for index, path in enumerate(sorted(src.glob("*.safetensors"))):
        rng = np.random.default_rng([seed, index])
        tensors = {}
        with safe_open(path, framework="pt") as fh:
            metadata = fh.metadata()
            for name in sorted(fh.keys()):
                t = fh.get_tensor(name)
                if t.is_floating_point():
                    noise = torch.from_numpy(rng.standard_normal(tuple(t.shape)))
                    t = (t.double() * (1.0 + scale * noise)).to(t.dtype)
                    perturbed += 1
                tensors[name] = t.contiguous()
        save_file(tensors, str(dst / path.name), metadata=metadata)
    return perturbed


def check_inputs_not_written(config: CalibrationConfig, outs_by_stage: dict[str, list[str]]) -> None:
    """Refuse a configuration in which a replicate stage would write into a hard-linked input."""
    for stage, outs in outs_by_stage.items():
        for out in outs:
            for inp in config.inputs:
                if out == inp or out.startswith(inp.rstrip("/") + "/") or inp.startswith(out.rstrip("/") + "/"):
                    raise UserError(f"calibration: stage {stage} writes {out}, which is the hard-linked input {inp}; "
                                    "remove it from calibration.inputs (the replicate rebuilds it)")


def _link_tree(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, copy_function=os.link, dirs_exist_ok=True)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            os.link(src, dst)


@dataclass
class Workspace:
    """A replicate's scratch DVC project under `config.scratch`."""

    root: Path
    rep: Replicate

    def build(self, repo: Path, data: dict[str, Any], config: CalibrationConfig) -> None:
        """Lay the workspace out from this checkout: create it, or refresh every copied file and input link of
        an existing one while keeping its DVC state (`.dvc`, lock files, stage outputs), so that `dvc repro`
        there reruns exactly the stages whose code, inputs or params changed since."""
        if self.root.exists() and not (self.root / ".dvc").is_dir():
            shutil.rmtree(self.root)              # a half-built workspace from a killed run
        self.root.mkdir(parents=True, exist_ok=True)
        for name in [*pipeline_files(repo), *family_files(repo), *PROJECT_FILES]:
            if (repo / name).exists():
                (self.root / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(repo / name, self.root / name)
        for tree in PROJECT_TREES:
            _replace(self.root / tree)
            if (repo / tree).exists():
                shutil.copytree(repo / tree, self.root / tree,
                                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for inp in config.inputs:
            if not (repo / inp).exists():
                raise UserError(f"calibration input {inp} is missing: run `dvc repro` first")
            _replace(self.root / inp)             # a re-blessed input is a new file: link that one
            _link_tree(repo / inp, self.root / inp)
        params = replicate_params(data, self.rep)
        models_dir = Path(params["profile"]["models"]["dir"])
        if not (repo / models_dir).is_dir():
            raise UserError(f"calibration: models directory {models_dir} is missing")
        for model in sorted(p for p in (repo / models_dir).iterdir() if p.is_dir()):
            target = self.root / models_dir / model.name
            _replace(target)
            if self.rep.weight_jitter and model.name.startswith("student"):
                jitter_weights(model, target, self.rep.weight_jitter, self.rep.jitter_seed)   # same seed, same bytes
            else:
                _link_tree(model, target)
        with (self.root / "params.yaml").open("w", encoding="utf-8") as fh:
            fh.write(f"# replicate {self.rep.name}: {self.rep.describe()}\n")
            yaml.safe_dump(params, fh, sort_keys=False, width=120)
        if not (self.root / ".dvc").is_dir():
            _dvc(["init", "--no-scm", "-q"], self.root)
            _dvc(["config", "core.analytics", "false"], self.root)

    def up_to_date(self, stages: dict[str, str | FamilyItemTarget]) -> bool:
        """Whether DVC finds every stage's outputs current with its code, inputs and params here, and every
        family item's its recorded key."""
        dvc_targets = [t for t in stages.values() if isinstance(t, str)]
        items = [t for t in stages.values() if isinstance(t, FamilyItemTarget)]
        if dvc_targets and _dvc(["status", "--quiet", *dvc_targets], self.root, check=False) != 0:
            return False
        return not any(stale_items(self.root, t.family_file, t.family, [t.item]) for t in items)

    def run_stages(self, stages: dict[str, str | FamilyItemTarget], log) -> list[dict[str, Any]]:
        """Run each stage (name -> its DVC target, or a family item) alone, in order; return their wall times."""
        times = []
        for stage, target in stages.items():
            start = time.perf_counter()
            if isinstance(target, FamilyItemTarget):
                _family_item(target, self.root, dict(self.rep.env))
            else:
                _dvc(["repro", "--single-item", target], self.root, dict(self.rep.env))
            seconds = time.perf_counter() - start
            times.append({"stage": stage, "wall_s": round(seconds, 1)})
            log(f"  {self.rep.name}: {stage} {seconds:.0f} s")
        return times


@dataclass(frozen=True)
class FamilyItemTarget:
    """An item of a family stage (mistill.repro.families), run alone as the family stage would run it."""

    family_file: str
    family: str
    item: str


def _family_item(target: FamilyItemTarget, cwd: Path, extra_env: dict[str, str]) -> None:
    """Run one family item in a workspace, as the family stage runs it (its output to the workspace's log)."""
    args = ["repro", "family", target.family_file, target.family, "--item", target.item]
    _in_workspace([sys.executable, "-m", "mistill.cli", *args], f"mistill {' '.join(args)}", cwd, extra_env)


def calibration_targets(repo: Path, stages: tuple[str, ...]) -> dict[str, str | FamilyItemTarget]:
    """Each name of calibration.stages as what runs it: a DVC target, or an item of a family stage
    (`DT-variant@nowindow`, which a family stage runs among its items)."""
    items = _family_items(repo)
    targets = stage_addresses(repo, [s for s in stages if s not in items])
    for name in stages:
        if name in items:
            family = items[name]
            targets[name] = FamilyItemTarget(family.family_file, family.family, name)
    return {name: targets[name] for name in stages}


def _family_items(repo: Path) -> dict[str, FamilyStage]:
    """Every item name of the pipeline's family stages -> its family stage."""
    from dvc.repo import Repo

    with Repo(str(repo)) as dvc_repo:
        families = pipeline_families(repo, dvc_repo.index.stages)
    return {item.name: family for family in families.values() for item in family.items}


def _dvc(args: list[str], cwd: Path, extra_env: dict[str, str] | None = None, *, check: bool = True) -> int:
    """Run `dvc` in a workspace (stage commands inherit `extra_env`); see `_in_workspace`."""
    if shutil.which("dvc", path=_tools_path()) is None:
        raise UserError("calibration needs the `dvc` command (pip install -e '.[dev]')")
    # `dvc` without its per-stage rewrite of a whole dvc.lock and re-reads of params.yaml (mistill.repro.dvc_run)
    return _in_workspace([sys.executable, "-m", "mistill.repro.dvc_run", *args], f"dvc {' '.join(args)}", cwd,
                         extra_env, check=check)


def _tools_path() -> str:
    return f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"   # this environment's tools


def _in_workspace(argv: list[str], shown: str, cwd: Path, extra_env: dict[str, str] | None = None, *,
                  check: bool = True) -> int:
    """Run `argv` in a workspace with `extra_env`: its output goes to the workspace's log, a failure names it
    (or, with `check=False`, its exit status is returned)."""
    env = {**os.environ, **(extra_env or {}), "DVC_NO_ANALYTICS": "1", "PATH": _tools_path()}
    for var in ("DVC_STAGE", "DVC_ROOT"):        # the calibration's own stage is not the replicate's
        env.pop(var, None)
    log_path = cwd / "replicate.log"
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"$ {shown}\n")
        log.flush()
        done = subprocess.run(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env)
    if check and done.returncode != 0:
        raise UserError(f"calibration: `{shown}` failed in {cwd} (exit {done.returncode}); see {log_path}")
    return done.returncode


def _replace(path: Path) -> None:
    """Remove what a refresh lays out again (a tree, a link or nothing)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def stage_outs(repo: Path, stages: tuple[str, ...]) -> dict[str, list[str]]:
    """Each named stage's outputs (metrics included), as the pipeline files resolve them here: a stage group names
    every item of a foreach stage, `group@item` one of them."""
    return _stage_paths(repo, stages, "outs")


def stage_deps(repo: Path, stages: tuple[str, ...]) -> dict[str, list[str]]:
    """Each named stage's path dependencies (params files left out), named as `stage_outs` names them."""
    return _stage_paths(repo, stages, "deps")


def _stage_paths(repo: Path, stages: tuple[str, ...], kind: str) -> dict[str, list[str]]:
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    paths: dict[str, list[str]] = {}
    with Repo(str(repo)) as dvc_repo:
        for stage in dvc_repo.index.stages:
            name = getattr(stage, "name", "")
            for key in {name, name.split("@")[0]} & set(stages):
                paths.setdefault(key, []).extend(
                    Path(os.path.relpath(p.fs_path, repo)).as_posix() for p in getattr(stage, kind)
                    if not isinstance(p, ParamsDependency))
        for family in pipeline_families(repo, dvc_repo.index.stages).values():
            for item in family.items:
                if item.name in stages:      # an item of a family stage: its own outputs and dependencies
                    paths[item.name] = [out for out, _ in item.outs] if kind == "outs" else list(item.deps)
    missing = [s for s in stages if s not in paths]
    if missing:
        raise UserError(f"calibration.stages names stage(s) no pipeline file defines: {', '.join(missing)}")
    return paths


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def check_inputs_cover_deps(config: CalibrationConfig, deps_by_stage: dict[str, list[str]],
                            outs_by_stage: dict[str, list[str]], artifacts: str = "artifacts") -> None:
    """Refuse a configuration in which a replicate stage reads an artifact that is neither a hard-linked
    input nor written by a replicate stage: the replicate would fail on it after minutes of training.
    (A dependency on a directory that replicate stages fill, such as a runs directory, is covered.)"""
    provided = [*config.inputs, *(out for outs in outs_by_stage.values() for out in outs)]
    for stage, deps in deps_by_stage.items():
        for dep in deps:
            if not _within(dep, artifacts):
                continue         # code, readers, models: the workspace copies them
            if not any(_within(dep, p) or _within(p, dep) for p in provided):
                raise UserError(f"calibration: stage {stage} reads {dep}, which no replicate stage writes and "
                                "calibration.inputs does not list; add it to calibration.inputs")


def check_stage_order(config: CalibrationConfig, deps_by_stage: dict[str, list[str]],
                      outs_by_stage: dict[str, list[str]], artifacts: str = "artifacts") -> None:
    """Refuse a stage listed before a replicate stage that writes what it reads: the stages run one by one
    in the listed order, so it would fail on a missing file, or read a stale one, after minutes of training."""
    order = list(config.stages)
    for i, stage in enumerate(order):
        for dep in deps_by_stage[stage]:
            if not _within(dep, artifacts) or any(_within(dep, inp) for inp in config.inputs):
                continue
            later = [s for s in order[i + 1:] if any(_within(o, dep) or _within(dep, o) for o in outs_by_stage[s])]
            if later:
                raise UserError(f"calibration.stages: {stage} reads {dep}, which {later[0]} writes, listed after "
                                f"it; list {later[0]} first")


def run_replicates(repo: Path, config: CalibrationConfig, replicates: tuple[Replicate, ...] | None = None, *,
                   log=print) -> dict[str, Path]:
    """Run each of `replicates` (default: every replicate, then every held-out one) not yet done and not held by
    another process; return the numbers files' directory of each one done, by name.

    Each replicate is run under a lock of its own (`<scratch>/<name>.lock`), so several processes may share
    the work, on a machine with more cores: each runs the next replicate no other one holds, and leaves a
    held one to the process that holds it."""
    from mistill.params import load_all

    if not config.replicates:
        raise UserError("params.yaml calibration.replicates is empty: this profile has no replicates to run "
                        "(its expected values are not calibrated here)")
    targets = calibration_targets(repo, config.stages)
    outs = stage_outs(repo, config.stages)
    deps = stage_deps(repo, config.stages)
    check_inputs_not_written(config, outs)
    check_inputs_cover_deps(config, deps, outs)
    check_stage_order(config, deps, outs)
    data = load_all(repo / "params.yaml")
    (repo / config.scratch).mkdir(parents=True, exist_ok=True)
    done: dict[str, Path] = {}
    pending = list(config.replicates + config.held_out if replicates is None else replicates)
    for last_pass in (False, True):         # the second pass takes up what others have finished meanwhile
        held_elsewhere = []
        for rep in pending:
            lock = FileLock(repo / config.scratch / f"{rep.name}.lock")
            try:
                lock.acquire(timeout=0)
            except Timeout:
                if last_pass:
                    log(f"{rep.name}: running in another process, left to it")
                held_elsewhere.append(rep)
                continue
            try:
                done[rep.name] = _run_one(repo, config, rep, data, targets, log)
            finally:
                lock.release()
        pending = held_elsewhere
    return done


def _run_one(repo: Path, config: CalibrationConfig, rep: Replicate, data: dict[str, Any],
             targets: dict[str, str | FamilyItemTarget], log) -> Path:
    """One replicate, under its lock: its workspace laid out again, its stages run unless DVC finds them all
    current and its numbers were written, its numbers copied out; returns their directory."""
    out_dir = repo / config.out / rep.name
    targets = {stage: address for stage, address in targets.items() if stage not in rep.not_read}
    workspace = Workspace(repo / config.scratch / rep.name, rep)
    workspace.build(repo, data, config)
    if (out_dir / DONE_FILE).exists() and workspace.up_to_date(targets):
        log(f"{rep.name}: done earlier, every stage up to date ({rep.describe()})")
        return out_dir
    (out_dir / DONE_FILE).unlink(missing_ok=True)      # its numbers are stale until the rerun ends
    log(f"{rep.name}: {rep.describe()}")
    start = time.perf_counter()
    times = workspace.run_stages(targets, log)
    out_dir.mkdir(parents=True, exist_ok=True)
    for rid in (r for r in config.results if r not in rep.not_read):
        source = workspace.root / "results" / f"{rid}.json"
        if not source.exists():
            raise UserError(f"calibration: replicate {rep.name} wrote no results/{rid}.json")
        shutil.copy2(source, out_dir / source.name)
    write_json(out_dir / DONE_FILE, {"replicate": asdict(rep), "perturbation": rep.describe(),
                                     "held_out": rep in config.held_out, "machine": describe_machine(),
                                     "cpu_type": cpu_type(),
                                     "wall_s": round(time.perf_counter() - start, 1), "stages": times})
    return out_dir
