"""Persisted outputs never outlive the code that made them.

A long per-note stage declares its outputs `persist: true`, so that `dvc repro` after a kill, or
after a changed input or parameter, keeps what was done: each per-note file or row is reused when
its recorded key (configuration and inputs) equals today's. The key does not name the code, and DVC
does not say why it reruns a stage. So after an edit of a stage's code, DVC would rerun it and the
command would reuse every note the old code computed: new code, old numbers, and a `dvc.lock` that
records the new code beside them.

`mistill`'s entry point closes that gap when DVC runs it as a stage (`DVC_STAGE`, `DVC_ROOT`). The
code a stage's outputs were made with is what its `dvc.lock` entry records for its Python
dependencies (their md5), or, while a run under other code is unfinished, what that run recorded in
a marker under `.dvc/tmp/mistill/code/`. If the files on disk differ from it, the command first
removes the stage's outputs, as DVC removes a stage's outputs that are not persisted, and records
the code it runs under; a run killed after that resumes under the same code and starts over under
other code. A stage's first run (no lock entry yet), directory dependencies (the calibration's
`src/mistill`: its replicates answer to `dvc status` of their own) and a torchrun launched by hand
(processes with `RANK` set: the process DVC started guards before it relaunches) are outside the
rule. After `git checkout`, `dvc checkout` brings the outputs that match the lock, as DVC advises.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from mistill.io import write_json
from mistill.repro.pipeline import LOCK_NAME, stage_name

MARKERS = Path(".dvc/tmp/mistill/code")


def lock_entry(lock_text: str, name: str) -> dict[str, Any] | None:
    """The `stages:` entry `name` of a lock file's text, or None. Only that entry is parsed: the
    evaluate pipeline's lock is half a megabyte, and this runs before every stage command."""
    lines = lock_text.splitlines()
    heads = {f"  {name}:", f"  '{name}':", f'  "{name}":'}
    try:
        start = next(i for i, line in enumerate(lines) if line in heads)
    except StopIteration:
        return None
    end = next((j for j in range(start + 1, len(lines))
                if lines[j].startswith("  ") and not lines[j].startswith("   ")), len(lines))
    entry = yaml.safe_load("\n".join(lines[start:end]))
    return next(iter(entry.values())) if isinstance(entry, dict) else None


def recorded_code(entry: dict[str, Any]) -> dict[str, str]:
    """path -> md5 of the entry's Python file dependencies (a directory's `.dir` hash is not a file's)."""
    return {dep["path"]: dep["md5"] for dep in entry.get("deps", [])
            if str(dep.get("path", "")).endswith(".py") and not str(dep.get("md5", "")).endswith(".dir")}


def current_code(paths: list[str], cwd: Path) -> dict[str, str]:
    """path -> md5 of each file now (DVC 3 hashes a file's bytes as they are); a missing file says so."""
    code = {}
    for path in paths:
        file = cwd / path
        code[path] = hashlib.md5(file.read_bytes()).hexdigest() if file.is_file() else "missing"
    return code


def _marker(root: Path, address: str) -> Path:
    return root / MARKERS / f"{hashlib.sha256(address.encode()).hexdigest()[:16]}.json"


def _read_marker(path: Path) -> dict[str, str] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))["code"]
    except (OSError, ValueError, KeyError, TypeError):
        return None     # none, or unreadable: the lock says what made the outputs


def _lock_path(root: Path, address: str) -> tuple[Path, str]:
    """`pipelines/distill/dvc.yaml:DT-000@qwen-fp32-0` -> (root/pipelines/distill/dvc.lock, its name)."""
    name = stage_name(address)
    dvcfile = address[:-len(name)].rstrip(":")        # empty for the root file's stages
    return root / (Path(dvcfile).parent if dvcfile else Path(".")) / LOCK_NAME, name


def clear_outputs_of_other_code(address: str, root: Path, cwd: Path | None = None) -> list[str]:
    """Remove the outputs of stage `address` if they were made with other code than the files now
    hold; return the paths removed (none when the code is the same, or the rule does not apply)."""
    cwd = Path.cwd() if cwd is None else cwd
    lock, name = _lock_path(root, address)
    entry = lock_entry(lock.read_text(encoding="utf-8"), name) if lock.is_file() else None
    made_by_lock = recorded_code(entry) if entry else {}
    if not made_by_lock:
        return []
    marker = _marker(root, address)
    made_by_run = _read_marker(marker)
    if made_by_run == made_by_lock:          # that run finished and DVC recorded it
        marker.unlink(missing_ok=True)
        made_by_run = None
    made_with = made_by_run if made_by_run is not None else made_by_lock
    now = current_code(sorted(made_with), cwd)
    if now == made_with:
        return []
    removed = []
    for out in entry.get("outs", []):
        path = cwd / out["path"]
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(out["path"])
    write_json(marker, {"stage": address, "code": now})
    changed = sorted(p for p in now if now[p] != made_with.get(p))
    if removed:
        print(f"mistill: {address}: its code changed since its outputs were made ({', '.join(changed)}); "
              f"removed {', '.join(removed)}, so no note is reused from the old code", file=sys.stderr)
    return removed


def guard_stage() -> list[str]:
    """`clear_outputs_of_other_code` for the stage DVC is running this process as, if any."""
    address = os.environ.get("DVC_STAGE")
    if not address or "RANK" in os.environ:
        return []
    return clear_outputs_of_other_code(address, Path(os.environ.get("DVC_ROOT", ".")))
