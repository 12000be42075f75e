"""Teacher targets, computed once per training note (App. I.5).

For each training note with a valid teacher trace: the bucket axis; the teacher's pooled bucket
distribution at every supervised row (each event row with its kind's pool, carved at P2 / P2C;
the W rows before each P1 event with the prose-time pool); m^T and c^T at every event (what the
interaction term needs); and the teacher's top-32 next-token distribution at every completion
position (Vanilla CoT-KD's KL).  One `<note_id>.npz` per note (a pass resumable per note) and a
`manifest.json` that records the teacher's id and weight hash: a trainer given another teacher
refuses the targets.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mistill.distill import buckets as bk
from mistill.distill.mechanism import note_view, plan_rows, read_mechanism, supervised_layers
from mistill.distill.pooled_attention import SupervisedRows
from mistill.distill.pools import Pool
from mistill.distill.positions import relocate_events
from mistill.distill.runs import POSITION_RULES
from mistill.errors import UserError
from mistill.io import read_json, read_jsonl, read_npz, write_json, write_npz

TARGET_FORMAT = 1


def teacher_fingerprint(model) -> str:
    """sha256 over the teacher's parameters (names, shapes, bytes), so targets name their teacher."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def competitor_strings(tokenizer, events: list[dict]) -> list[list[str]]:
    """The teacher's competitor tokens as text, so any tokenizer can map them to its own ids."""
    return [ev.get("competitors") or [tokenizer.decode([i]) for i in ev.get("competitor_ids", [])] for ev in events]


def load_events(path: Path, note_id: str) -> list[dict]:
    if not path.exists():
        raise UserError(f"{path}: no events for note {note_id} (run the instrument's event pass first)")
    events = [e for e in read_jsonl(path) if e.get("kind") in ("P1", "P2", "P2C")]
    if not events:
        raise UserError(f"{path}: the teacher trace of note {note_id} has no P1/P2/P2C events; "
                        "nothing to supervise (drop the note from the training split or fix the events)")
    return events


def topk_targets(logits: torch.Tensor, ids: list[int], first: int, k: int):
    """Top-k log-probabilities at the positions predicting completion tokens first .. T-1."""
    logp = torch.log_softmax(logits[first - 1:len(ids) - 1].float(), dim=-1)
    top = logp.topk(k, dim=-1)
    return top.indices.to(torch.int64).cpu().numpy(), top.values.cpu().numpy().astype(np.float32)


@torch.no_grad()
def note_targets(model, tokenizer, prompt: str, completion: str, events: list[dict], pools: dict[str, Pool],
                 prose_pool: Pool | None, *, window: int, topk: int, note_id: str = "?") -> dict:
    """Everything the student's losses need from the teacher for one note (numpy arrays + meta)."""
    axis = bk.build_axis(prompt, completion)
    comps = competitor_strings(tokenizer, events)
    view = note_view(tokenizer, axis, events, comps)
    for ev in view.realized:
        pos = events[ev.index].get("pos", -1)
        if pos is not None and pos >= 0 and pos != ev.row + 1:
            raise UserError(f"note {note_id}: event {ev.index} sits at token {pos} but the teacher's tokenization "
                            f"of the trace decides at {ev.row + 1}; events and trace disagree")
    if not view.realized:
        raise UserError(f"note {note_id}: the teacher's tokenization realises none of its events")
    device = next(model.parameters()).device
    rows_hook = SupervisedRows(model, supervised_layers(pools, prose_pool))
    try:
        plan = plan_rows(view, events, pools, prose_pool, window, device)
        rows_hook.arm(plan.requests, plan.n_buckets)
        out = model(input_ids=torch.tensor([view.ids], device=device))
        rows_hook.stop_recording()
        mech = read_mechanism(model, plan, rows_hook)
    finally:
        rows_hook.remove()
    top_ids, top_logp = topk_targets(out.logits[0], view.ids, view.completion_token, topk)
    arrays: dict[str, np.ndarray] = {"top_ids": top_ids, "top_logprobs": top_logp,
                                     "completion_offsets": np.asarray(
                                         [(s - view.completion_at, e - view.completion_at)
                                          for s, e in view.offsets[view.completion_token:]], dtype=np.int64)}
    for phase in ("P1", "P2", "P2C"):
        block = mech[phase]
        if block is None:
            continue
        for key in ("rows", "m", "c", "margin", "event_index"):
            arrays[f"{phase}_{key}"] = block[key].detach().float().cpu().numpy() if key != "event_index" \
                else block[key].cpu().numpy()
    if mech["window"] is not None:
        for key in ("rows", "event_index", "distance"):
            value = mech["window"][key]
            arrays[f"window_{key}"] = value.detach().float().cpu().numpy() if key == "rows" else value.cpu().numpy()
    meta = {"note_id": note_id, "prompt": prompt, "completion": completion, "axis": axis.as_record(),
            "events": events, "competitors": comps}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    return arrays


def read_note_targets(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta, arrays) of one note's targets; a missing, truncated or corrupt file is a one-line UserError."""
    arrays = read_npz(path, "teacher targets")
    try:
        meta = json.loads(arrays.pop("meta").tobytes().decode())
    except (KeyError, UnicodeDecodeError, json.JSONDecodeError):
        raise UserError(f"{path}: teacher targets without a readable 'meta' record; "
                        "recompute them (`mistill distill targets`)") from None
    arrays.pop("input_key", None)
    return meta, arrays


def check_teacher(manifest_path: Path, teacher_hash: str, teacher_id: str) -> dict:
    """The manifest of a targets directory, refused when it was computed from another teacher."""
    if not manifest_path.exists():
        raise UserError(f"{manifest_path}: no targets manifest (run `mistill distill targets` first)")
    manifest = read_json(manifest_path, "targets manifest")
    if not isinstance(manifest, dict):
        raise UserError(f"{manifest_path}: not a targets manifest (a JSON object); recompute the targets")
    if manifest.get("teacher_hash") != teacher_hash:
        raise UserError(f"{manifest_path}: targets were computed from teacher {manifest.get('teacher_id')!r} "
                        f"(hash {str(manifest.get('teacher_hash'))[:12]}), not from {teacher_id!r} "
                        f"(hash {teacher_hash[:12]}); recompute the targets for this teacher")
    return manifest


def target_key(teacher_hash: str, trace: dict, events_path: Path, pools: dict[str, Pool], prose_pool: Pool | None,
               window: int, topk: int, positions: str = "events", position_seed: int = 0) -> str:
    """sha256 over everything a note's targets are computed from: a stored file is reused only if it matches.
    The position rule enters only when the events move (RandPos), so the keys of event targets stay as they were."""
    events = events_path.read_bytes() if events_path.exists() else b""
    parts = [teacher_hash, trace["prompt"], trace["completion"], hashlib.sha256(events).hexdigest(),
             json.dumps({p: pool.as_dict() for p, pool in sorted(pools.items())}, sort_keys=True),
             json.dumps(prose_pool.as_dict() if prose_pool else None, sort_keys=True), str(window), str(topk),
             str(TARGET_FORMAT)]
    if positions != "events":
        parts += [positions, str(position_seed)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def stored_key(path: Path) -> str | None:
    """The input key a targets file was written with (None: absent, unreadable or written before keys)."""
    try:
        with np.load(path) as data:
            return data["input_key"].tobytes().decode() if "input_key" in data.files else None
    except (OSError, ValueError, EOFError):
        return None  # a missing or truncated file is recomputed


def compute_targets(model, tokenizer, traces: list[dict], events_dir: Path, out_dir: Path, pools: dict[str, Pool],
                    prose_pool: Pool | None, *, window: int, topk: int, teacher_id: str, provenance: dict,
                    teacher_hash: str | None = None, positions: str = "events", position_seed: int = 0) -> dict:
    """The pass over training notes; resumable per note (under `dvc repro` too: the directory is `persist`):
    a note's file is kept only when it was written from the same teacher, trace, events, pools, window and
    top-k (`target_key`), else it is recomputed.  The manifest is written last and marks the pass complete;
    files of notes no longer listed are removed, so the directory equals an uninterrupted run's.
    `positions` "random" moves each note's events first (RandPos, `mistill.distill.positions`), drawn with
    `position_seed`."""
    if positions not in POSITION_RULES:
        raise UserError(f"unknown position rule {positions!r}; known: {', '.join(POSITION_RULES)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    teacher_hash = teacher_hash or teacher_fingerprint(model)  # the CLI names the teacher by its files
    manifest_path = out_dir / "manifest.json"
    # every note's key names its teacher, so another teacher's targets are recomputed, never refused here;
    # until the pass ends no manifest vouches for a directory that may mix two teachers' notes
    previous = manifest_path.read_bytes() if manifest_path.is_file() else None
    manifest_path.unlink(missing_ok=True)
    done, skipped, computed = [], [], 0
    for trace in tqdm(traces, desc="teacher targets", unit="note"):
        note_id = trace["note_id"]
        if not trace.get("valid", True):
            skipped.append({"note_id": note_id, "why": "invalid teacher trace"})
            continue
        path = out_dir / f"{note_id}.npz"
        events_path = events_dir / note_id / "events.jsonl"
        key = target_key(teacher_hash, trace, events_path, pools, prose_pool, window, topk, positions, position_seed)
        if stored_key(path) != key:
            events = load_events(events_path, note_id)
            if positions == "random":
                events = relocate_events(events, competitor_strings(tokenizer, events), tokenizer, trace["prompt"],
                                         trace["completion"], position_seed=position_seed, note_id=note_id)
            arrays = note_targets(model, tokenizer, trace["prompt"], trace["completion"], events, pools, prose_pool,
                                  window=window, topk=topk, note_id=note_id)
            write_npz(path, **arrays, input_key=np.frombuffer(key.encode(), dtype=np.uint8))
            computed += 1
        done.append(note_id)
    kept = {f"{note_id}.npz" for note_id in done}
    for stale in out_dir.glob("*.npz"):
        if stale.name not in kept:
            stale.unlink()
    manifest = {"format": TARGET_FORMAT, "teacher_id": teacher_id, "teacher_hash": teacher_hash,
                "window": window, "topk": topk, "notes": done, "skipped": skipped,
                "pools": {p: pool.as_dict() for p, pool in pools.items()},
                "prose_pool": prose_pool.as_dict() if prose_pool else None, "provenance": provenance}
    if positions != "events":
        manifest["positions"] = {"rule": positions, "seed": position_seed}
    if previous is not None and not computed and _same_but_provenance(previous, manifest):
        # nothing was recomputed: the directory stays byte for byte what it was (its readers stay fresh)
        manifest_path.write_bytes(previous)
        return json.loads(previous)
    write_json(manifest_path, manifest)
    return manifest


def _same_but_provenance(previous: bytes, manifest: dict) -> bool:
    try:
        old = json.loads(previous)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(old, dict) and {k: v for k, v in old.items() if k != "provenance"} == \
        {k: v for k, v in json.loads(json.dumps(manifest)).items() if k != "provenance"}
