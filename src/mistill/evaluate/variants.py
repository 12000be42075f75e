"""Recipe variants read beside the main arms at their own seed (App. M, Table 51; readers R-D7, R-D13,
R-D14, R-D23, R-D24, R-D25).

A variant (params `variants.arms.<name>`) is trained, evaluated and read by the own-heads chain
under `variants.dir`; the main arms it is compared with (Mistill, fp32 Vanilla CoT-KD and the untrained
student of the same student) live under the artifacts root with the labels of `evaluate.own_heads.arms`.
Everything is read at the variant's seed, so a comparison is seed-matched by construction; other variants
of the same student and seed join as arms of their own names (`others`), and `across` pairs two single
runs read at different seeds where a result pairs them so.

`VariantReadout` gives the cells Table 51's rows share: the own top-k knock-in recovery per phase (median
over test notes, or its mean), the paired per-note difference against another arm, the M2 region lift and
emitted-prefix share, the own top-k sets and the pools a run supervised, corpus micro-F1 and per-note F1
differences, the share of generations that reach the token cap, M1 at a phase, and the run's config.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from mistill.distill.runs import variant, variant_label, variant_run_dir
from mistill.errors import UserError
from mistill.evaluate.compare import arm_values, clustered, seed_dirs, seed_medians
from mistill.evaluate.own_heads import OwnHeadsConfig, edits_dir
from mistill.evaluate.readout import (
    FAMILIES,
    LAS_DIR,
    ArmSeed,
    arm_labels,
    cap_share,
    eval_root,
    load_arm,
    minus_reference,
    test_notes,
    value,
)
from mistill.io import read_json
from mistill.stats import StatsParams

# the main arms a variant is compared with: readout arm name -> Table 3 row (without the student's family)
REFERENCES = {"mistill": "mistill", "vanilla": "vanilla_fp32", "untrained": "untrained"}
# The untrained student has no training seed: each stage writes its one run at seed 0 (readout's module
# docstring), so a variant of any seed is compared with that run.
UNTRAINED_SEED = 0


def across(arm: dict[str, float], reference: dict[str, float], stats: StatsParams) -> dict | None:
    """`arm` minus `reference` per note when the two were read at different seeds (one run each): the
    note-clustered comparison of `compare.clustered` on a single pair."""
    return clustered({0: arm}, {0: reference}, stats)


@dataclass
class VariantReadout:
    """The variant `name`, the `others` and the references (Mistill, fp32 Vanilla CoT-KD, the untrained student)
    at the variant's seed."""

    name: str
    params: dict
    others: tuple[str, ...] = ()   # other variants of the same student and seed, read as arms of their names
    entry: dict = field(init=False)
    seed: int = field(init=False)
    arms: dict[str, tuple[Path, str]] = field(init=False)   # "variant" | reference -> (artifacts root, label)
    cfg: OwnHeadsConfig = field(init=False)
    stats: StatsParams = field(init=False)
    inputs: list[Path] = field(init=False, default_factory=list)

    def __post_init__(self):
        self.entry = variant(self.params.get("variants") or {}, self.name)
        self.seed = int(self.entry["seed"])
        family = FAMILIES.get(self.entry["student"])
        labels = arm_labels(self.params)
        rows = {ref: f"{family}_{row}" for ref, row in REFERENCES.items()}
        missing = [row for row in rows.values() if row not in labels]
        if family is None or missing:
            raise UserError(f"params variants.arms.{self.name}: student {self.entry['student']!r} has no "
                            f"{', '.join(missing) or 'Table 3'} row in evaluate.own_heads.arms")
        self.cfg = OwnHeadsConfig.from_params(self.params)
        self.stats = StatsParams.from_params(self.params)
        root = Path(self.cfg.artifacts)
        variants_dir = Path(self.params["variants"]["dir"])
        self.arms = {"variant": (variants_dir, variant_label(self.name, self.entry)),
                     **{ref: (root, labels[row]) for ref, row in rows.items()}}
        for other in self.others:
            entry = variant(self.params["variants"], other)
            if (entry["student"], int(entry["seed"])) != (self.entry["student"], self.seed):
                raise UserError(f"params variants.arms.{other}: student {entry['student']} seed {entry['seed']}; "
                                f"{self.name} is read at student {self.entry['student']} seed {self.seed}")
            self.arms[other] = (variants_dir, variant_label(other, entry))

    # -- where things are ------------------------------------------------------------------------------
    @property
    def k(self) -> int:
        """The paper's k40: the largest own top-k the profile knocks in (evaluate.own_heads.bins)."""
        return max(self.cfg.bins)

    @property
    def k_small(self) -> int:
        """The paper's k8: the smallest."""
        return min(self.cfg.bins)

    def arm_seed(self, arm: str) -> int:
        """The seed the arm's artifacts carry: the variant's, but the untrained student's one run at any seed."""
        return UNTRAINED_SEED if arm == "untrained" else self.seed

    def where(self, arm: str) -> str:
        root, label = self.arms[arm]
        return f"{root}/M6/{label}-s{self.arm_seed(arm)}"

    def edits_dir(self, arm: str) -> Path:
        """The arm's trace edits (the own-heads chain's stage (d)) at its seed."""
        root, label = self.arms[arm]
        return edits_dir(root, label, self.arm_seed(arm))

    def _at_seed(self, values: dict[int, dict[str, float]], arm: str) -> dict[int, dict[str, float]]:
        """The arm's values at its seed, keyed by the variant's, so that a comparison pairs them."""
        if self.arm_seed(arm) not in values:
            raise UserError(f"{self.where(arm)}: not read; run its own-heads chain")
        return {self.seed: values[self.arm_seed(arm)]}

    # -- own heads (M4, M2) ----------------------------------------------------------------------------
    def recovery(self, arm: str, phase: str, k: int) -> dict[int, dict[str, float]]:
        """{seed: {note: mean recovery of the arm's own top-k at the phase}} at the variant's seed."""
        root, label = self.arms[arm]
        values = self._at_seed(arm_values(root, label, "m4", phase=phase, k=k, min_range=self.cfg.min_range), arm)
        self.inputs.append(seed_dirs(root, label)[self.arm_seed(arm)])
        return values

    def own_median(self, arm: str, phase: str, k: int | None = None) -> float | None:
        """Median over test notes of the own top-k recovery (k: the paper's k40 unless given)."""
        return seed_medians(self.recovery(arm, phase, k or self.k))["per_seed_median"].get(self.seed)

    def versus(self, arm: str, reference: str, phase: str, k: int | None = None) -> dict | None:
        """`arm` minus `reference`, per note (mistill.evaluate.compare.clustered) at the variant's seed."""
        kk = k or self.k
        return clustered(self.recovery(arm, phase, kk), self.recovery(reference, phase, kk), self.stats)

    # -- the cells as numbers-file values ---------------------------------------------------------------
    def own_value(self, arm: str, phase: str, k: int | None = None) -> dict | None:
        kk = k or self.k
        med = self.own_median(arm, phase, kk)
        return None if med is None else value(
            med, f"median over test notes of per-note mean recovery (own top-{kk}, {phase}, 1-nat gate), seed "
            f"{self.arm_seed(arm)}", self.where(arm))

    def lift_value(self, arm: str, phase: str) -> dict | None:
        lift = self.m2_lift(arm, phase)
        return None if lift is None else value(
            lift, f"M2 region lift of the own top-{self.cfg.readside_k} read-side heads at {phase}, median over test "
            f"notes, seed {self.arm_seed(arm)}", f"{self.where(arm)}/readside.json")

    def f1_value(self, arm: str) -> dict:
        return value(self.micro_f1(arm), f"corpus micro-F1 on the test notes, seed {self.arm_seed(arm)}",
                     f"{self.evaluation(arm).path}/task.json")

    def f1_versus_values(self, key: str, what: str, reference: str, arm: str = "variant") -> dict[str, dict]:
        """`key`: `arm` minus `reference`, the mean per-note F1 difference on the test notes at the variant's seed,
        and `<key>_interval`, its percentile bootstrap interval (`readout.minus_reference`)."""
        a, r = self.evaluation(arm), self.evaluation(reference)
        self.inputs.append(Path(self.params["evaluate"]["test_notes"]))
        return minus_reference(key, {self.seed: a}, {self.seed: r}, test_notes(self.params), self.stats, what)

    def paired_values(self, key: str, what: str, reference: str, phase: str = "P2C", k: int | None = None, *,
                      interval: bool = True, arm: str = "variant") -> dict[str, dict]:
        """`key`: `arm` (the variant unless named) minus `reference` per note (note-clustered mean, with the notes
        higher and lower and the sign and Wilcoxon p-values in its statistic), and `<key>_interval`, its bootstrap
        interval; `what` names the difference ("uniform minus Mistill")."""
        kk = k or self.k
        c = self.versus(arm, reference, phase, kk)
        if c is None:
            return {}
        art = f"{self.where(arm)} vs {self.where(reference)}"
        seed, reference_seed = self.arm_seed(arm), self.arm_seed(reference)
        at = f"seed {seed}" if seed == reference_seed else f"seed {seed} against seed {reference_seed}"
        out = {key: value(c["mean_difference"], f"mean over notes of the per-note difference, {what} (own top-{kk} "
                          f"{phase} recovery, {at}); {c['notes_higher']} higher / {c['notes_lower']} lower "
                          f"of {c['n_notes']}, sign p {c['sign_p']:.3g}, Wilcoxon p {c['wilcoxon_p']:.3g}", art)}
        if interval:
            out[f"{key}_interval"] = value(
                [c["ci_low"], c["ci_high"]], f"{c['confidence']:.0%} note-bootstrap interval of that mean difference "
                f"({self.stats.bootstrap_resamples} resamples, seed {self.stats.bootstrap_seed})", art)
        return out

    def notes_of(self, arm: str, phase: str, k: int | None = None) -> dict[str, float]:
        """{note: mean recovery of the arm's own top-k at the phase} at the variant's seed, for comparisons across
        readouts of different seeds (`across`)."""
        return self.recovery(arm, phase, k or self.k)[self.seed]

    def mean_recovery(self, arm: str, phase: str, k: int | None = None) -> float:
        """Mean over test notes of the own top-k recovery (App. M.3's concentration at the smallest k)."""
        return statistics.fmean(self.notes_of(arm, phase, k or self.k_small).values())

    def prefix_share(self, arm: str, phase: str = "P2C") -> float | None:
        """The emitted-prefix share of attention of the own top read-side heads at the phase (readside.json)."""
        path = Path(self.where(arm)) / "readside.json"
        if not path.is_file():
            raise UserError(f"{path}: no read-side summary; run the arm's own-heads chain")
        self.inputs.append(path)
        return read_json(path, "read-side summary")["phases"].get(phase, {}).get("top", {}).get("share_prefix")

    # -- which heads -----------------------------------------------------------------------------------
    def hd_dir(self, arm: str) -> Path:
        """The arm's own head ranking (HD-S); the untrained student's is the one pass every run's pools are
        built from (params distill.student_head_sets)."""
        root, label = self.arms[arm]
        return root / "HD-S" / f"{label}-s{self.arm_seed(arm)}"

    def own_top(self, arm: str, k: int | None = None) -> dict[str, frozenset[int]]:
        """phase -> the arm's own top-k heads by I_c (flat index layer * n_heads + head)."""
        from mistill.evaluate.reread import top_k_sets

        path = self.hd_dir(arm)
        if not (path / "head_sets_contrast.json").is_file():
            raise UserError(f"{path}/head_sets_contrast.json: no own head ranking; run the arm's own-heads chain")
        self.inputs.append(path / "head_sets_contrast.json")
        return top_k_sets(path, k or self.k)

    def ranking(self, arm: str) -> dict:
        """The arm's head_sets_contrast.json (n_layers, n_heads, phases: heads ranked by I_c)."""
        from mistill.distill.pools import load_head_sets

        path = self.hd_dir(arm) / "head_sets_contrast.json"
        self.inputs.append(path)
        return load_head_sets(path)

    def supervised(self) -> dict[str, list[tuple[int, int]]]:
        """phase -> the (layer, head) pool the variant's loss supervised (its run config)."""
        return {phase: [tuple(h) for h in pool["heads"]] for phase, pool in self.run_config().get("pools", {}).items()}

    def lift_notes(self, arm: str, phase: str) -> dict[str, float]:
        """{note: M2 region lift of the own top read-side heads at the phase} at the variant's seed."""
        root, label = self.arms[arm]
        values = self._at_seed(arm_values(root, label, "m2", phase=phase), arm)
        self.inputs.append(seed_dirs(root, label)[self.arm_seed(arm)])
        return values[self.seed]

    def m2_lift(self, arm: str, phase: str) -> float | None:
        """Median over test notes of the M2 region lift of the own top read-side heads at the phase."""
        return seed_medians({self.seed: self.lift_notes(arm, phase)})["per_seed_median"].get(self.seed)

    # -- evaluation and training run -------------------------------------------------------------------
    def evaluation(self, arm: str) -> ArmSeed:
        root, label = self.arms[arm]
        evals = root / "DT-eval" if root == self.arms["variant"][0] else eval_root(self.params)
        # LAS lives where stage LAS writes every arm's (<artifacts>/LAS), as for the baselines
        run = load_arm(evals, label, las_root=eval_root(self.params).parent / LAS_DIR).get(self.arm_seed(arm))
        if run is None:
            raise UserError(f"{evals}/{label}-s{self.arm_seed(arm)}: not evaluated; run its evaluation stage")
        self.inputs += run.files()
        return run

    def micro_f1(self, arm: str) -> float:
        return float(self.evaluation(arm).task["micro_f1"])

    def cap_share(self, arm: str) -> float:
        """Share of the test generations that reached the token cap."""
        return cap_share(self.evaluation(arm))

    def m1(self, arm: str, phase: str) -> float:
        """M1 at the phase: the share of the teacher's events where the student's margin is positive."""
        share = self.evaluation(arm).m1.get(phase, {}).get("p_margin_positive")
        if share is None:
            raise UserError(f"{self.evaluation(arm).path}/m1.json: no M1 at {phase}")
        return float(share)

    @property
    def run_config_path(self) -> Path:
        return variant_run_dir(self.params["variants"]["dir"], self.name, self.entry) / "config.json"

    def run_config(self) -> dict:
        """The variant's training run config (config.json: its arm, with the λ it trained with)."""
        path = self.run_config_path
        if not path.is_file():
            raise UserError(f"{path}: no training run config; run `dvc repro pipelines/distill/dvc.yaml:DT-variant@{self.name}`")
        self.inputs.append(path)
        return read_json(path, "training run config")
