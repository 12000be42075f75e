"""The teacher precompute over the training notes under params (App. I.5): the stage DT-targets, and a RandPos
run's own targets (App. M.1). What one note's targets are is `mistill.distill.targets`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mistill.errors import UserError


def load_traces(path: Path, train_ids: set[str] | None) -> list[dict]:
    from mistill.io import iter_json_lines

    if not path.exists():
        raise UserError(f"{path}: no teacher traces (run `dvc repro TR-008` first)")
    rows = []
    for where, row in iter_json_lines(path, "teacher traces"):
        if not isinstance(row, dict) or not {"note_id", "prompt", "completion"} <= set(row):
            raise UserError(f"{where}: a trace row needs note_id, prompt and completion")
        rows.append(row)
    return [r for r in rows if train_ids is None or r["note_id"] in train_ids]


def train_ids(path: Path) -> set[str]:
    from mistill.world.notes import load_notes

    return {n.note_id for n in load_notes(path)}


def training_notes(cfg: Mapping[str, Any], notes: str | None = None) -> set[str]:
    """The notes the students train on: those of the training notes file (params distill.train_notes, or
    `notes`), or the first params distill.n_train of them by the digest of the id (`training_subset`, the
    rule of a recipe variant's n_train, so a variant's subset lies inside this one)."""
    from mistill.distill.subsets import training_subset

    path = Path(notes or cfg["train_notes"])
    ids = train_ids(path)
    n = cfg.get("n_train")
    if n is None:
        return ids
    if not 1 <= int(n) <= len(ids):
        raise UserError(f"params distill.n_train {n}: {path} holds {len(ids)} notes; give 1 to {len(ids)} "
                        "(or null: all of them)")
    return set(training_subset(sorted(ids), int(n)))


def prose_pool(cfg: dict, k: int, path: str | None = None):
    """The teacher's prose-time pool for the window rows (App. I.1): the top-k of the prose ranking that
    the locus pass on the shortlist run writes (App. F pass B; params distill.teacher_prose_sets)."""
    from mistill.distill import pools as pl

    path = Path(path or cfg.get("teacher_prose_sets") or "")
    if not path.is_file():
        raise UserError(f"{path}: no prose-time head sets, which a window of {cfg['window']} rows needs "
                        "(run `dvc repro HD-002-locus`, or set distill.window to 0)")
    return pl.build_pool(pl.load_head_sets(path), "prose", k, source=str(path))


TARGETS_OPTIONS = ("teacher", "head_sets", "prose_sets", "traces", "notes", "events_dir")   # `targets`' overrides


def teacher_targets(params: dict, overrides: Mapping[str, Any], out: Path, *, positions: str = "events",
                    position_seed: int = 0, note_ids: set[str] | None = None) -> dict:
    """The teacher's targets for the training notes (or `note_ids`) into `out` (App. I.5); `overrides` holds the
    TARGETS_OPTIONS overrides of the teacher, its head sets, the prose sets, traces, notes and events
    directory (absent or None: params distill)."""
    import torch

    from mistill.distill import pools as pl
    from mistill.distill.targets import compute_targets
    from mistill.io import provenance
    from mistill.models.fingerprint import model_fingerprint
    from mistill.models.loading import ModelSpec, load_model, resolve_device, set_threads

    cfg = params["distill"]
    set_threads(params["models"])
    torch.manual_seed(0)
    teacher_spec = overrides.get("teacher") or params["models"]["teacher"]
    # the teacher as it ran the traces (dtype, YaRN, revision); sdpa: the same function as eager, no T x T weights
    teacher = ModelSpec.from_params(params["models"], teacher_spec, base="teacher", attn_implementation="sdpa")
    model, tokenizer = load_model(teacher, device=resolve_device(params["models"].get("device")))
    head_sets = pl.load_head_sets(overrides.get("head_sets") or cfg["teacher_head_sets"])
    k = int(cfg["pool_k"]["teacher"])
    pools = pl.build_pools(head_sets, k, source="teacher head sets")
    prose = prose_pool(cfg, k, overrides.get("prose_sets")) if int(cfg["window"]) > 0 else None
    traces = load_traces(Path(overrides.get("traces") or cfg["traces"]),
                          note_ids or training_notes(cfg, overrides.get("notes")))
    if not traces:
        raise UserError("no teacher traces for the training notes")
    return compute_targets(model, tokenizer, traces, Path(overrides.get("events_dir") or cfg["events_dir"]),
                           out, pools, prose, window=int(cfg["window"]), topk=int(cfg["topk"]),
                           teacher_id=str(teacher_spec), teacher_hash=model_fingerprint(teacher),
                           provenance=provenance({"distill": cfg}, seed=None), positions=positions,
                           position_seed=position_seed)
