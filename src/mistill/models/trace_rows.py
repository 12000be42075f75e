"""A jsonl file of one row per note (teacher traces, test-note generations) that a killed run resumes.

The stage declares the file `persist: true`, so `dvc repro` keeps it across a kill (and across
changed inputs) instead of deleting it before the command runs.  Each row carries `input_sha256`,
the digest of everything its note was generated from (the model's fingerprint: its files, dtype and
YaRN; the prompt, the decoding settings, the seed); a row is reused only when that key equals
the note's key now, so no note is ever reused from other inputs.

New rows are appended as they are made: a kill loses at most the line being written, which the
next run drops and recomputes.  At the end the file is rewritten atomically in note order, so its
bytes equal an uninterrupted run's.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import IO, Any

from mistill.io import write_jsonl

KEY = "input_sha256"


def input_key(**inputs: Any) -> str:
    """sha256 of the named inputs of one note's row (JSON, keys sorted)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def complete_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a file a killed run may have cut mid-line; a line that is not a JSON object is dropped
    (its note is recomputed), where a finished file's reader would refuse it."""
    rows = []
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


class ResumableRows:
    """The rows of `path` keyed per note: `keys` maps each note id, in output order, to its input key."""

    def __init__(self, path: str | Path, keys: dict[str, str]):
        self.path, self.keys = Path(path), dict(keys)
        self.rows: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            for row in complete_rows(self.path):
                note_id = row.get("note_id")
                if note_id in self.keys and row.get(KEY) == self.keys[note_id]:
                    self.rows[note_id] = row
        self.reused = len(self.rows)
        self.computed = 0
        self._fh: IO | None = None

    def todo(self) -> list[str]:
        """The notes without a reusable row, in output order."""
        return [n for n in self.keys if n not in self.rows]

    def __enter__(self) -> ResumableRows:
        # keep only the reusable rows, then append: rows of other inputs never survive into the output
        write_jsonl(self.path, self.ordered())
        self._fh = self.path.open("a", encoding="utf-8")
        return self

    def add(self, row: dict[str, Any]) -> None:
        """Record one note's row (its `input_sha256` set here) durably before the next note starts."""
        row = {**row, KEY: self.keys[row["note_id"]]}
        self.rows[row["note_id"]] = row
        self.computed += 1
        if self._fh is not None:
            self._fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def __exit__(self, *exc: Any) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def ordered(self) -> list[dict[str, Any]]:
        return [self.rows[n] for n in self.keys if n in self.rows]

    def finish(self) -> list[dict[str, Any]]:
        """Rewrite the file atomically in note order; every note must have its row."""
        missing = self.todo()
        if missing:
            raise RuntimeError(f"{self.path}: no row for {len(missing)} notes (first {missing[0]})")
        rows = self.ordered()
        write_jsonl(self.path, rows)
        return rows
