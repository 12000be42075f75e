"""The matched selection (App. M.2; readers R-D31, R-D32): one validation rule for Mistill and a frozen random pool.

The RandHeads runs of Table 51 train at Mistill's selected λ, while Mistill's λ was selected for Mistill. App. M.2
removes the asymmetry: each family gets its own grid under the same rule (`mistill.distill.selection`; the same
λs, tie band and outward step, on the same student, seed and precision), and three test seeds at each pick. The
families are recipe variants (params variants.arms), each naming its grid in `lambda_from`:

* Mistill: `mistillpick`, `mistillpick1`, `mistillpick2`;
* RandHeads on the frozen pool: `randheadspick`, `randheadspick1`, `randheadspick2` (heads: random, one pool seed,
  the pool its grid drew).

Seed i of one family is paired with seed i of the other. `Family` reads a family's grid, its runs' own-heads
readouts and its evaluations; `matched_families` checks that the two are what App. M.2 compares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from mistill.distill.runs import variant
from mistill.distill.selection import Cell
from mistill.distill.selection_grids import grid_entry, read_selection, selection_cells, selection_file
from mistill.errors import UserError
from mistill.evaluate.readout import ArmSeed
from mistill.evaluate.variants import VariantReadout

FAMILIES = {"mistill": ("mistillpick", "mistillpick1", "mistillpick2"),
            "randheads": ("randheadspick", "randheadspick1", "randheadspick2"),
            # the fp32 re-selection (App. I.4; R-D22, R-D30): Mistill with fp32 master weights at its own pick
            "fp32": ("fp32pick", "fp32pick1", "fp32pick2")}
# what the two grids must share for one protocol: the rule and the line it selects on
SHARED = ("student", "seed", "precision", "lambdas", "band", "extend")


@dataclass
class Family:
    """One family of App. M.2: its grid's pick file and its test runs at the pick, by seed."""

    name: str
    params: dict
    grid: str = field(init=False)
    entry: dict = field(init=False)     # params selection.grids.<grid>
    chosen: dict = field(init=False)    # the pick file
    runs: dict[int, VariantReadout] = field(init=False)

    def __post_init__(self):
        entries = {run: variant(self.params.get("variants") or {}, run) for run in FAMILIES[self.name]}
        grids = {e.get("lambda_from") for e in entries.values()}
        if len(grids) != 1 or None in grids:
            raise UserError(f"params variants.arms {', '.join(entries)}: the {self.name} family's runs must name one "
                            f"selection grid in lambda_from; found {sorted(map(str, grids))}")
        self.grid = grids.pop()
        selection = self.params.get("selection") or {}
        self.entry = grid_entry(selection, self.grid)
        self.chosen = read_selection(selection, self.grid)
        self.runs = {int(e["seed"]): VariantReadout(run, self.params) for run, e in entries.items()}
        if len(self.runs) != len(entries):
            raise UserError(f"params variants.arms {', '.join(entries)}: the {self.name} family's runs need distinct seeds")
        for seed, run in self.runs.items():   # the runs trained at the pick, or they are not the pick's test runs
            trained = run.run_config()["arm"]
            if not all(math.isclose(float(trained[f"lambda_{p}"]), self.lam) for p in ("p1", "p2")):
                raise UserError(f"{run.run_config_path}: trained at lambda_P1 {trained['lambda_p1']}, lambda_P2 "
                                f"{trained['lambda_p2']}, not grid {self.grid}'s pick {self.lam:g}; re-run "
                                f"`dvc repro pipelines/distill/dvc.yaml:DT-variant@{run.name}`")

    @property
    def seeds(self) -> list[int]:
        return sorted(self.runs)

    @property
    def cells(self) -> list[Cell]:
        return selection_cells(self.chosen)

    @property
    def lam(self) -> float:
        return float(self.chosen["selected"]["lambda_p1"])

    @property
    def pick_file(self) -> Path:
        return selection_file(self.params["selection"], self.grid)

    def recovery(self, phase: str, k: int) -> dict[int, dict[str, float]]:
        """{seed: {note: own top-k recovery at the phase}}."""
        return {seed: run.notes_of("variant", phase, k) for seed, run in self.runs.items()}

    def lift(self, phase: str) -> dict[int, dict[str, float]]:
        """{seed: {note: M2 region lift of the own top read-side heads at the phase}}."""
        return {seed: run.lift_notes("variant", phase) for seed, run in self.runs.items()}

    def evaluations(self) -> dict[int, ArmSeed]:
        return {seed: run.evaluation("variant") for seed, run in self.runs.items()}

    def where(self) -> str:
        return ", ".join(run.where("variant") for run in self.runs.values())

    @property
    def inputs(self) -> list[Path]:
        return [self.pick_file, *(p for run in self.runs.values() for p in run.inputs)]


def matched_families(params: dict) -> tuple[Family, Family]:
    """(Mistill, RandHeads), checked to be one protocol: grids that share the rule and the line, the RandHeads
    grid drawing the frozen pool its runs train on, and the same seeds in both."""
    mistill, randheads = Family("mistill", params), Family("randheads", params)
    differ = [k for k in SHARED if mistill.entry.get(k) != randheads.entry.get(k)]
    if differ:
        raise UserError(f"params selection.grids {mistill.grid} and {randheads.grid}: the matched selection applies one "
                        f"rule to both; they differ in {', '.join(differ)}")
    if mistill.entry.get("heads", "top") != "top" or randheads.entry.get("heads") != "random":
        raise UserError(f"params selection.grids: {mistill.grid} must select ranked heads and {randheads.grid} "
                        f"random heads (heads: random)")
    pools = {int(run.entry.get("pool_seed", params["distill"]["pool_seed"])) for run in randheads.runs.values()}
    grid_pool = int(randheads.entry.get("pool_seed", params["distill"]["pool_seed"]))
    if pools != {grid_pool} or any(run.entry.get("heads") != "random" for run in randheads.runs.values()):
        raise UserError(f"params variants.arms {', '.join(FAMILIES['randheads'])}: random heads on the frozen pool of "
                        f"grid {randheads.grid} (pool_seed {grid_pool}); found pool seeds {sorted(pools)}")
    if mistill.seeds != randheads.seeds:
        raise UserError(f"the matched families pair seed i with seed i; Mistill has {mistill.seeds}, RandHeads "
                        f"{randheads.seeds}")
    return mistill, randheads
