"""Atomic artifact writes and provenance shared by every pass.

Every artifact is written to a temporary file in its own directory and renamed
into place, so a killed run leaves either the old file or the new one, never a
half-written one.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from glob import escape as glob_escape
from pathlib import Path
from typing import IO, Any

from mistill.errors import UserError


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


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Delete what a killed writer of `path` left behind (atomic_open's temporary siblings).

    A SIGKILL or SIGTERM ends a process without running its cleanup, so its temporary file stays.
    Call this only where one process owns `path` (a per-note artifact), never beside a live writer."""
    path = Path(path)
    stale = sorted(path.parent.glob(f".{glob_escape(path.name)}.*.tmp"))
    for leftover in stale:
        leftover.unlink(missing_ok=True)
    return stale


def write_json(path: str | Path, obj: Any, *, indent: int = 2) -> None:
    with atomic_open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=indent, sort_keys=False, ensure_ascii=False)
        fh.write("\n")


def write_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> None:
    with atomic_open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


TRUNCATED = ("the file looks truncated (an interrupted write or copy): restore it (dvc checkout) "
             "or delete it and rerun the stage that writes it")


def _reason(err: json.JSONDecodeError) -> str:
    return err.msg.removesuffix(" starting at").lower()


def iter_json_lines(path: str | Path, what: str) -> Iterator[tuple[str, Any]]:
    """Each non-blank line of a jsonl file as (`file:line`, parsed value), for loaders that
    validate row by row.  A missing file, a file that is not UTF-8 text or a line that is not
    JSON is a one-line UserError naming the file and line; a cut-off last line (no newline,
    not JSON) is reported as a truncated file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such {what} file")
    try:
        with path.open(encoding="utf-8") as fh:
            for number, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    value = json.loads(raw.rstrip("\r\n"))  # columns count within the line
                except json.JSONDecodeError as err:
                    # only the last line can lack its newline: a line cut off mid-record
                    hint = TRUNCATED if not raw.endswith("\n") else f"fix the line or rebuild the {what} file"
                    raise UserError(f"{where}: not a JSON object at column {err.colno} ({_reason(err)}); "
                                  f"{hint}") from None
                yield where, value
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text ({err.reason}); is it a {what} file?") from None


def read_jsonl(path: str | Path, what: str = "JSON lines") -> list[dict[str, Any]]:
    """Every row of a jsonl file; each must be a JSON object (see `iter_json_lines` for the errors)."""
    rows = []
    for where, row in iter_json_lines(path, what):
        if not isinstance(row, dict):
            raise UserError(f"{where}: not a JSON object (a {type(row).__name__}); "
                            f"fix the line or rebuild the {what} file")
        rows.append(row)
    return rows


def read_json(path: str | Path, what: str = "JSON") -> Any:
    """A JSON document; a missing, empty, non-UTF-8 or malformed file is a one-line UserError
    naming the file and line (an unexpected end of the document: a truncated file)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such {what} file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text ({err.reason}); is it a {what} file?") from None
    if not text.strip():
        raise UserError(f"{path}: empty {what} file; {TRUNCATED}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        # the document ends where a value, a delimiter or a string's closing quote was due
        cut = err.pos >= len(text.rstrip()) or err.msg.startswith("Unterminated string")
        hint = TRUNCATED if cut else f"fix it or rebuild the {what} file"
        raise UserError(f"{path}:{err.lineno}: not valid JSON at column {err.colno} ({_reason(err)}); "
                        f"{hint}") from None


def read_npz(path: str | Path, what: str = "arrays") -> dict[str, Any]:
    """Every array of an `.npz` file (no pickles); a missing, truncated or corrupt file is a
    one-line UserError naming the file."""
    import zipfile

    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such {what} file")
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("an .npy array, not an .npz archive")
        with data:
            return {key: data[key] for key in data.files}
    except (zipfile.BadZipFile, EOFError, ValueError, OSError) as err:
        detail = str(err).splitlines()[0] if str(err) else "no detail"
        raise UserError(f"{path}: unreadable {what} ({type(err).__name__}: {detail}); {TRUNCATED}") from None


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
    """The git commit of the working tree, with `+dirty` when it has local changes.

    What the pipeline itself writes (each pipeline file's `dvc.lock`, the numbers files under `results/`) does not
    count: a `dvc repro` from a clean checkout rewrites a `dvc.lock` after its first stage, and every
    later stage would otherwise record a dirty tree.
    """
    return code_version_of(os.getcwd())


@functools.lru_cache(maxsize=None)
def code_version_of(root: str) -> str:
    """`code_version` of the tree at `root`, asked of git once per process.

    A command records it in every artifact it writes (an instrument pass, hundreds), and each answer costs two
    git processes; a tree does not change under a running command, so the first answer stands for the
    process. The warm server forks every command afresh, so each command still asks git once.
    """
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=root).stdout
        # every pipeline file's dvc.lock, at any depth (`**/` matches the root too), and the numbers files
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude,glob)**/dvc.lock", ":(exclude)results"],
                               capture_output=True, text=True, check=True, cwd=root).stdout
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
