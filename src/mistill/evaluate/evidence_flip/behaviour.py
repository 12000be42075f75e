"""The evidence-flip test, behavioural half (App. N.1, N.3, Table 54; R-D33).

Every checkpoint answers every accepted case `samples` times under each condition (original,
flipped, irrelevant, order) with the evaluation's decoding; sample j of a case uses the same seed
under every condition and for every checkpoint (the paired seed key).  The prompt lists the drawn
note's shortlist with B added where the retriever left it out, the same lines under every condition.

An answer scores

    v = +1 if it emits A and not B,   -1 if it emits B and not A,   0 otherwise

(an invalid output, at the generation cap or with its reasoning block open, scores 0 and is
counted).  Per case and checkpoint the directional sensitivity is

    D = (mean v_original - mean v_flipped) / 2
      = (P(A-only | original) - P(A-only | flipped)) / 2     losing A
      + (P(B-only | flipped) - P(B-only | original)) / 2     adopting B

The case is the unit: a checkpoint's D is the mean over cases with a case-bootstrap interval.  The
locked primary is Mistill minus Vanilla CoT-KD (bf16), the seed-matched pair differences averaged
within each case, with a percentile bootstrap over cases and an exact sign test; its approximate
detectable effect at 80% power (two-sided 0.05, normal approximation on the observed SD of the
per-case differences) is (z_0.975 + z_0.8) * SD / sqrt(n).  The controls are read as the agreement
of a control's v with the original's v at the same sample index, and as the control's A-only rate
against the original's.

The category-level secondary scores the same answers by three-character category: v = +1 if some
answered code lies in A's category and none in B's, -1 the other way round, 0 otherwise; it is read
on the cases whose A and B lie in different categories (a sibling pair shares its category).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from mistill.world.answers import last_json_list

CONDITIONS = ("original", "flipped", "irrelevant", "order")
CONTROLS = ("irrelevant", "order")


LEVELS = ("code", "category")


def category(code: str) -> str:
    """The three-character ICD-10 category of a code (N18.9 -> N18)."""
    return code[:3]


def score(completion: str, code: str, partner: str, *, valid: bool, level: str = "code") -> int:
    """v of one answer: +1 A only, -1 B only, 0 otherwise (an invalid output is 0); at `level` "category"
    an answered code counts for A or B when it lies in their category."""
    if not valid:
        return 0
    answer = set(c for c in (last_json_list(completion) or []) if isinstance(c, str))
    if level == "category":
        answer, code, partner = {category(c) for c in answer}, category(code), category(partner)
    elif level != "code":
        raise ValueError(f"unknown scoring level {level!r}; known: {', '.join(LEVELS)}")
    a, b = code in answer, partner in answer
    return 1 if a and not b else -1 if b and not a else 0


@dataclass(frozen=True)
class CaseReading:
    """One checkpoint on one case: the per-condition scores by sample index."""

    v: Mapping[str, Sequence[int]]     # condition -> v per sample index
    invalid: int

    def mean(self, condition: str) -> float:
        return float(np.mean(self.v[condition]))

    def rate(self, condition: str, value: int) -> float:
        return float(np.mean([x == value for x in self.v[condition]]))

    @property
    def d(self) -> float:
        return (self.mean("original") - self.mean("flipped")) / 2

    @property
    def losing_a(self) -> float:
        return (self.rate("original", 1) - self.rate("flipped", 1)) / 2

    @property
    def adopting_b(self) -> float:
        return (self.rate("flipped", -1) - self.rate("original", -1)) / 2

    @property
    def paired_success(self) -> float:
        """Share of sample indices with A-only under the original and B-only under the flip."""
        return float(np.mean([o == 1 and f == -1 for o, f in zip(self.v["original"], self.v["flipped"])]))

    def agreement(self, control: str) -> float:
        return float(np.mean([c == o for c, o in zip(self.v[control], self.v["original"])]))


def readings(rows: Sequence[Mapping], cases: Mapping[str, tuple[str, str]],
             conditions: Sequence[str] = CONDITIONS, *, level: str = "code") -> dict[str, CaseReading]:
    """case -> its reading, from generation rows {case, condition, sample, completion, valid}; `cases` maps
    a case to (A, B), and rows of other cases are skipped.  Every case needs each of `conditions` at the
    same sample indices.  `level`: the scoring of `score`."""
    wanted = tuple(conditions)
    by_case: dict[str, dict[str, dict[int, int]]] = defaultdict(lambda: defaultdict(dict))
    invalid: dict[str, int] = defaultdict(int)
    for row in rows:
        if row["case"] not in cases:
            continue
        a, b = cases[row["case"]]
        by_case[row["case"]][row["condition"]][int(row["sample"])] = score(row["completion"], a, b,
                                                                           valid=bool(row["valid"]), level=level)
        invalid[row["case"]] += not row["valid"]
    out = {}
    for case, by_condition in by_case.items():
        samples = sorted(by_condition["original"])
        missing = [c for c in wanted if sorted(by_condition.get(c, {})) != samples]
        if missing:
            raise ValueError(f"case {case}: condition(s) {', '.join(missing)} lack the original's sample indices")
        out[case] = CaseReading({c: [by_condition[c][j] for j in samples] for c in wanted}, invalid[case])
    return out


def detectable_effect(differences: Sequence[float], *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Approximate detectable mean difference: (z_{1-alpha/2} + z_power) * SD / sqrt(n)."""
    x = np.asarray(differences, dtype=float)
    return float((norm.ppf(1 - alpha / 2) + norm.ppf(power)) * x.std(ddof=1) / np.sqrt(len(x)))


def paired_case_differences(treated: Mapping[int, Mapping[str, CaseReading]],
                            control: Mapping[int, Mapping[str, CaseReading]]) -> dict[str, float]:
    """case -> mean over seed pairs (seed i against seed i) of D_treated - D_control, on cases every seed
    of both arms answered."""
    seeds = sorted(set(treated) & set(control))
    if not seeds:
        return {}
    common = set.intersection(*(set(treated[s]) & set(control[s]) for s in seeds))
    return {case: float(np.mean([treated[s][case].d - control[s][case].d for s in seeds])) for case in sorted(common)}


def control_sensitivity(by_checkpoint: Mapping[str, Mapping[str, CaseReading]], kept: Sequence[str]
                        ) -> tuple[float, float]:
    """How much the two control statistics move when the control is read on the `kept` cases only (the
    cases whose irrelevant edit reached its matched length) instead of on every case: the largest
    |change| over checkpoints and controls of the mean agreement with the original's v, and of the
    mean A-only rate under the control (App. N.3: "on the 32 cases without the one case ... the
    agreement moves by at most 0.014 and the expected rate by at most 0.020")."""
    agreement = rate = 0.0
    for by_case in by_checkpoint.values():
        every, some = list(by_case.values()), [x for case, x in by_case.items() if case in set(kept)]
        if not every or not some:
            continue
        for c in CONTROLS:
            agreement = max(agreement, abs(np.mean([x.agreement(c) for x in every])
                                           - np.mean([x.agreement(c) for x in some])))
            rate = max(rate, abs(np.mean([x.rate(c, 1) for x in every]) - np.mean([x.rate(c, 1) for x in some])))
    return float(agreement), float(rate)
