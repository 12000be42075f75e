"""One run's notes read under another run's global sets (App. B, R-C14's "KI-A-orig").

The instruction control asks whether HD-001's original global sets, knocked into the traces written
without the narrow-then-decide sentence (TR-A), still beat random.  The knock-in pass reads a run
directory: per note its events and attribution (the P2C exact refinement's nominees), and the run's
`head_sets_contrast.json`.  A *view* is such a directory whose notes are the new run's (HD-A: its
events and attributions, copied with their meta, so every artifact stays checksummed) and whose head
sets are the original run's; `mistill instrument knockin --traces TR-A --out-dir <view>` then knocks
HD-001's sets into the new traces exactly as HD-001's own pass did, note by note and resumably.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mistill.errors import UserError

NOTE_FILES = ("events.jsonl", "attr.npz")     # what the knock-in pass reads of a note, besides its trace


def write_view(run_dir: str | Path, sets_path: str | Path, out_dir: str | Path) -> int:
    """`out_dir` as `run_dir`'s notes under the head sets at `sets_path`; returns the notes viewed.

    A note's files are copied only when they differ from what the view holds (the knock-in pass's
    per-note digests then keep its valid patches); notes no longer in the run are removed."""
    run_dir, out_dir, sets_path = Path(run_dir), Path(out_dir), Path(sets_path)
    if not sets_path.is_file():
        raise UserError(f"{sets_path}: no head sets; run the original run's `calibrate` first")
    notes = sorted(p.parent for p in run_dir.glob("*/events.jsonl"))
    if not notes:
        raise UserError(f"{run_dir}: no <note>/events.jsonl; run `mistill instrument all` on the new traces first")
    out_dir.mkdir(parents=True, exist_ok=True)
    for note in notes:
        for name in NOTE_FILES:
            for src in (note / name, note / f"{name}.meta.json"):
                if not src.exists():
                    raise UserError(f"{src}: missing; the run's `{'events' if 'events' in name else 'attribute'}` "
                                    "pass did not finish")
                dst = out_dir / note.name / src.name
                if not dst.exists() or dst.read_bytes() != src.read_bytes():
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, dst)
    kept = {n.name for n in notes}
    for stale in [p for p in out_dir.iterdir() if p.is_dir() and p.name not in kept]:
        shutil.rmtree(stale)
    target = out_dir / "head_sets_contrast.json"
    if not target.exists() or target.read_bytes() != sets_path.read_bytes():
        shutil.copyfile(sets_path, target)
    return len(notes)
