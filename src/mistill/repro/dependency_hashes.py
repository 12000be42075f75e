"""A dependency's hash built once per `dvc repro` until a stage writes under it.

DVC hashes every dependency of a stage to decide whether the stage changed (`Output.get_hash`, a dry run)
and again to record it (`Output.save`), each time by walking every file of a directory (its state database
spares re-reading unchanged files, not listing and stat-ing them). The readers of the own-heads chains each
depend on artifacts/M6 (4,940 files) and artifacts/HD-S (2,180), so every reader walked both twice, 1.7 to
3.2 s of DVC's time per reader, though no stage between two readers had written there.

Under `dvc repro` nothing but a stage writes into the workspace: DVC holds the repository's lock for the
whole run, and a stage writes its outputs. So within one process a dependency's build is kept, keyed by its
path, hash name, object database and kind (dry run or not), and dropped when a stage whose outputs lie under
that path, or above it, runs or checks its outputs out (either may change files there), whatever the stage's
end. The hashes, the lock and every decision DVC makes are unchanged.
`python -m mistill.repro.dvc_run` installs it.
"""

from __future__ import annotations

import os
from typing import Any

from dvc.output import Output
from dvc.stage import Stage

DVC_BUILD = Output._build
DVC_STAGE_RUN = Stage.run
DVC_STAGE_CHECKOUT = Stage.checkout
_built: dict[tuple, Any] = {}


def _overlaps(path: str, other: str) -> bool:
    """One path is the other or lies under it."""
    return path == other or path.startswith(other.rstrip(os.sep) + os.sep) or \
        other.startswith(path.rstrip(os.sep) + os.sep)


def forget(paths) -> None:
    """Drop every kept build at, under or above one of `paths`."""
    for key in [k for k in _built if any(_overlaps(k[0], p) for p in paths)]:
        del _built[key]


KEPT_KWARGS = {"ignore", "dry_run", "no_progress_bar"}   # what DVC passes when it hashes a dependency


def build(output: Output, odb, fs_path, fs, hash_name, *args, **kwargs):
    """`Output._build`, kept for a local dependency until a stage writes under it."""
    if not output.IS_DEPENDENCY or getattr(fs, "protocol", None) != "local" or args or set(kwargs) - KEPT_KWARGS:
        return DVC_BUILD(output, odb, fs_path, fs, hash_name, *args, **kwargs)
    key = (os.path.abspath(fs_path), hash_name, getattr(odb, "path", None), bool(kwargs.get("dry_run")))
    if key not in _built:
        _built[key] = DVC_BUILD(output, odb, fs_path, fs, hash_name, *args, **kwargs)
    return _built[key]


def _out_paths(stage: Stage) -> list[str]:
    return [os.path.abspath(out.fs_path) for out in stage.outs if getattr(out.fs, "protocol", None) == "local"]


def run(stage: Stage, *args, **kwargs):
    """`Stage.run`; afterwards, the kept builds at or around its outputs are dropped."""
    try:
        return DVC_STAGE_RUN(stage, *args, **kwargs)
    finally:
        forget(_out_paths(stage))


def checkout(stage: Stage, *args, **kwargs):
    """`Stage.checkout`; afterwards, the kept builds at or around its outputs are dropped."""
    try:
        return DVC_STAGE_CHECKOUT(stage, *args, **kwargs)
    finally:
        forget(_out_paths(stage))


def install() -> None:
    """Put the kept builds in place for this process."""
    _built.clear()
    Output._build = build
    Stage.run = run
    Stage.checkout = checkout
