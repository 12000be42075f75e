r"""Leakage-adjusted simulatability (Hase et al., 2020), reported beside App. K's LAS; beyond the paper.

App. K's LAS is a simulatability gain: per note g_i = F1(sim(note ⊕ r), a_T) - F1(sim(note), a_T),
averaged over the notes (`mistill.evaluate.fidelity.simulatability_gain`). A rationale that states
the answer outright raises g_i without explaining anything. Hase et al. (2020), who named LAS,
control for that: the simulator also answers from the explanation alone, an example "leaks" when
that answer is right, and the gain is averaged within the leaking and the non-leaking examples
separately, then over the two groups with equal weight (the "unweighted mean" of `compute_sim.py`
in their code):

    k_i   = 1[sim(e_i) is right]
    LAS_k = mean_{i : k_i = k} (1[sim(x_i, e_i) is right] - 1[sim(x_i) is right]),   k in {0, 1}
    LAS   = (LAS_0 + LAS_1) / 2

So however many rationales leak, they carry half the score, and a rationale only scores well if it
also helps where it does not give the answer away.

Adaptation to multi-label coding, made the way App. K adapts simulatability:

* The target is the teacher's answer a_T (App. K's target; Hase et al. simulate the explaining
  model's own prediction). Correctness is per-note F1 against a_T, as in App. K, so each group's
  gain is the mean of App. K's per-note gains g_i over the group's notes.
* A note leaks when the simulator's answer from the rationale alone is a_T as a set, i.e.
  F1(sim(r), a_T) = 1 (two empty sets agree, as `mistill.evaluate.task.note_f1` scores them).
  App. K reads Hase et al.'s 0/1 correctness as F1, which is 1 exactly when the set is right; any
  threshold t in (0, 1] on F1(sim(r), a_T) gives their indicator when answers are single codes, and
  t = 1 is the one that needs no threshold chosen. Per-code correctness (each (note, code) pair an
  example) is not used: nearly every inventory code is a true negative under all three inputs, a
  candidate set cut down to the predicted codes would make the examples depend on the predictions,
  and its unit would no longer be App. K's note, with which the gain is paired.
* An empty group: Hase et al.'s code returns NaN (a mean over no examples). Here the average runs
  over the groups that hold notes, so with one group empty the value is the other group's mean
  gain, which is then App. K's gain: with no contrast between groups there is nothing to adjust.
  The group sizes are reported with the value, so an empty group is visible.
* The rationale-only input is the simulator's prompt with the note's text left out and the rest
  kept (`mistill.evaluate.simulator.simulator_text`), as Hase et al.'s input dropout blanks x and
  keeps the template. Their simulator is trained with that dropout; App. K's is trained on
  note ⊕ r and on the note alone, so its rationale-only answers are read outside its training
  inputs. Retraining it would move App. K's LAS, and is not done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def leaks(pred_rationale_only: Sequence[str], teacher_answer: Sequence[str]) -> bool:
    """Whether the rationale alone gives the answer away: the simulator's rationale-only answer is the
    teacher's answer as a set (F1 = 1)."""
    return set(pred_rationale_only) == set(teacher_answer)


def leak_flags(pred_rationale_only: Sequence[Sequence[str]], teacher_answers: Sequence[Sequence[str]]) -> list[bool]:
    """`leaks` of every note, the simulator's rationale-only answers against the teacher's answers."""
    if len(pred_rationale_only) != len(teacher_answers):
        raise ValueError(f"{len(pred_rationale_only)} rationale-only answers for {len(teacher_answers)} notes")
    return [leaks(r, a) for r, a in zip(pred_rationale_only, teacher_answers)]


@dataclass(frozen=True)
class LeakageAdjusted:
    """The leakage-adjusted simulatability and the two groups it averages."""

    value: float
    leaking_gain: float | None      # mean gain over the notes whose rationale leaks (None: no such note)
    nonleaking_gain: float | None   # mean gain over the others (None: no such note)
    n_leaking: int
    n_nonleaking: int

    def as_dict(self) -> dict:
        return {"value": self.value,
                "leaking": {"notes": self.n_leaking, "mean_gain": self.leaking_gain},
                "nonleaking": {"notes": self.n_nonleaking, "mean_gain": self.nonleaking_gain}}


def leakage_adjusted(gains: Sequence[float], leaking: Sequence[bool]) -> LeakageAdjusted:
    """The unweighted mean over the leaking and non-leaking groups of each group's mean per-note gain,
    over the groups that hold notes.

    gains: App. K's per-note simulatability gains; leaking: whether each note's rationale leaks.
    """
    if len(gains) != len(leaking):
        raise ValueError(f"{len(gains)} gains for {len(leaking)} leak indicators")
    if not gains:
        raise ValueError("no notes: the leakage-adjusted simulatability averages over notes")
    gains_array, mask = np.asarray(gains, dtype=float), np.asarray(leaking, dtype=bool)
    groups = [gains_array[mask], gains_array[~mask]]
    means = [float(group.mean()) if group.size else None for group in groups]
    present = [m for m in means if m is not None]
    return LeakageAdjusted(value=float(np.mean(present)), leaking_gain=means[0], nonleaking_gain=means[1],
                           n_leaking=int(mask.sum()), n_nonleaking=int((~mask).sum()))
