"""The attribution pass again under the intact hook, with exact P2 patches (App. C; R-C8).

HD-001's attribution pass detached every layer's gradient leaf from the graph: its first-order scores
keep only each head's direct path, and its P2 ranking rests on them alone (P2 events get no exact
patches there).  The check of App. C re-runs the pass on the first notes of the corpus with the graph
intact and with P2 as the exactly patched kind (each event's top-k by |A_h| plus the running global
top, patched one head at a time; the NULL events' seeded half as before), then calibrates against the
NULL events as HD-001 does.  R-C8 compares the two P2 rankings on the same notes.

Settings: params `intact_rerun` (out_dir, notes, nominees_topk, nominees_global_topk, exact_kinds); the
rest is the profile's `instrument` section with the hook set to `intact`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mistill.errors import UserError
from mistill.instrument.events import DECISION_KINDS


@dataclass(frozen=True)
class IntactRerun:
    out_dir: str
    notes: int                      # the first notes of the corpus (the paper's 50)
    nominees_topk: int              # each P2 event's top-k by |A_h| (the paper's 24)
    nominees_global_topk: int       # plus the running global top (the paper's 8)
    exact_kinds: tuple[str, ...] = ("P2",)

    @classmethod
    def from_params(cls, params: dict) -> IntactRerun:
        section = params.get("intact_rerun")
        where = f"params.yaml {params.get('profile', '<profile>')}.intact_rerun"
        if not isinstance(section, dict):
            raise UserError(f"{where}: missing; it names the re-run's directory, notes and nominee sizes")
        try:
            rerun = cls(**{**section, "exact_kinds": tuple(section.get("exact_kinds", ("P2",)))})
        except TypeError as err:
            raise UserError(f"{where}: {err}") from None
        for name in ("notes", "nominees_topk", "nominees_global_topk"):
            if not isinstance(getattr(rerun, name), int) or getattr(rerun, name) < 1:
                raise UserError(f"{where}.{name}: a positive count, got {getattr(rerun, name)!r}")
        unknown = set(rerun.exact_kinds) - set(DECISION_KINDS)
        if unknown:
            raise UserError(f"{where}.exact_kinds: unknown kinds {sorted(unknown)}; known: {list(DECISION_KINDS)}")
        return rerun

    def config(self, cfg):
        """The instrument config of the re-run: the profile's, in its own directory, graph intact."""
        return dataclasses.replace(cfg, out_dir=self.out_dir, hook="intact", nominees_topk=self.nominees_topk,
                                   nominees_global_topk=self.nominees_global_topk)


def run_intact(cfg, params: dict, *, model=None, tokenizer=None, force: bool = False) -> dict:
    """Events, attribution (intact, exact at the re-run's kinds) and calibration on the first notes."""
    from mistill.instrument.passes import load_teacher, run_attribution, run_calibration, run_events

    rerun = IntactRerun.from_params(params)
    intact = rerun.config(cfg)
    if model is None:
        model, tokenizer = load_teacher(intact, params)
    run_events(intact, params, model=model, tokenizer=tokenizer, limit=rerun.notes, force=force)
    run_attribution(intact, params, model=model, tokenizer=tokenizer, limit=rerun.notes, force=force,
                    exact_kinds=rerun.exact_kinds)
    return run_calibration(intact, params, limit=rerun.notes)
