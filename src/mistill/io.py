"""Atomic artifact writes and provenance shared by every pass.

Every artifact is written to a temporary file in its own directory and renamed
into place, so a killed run leaves either the old file or the new one, never a
half-written one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing; rename it over `path` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    # mkstemp creates 0600 files; artifacts get the usual permissions under the user's umask.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        with os.fdopen(fd, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | Path, obj: Any, *, indent: int = 2) -> None:
    with atomic_open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=indent, sort_keys=False, ensure_ascii=False)
        fh.write("\n")


def write_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> None:
    with atomic_open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with Path(path).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def iter_json_lines(path: str | Path, what: str) -> Iterator[tuple[str, Any]]:
    """Each non-blank line of a jsonl file as (`file:line`, parsed value), for loaders that
    validate row by row; a missing file or a line that is not JSON is a one-line UserError."""
    from mistill.errors import UserError

    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such {what} file")
    with path.open(encoding="utf-8") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            try:
                yield where, json.loads(raw)
            except json.JSONDecodeError as err:
                raise UserError(f"{where}: not a JSON object ({err.msg})") from None


def write_npz(path: str | Path, **arrays: Any) -> None:
    import numpy as np

    with atomic_open(path, "wb") as fh:
        np.savez(fh, **arrays)


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def code_version() -> str:
    """The git commit of the working tree, with `+dirty` when it has local changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.strip() + ("+dirty" if dirty.strip() else "")


def provenance(params: dict[str, Any], seed: int | None = None, **extra: Any) -> dict[str, Any]:
    """What every artifact records: code version, the parameters it read and its seed."""
    record = {"code_version": code_version(), "params": params}
    if seed is not None:
        record["seed"] = seed
    record.update(extra)
    return record
