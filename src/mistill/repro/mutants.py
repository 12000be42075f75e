"""Mutants: the distillation chain rerun with one link of the Mistill recipe broken, and the check that must catch it.

A check that passes whatever the method does tells nothing.  Each mutant (params `mutants.runs`, one
mapping of dotted params keys of the active profile to values, `null` removing a key) breaks one link:

* ``lambda0``: the attention term off, as λ_P1 = λ_P2 = 0 (no mechanism term enters the loss,
  `distill.terms: []`; the λ pick is an input the pipeline files name, so it stays): Mistill is
  Vanilla CoT-KD in bf16;
* ``random_heads``: random heads of the pool's layers in place of the selected set (`distill.heads: random`);
* ``other_notes``: each note trained towards another note's teacher targets (`mistill.distill.other_notes`);
* ``shifted_layers``: the selected heads moved one layer up (`distill.heads: shifted`, `mistill.distill.pools`).

Each runs as a replicate of the calibration does (`mistill.repro.replicates`): a scratch DVC project under
`mutants.scratch` whose inputs are hard links to this checkout's artifacts (`mutants.inputs`, plus every output
of the `mutants.kept` stages, which the mutation cannot reach: the Vanilla and untrained arms), whose
params.yaml is this one with the mutant's overrides, and where the `mutants.stages` run one
`dvc repro --single-item` after another.  The mutant's numbers files (`mutants.results`) are then checked
against the profile's expected values, and the record lists, per mutant, every key that fails; a mutant
that no headline key of `mutants.headline` fails (R-D5, R-D6) is one the check cannot tell from Mistill.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mistill.errors import UserError
from mistill.io import write_json
from mistill.repro.replicates import Replicate, run_replicates, stage_outs


@dataclass(frozen=True)
class MutantsConfig:
    """params.yaml `mutants` of the active profile, in the shape `run_replicates` reads."""

    scratch: Path
    out: Path
    inputs: tuple[str, ...]
    kept: tuple[str, ...]
    stages: tuple[str, ...]
    results: tuple[str, ...]
    headline: tuple[str, ...]
    replicates: tuple[Replicate, ...]
    held_out: tuple[Replicate, ...] = ()   # none: `run_replicates` reads it beside `replicates`

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> MutantsConfig:
        section = params.get("mutants")
        if not isinstance(section, dict):
            raise UserError("params.yaml: the active profile has no `mutants` section")
        try:
            runs = section["runs"]
            config = cls(scratch=Path(section["scratch"]), out=Path(section["out"]), inputs=tuple(section["inputs"]),
                         kept=tuple(section.get("kept") or ()), stages=tuple(section["stages"]),
                         results=tuple(section["results"]), headline=tuple(section["headline"]),
                         replicates=tuple(mutant(name, overrides) for name, overrides in runs.items()))
        except KeyError as err:
            raise UserError(f"params.yaml mutants: missing {err}") from None
        outside = [rid for rid in config.headline if rid not in config.results]
        if outside:
            raise UserError(f"params.yaml mutants.headline: {', '.join(outside)} not in mutants.results")
        return config

    def with_kept_outputs(self, repo: Path) -> MutantsConfig:
        """The inputs plus every output of the kept stages (linked, never rerun)."""
        kept = [out for outs in stage_outs(repo, self.kept).values() for out in outs] if self.kept else []
        return replace(self, inputs=tuple(dict.fromkeys([*self.inputs, *kept])))


def mutant(name: str, overrides: Any) -> Replicate:
    """A mutant as a replicate whose one perturbation is its params overrides."""
    if not isinstance(overrides, dict) or not overrides:
        raise UserError(f"params.yaml mutants.runs.{name}: a non-empty mapping of dotted params keys to values")
    return Replicate(name=str(name), params=tuple((str(k), v) for k, v in overrides.items()))


@dataclass(frozen=True)
class MutantOutcome:
    name: str
    overrides: dict[str, Any]
    failing: dict[str, list[str]]      # result id -> keys that fail
    headline_failing: list[str]        # "<id> <key>" of the headline results
    wall_s: float

    @property
    def caught(self) -> bool:
        return bool(self.headline_failing)


def check_mutant(name: str, overrides: dict[str, Any], results_dir: Path, config: MutantsConfig, profile: str,
                 wall_s: float) -> MutantOutcome:
    """The check of one mutant's numbers files: its failing keys by result."""
    from mistill.repro.check import run_check
    from mistill.repro.registry import load_registry

    report = run_check(load_registry(), profile, results_dir, list(config.results))
    failing: dict[str, list[str]] = {}
    for line in report.lines:
        if line.fails:
            failing.setdefault(line.result_id, []).append(line.key)
    headline = [f"{rid} {key}" for rid in config.headline for key in failing.get(rid, [])]
    return MutantOutcome(name, overrides, failing, headline, wall_s)


def run_mutants(repo: Path, params: dict[str, Any], names: list[str] | None = None, *, log=print
                ) -> list[MutantOutcome]:
    """Run the named mutants (default: all), check each; returns their outcomes in order."""
    config = MutantsConfig.from_params(params).with_kept_outputs(repo)
    chosen = config.replicates if not names else tuple(r for r in config.replicates if r.name in names)
    unknown = sorted(set(names or ()) - {r.name for r in config.replicates})
    if unknown:
        raise UserError(f"unknown mutant(s) {', '.join(unknown)}; params mutants.runs has "
                        f"{', '.join(r.name for r in config.replicates)}")
    outcomes = []
    for rep in chosen:
        start = time.perf_counter()
        done = run_replicates(repo, config, (rep,), log=log)
        outcomes.append(check_mutant(rep.name, dict(rep.params), done[rep.name], config, params["name"],
                                     round(time.perf_counter() - start, 1)))
        log(f"{rep.name}: {len(outcomes[-1].headline_failing)} headline keys fail"
            + (f" ({', '.join(outcomes[-1].headline_failing[:6])})" if outcomes[-1].headline_failing else ""))
    return outcomes


def outcome_table(outcomes: list[MutantOutcome]) -> str:
    """Markdown: one row per mutant, its overrides, whether a headline key fails, and the failing keys."""
    rows = ["| mutant | overrides | caught | failing keys (headline first) |", "|---|---|---|---|"]
    for o in outcomes:
        overrides = ", ".join(f"{k}={v}" for k, v in o.overrides.items())
        others = [f"{rid} {key}" for rid, keys in o.failing.items() for key in keys
                  if f"{rid} {key}" not in o.headline_failing]
        keys = o.headline_failing + others
        shown = ", ".join(keys[:12]) + (f", ... ({len(keys)} in all)" if len(keys) > 12 else "")
        rows.append(f"| {o.name} | {overrides} | {'yes' if o.caught else 'NO'} | {shown or '-'} |")
    return "\n".join(rows)


def write_record(path: Path, outcomes: list[MutantOutcome], profile: str) -> None:
    """The outcomes as JSON; a record already there keeps its other mutants (a run of some of them updates those)."""
    from mistill.io import code_version, read_json
    from mistill.repro.machine import cpu_type, describe_machine

    entries = {o.name: {"name": o.name, "overrides": o.overrides, "caught": o.caught,
                        "headline_failing": o.headline_failing, "failing": o.failing, "wall_s": o.wall_s,
                        "code_version": code_version(), "machine": describe_machine(), "cpu_type": cpu_type()}
               for o in outcomes}
    kept = read_json(path, "mutants record")["mutants"] if path.exists() else []
    merged = [entries.pop(e["name"], e) for e in kept] + list(entries.values())
    write_json(path, {"profile": profile, "mutants": merged})


def register(subparsers) -> None:
    """`mistill repro mutants [NAME ...] [--record PATH]`."""
    parser = subparsers.add_parser("mutants", help="rerun the chain with one link of the recipe broken; check each",
                                   description="Each mutant of params mutants.runs reruns the Mistill arms and the "
                                   "readers of mutants.results in a scratch workspace, then the check; the exit "
                                   "status is 1 when a mutant fails no headline key (mistill.repro.mutants).")
    parser.add_argument("names", nargs="*", help="mutants of params mutants.runs (default: all)")
    parser.add_argument("--record", type=Path, help="write the outcomes as JSON here (benchmarks/results/...)")
    parser.set_defaults(func=cmd_mutants)


def cmd_mutants(args) -> int:
    from mistill.params import load_params

    params = load_params()
    outcomes = run_mutants(Path("."), params, args.names)
    print(outcome_table(outcomes))
    if args.record:
        write_record(args.record, outcomes, params["name"])
        print(f"-> {args.record}")
    return 0 if all(o.caught for o in outcomes) else 1

