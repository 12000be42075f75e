"""A jsonl file of one row per note (teacher traces, test-note generations) that a killed run resumes.

The stage declares the file `persist: true`, so `dvc repro` keeps it across a kill (and across
changed inputs) instead of deleting it before the command runs.  Each row carries `input_sha256`,
the digest of everything its note was generated from (the model's fingerprint: its files, dtype and
YaRN; the prompt, the decoding settings, the seed); a row is reused only when that key equals
the note's key now, so no note is ever reused from other inputs.

New rows are appended as they are made: a kill loses at most the line being written, which the
next run drops and recomputes.  At the end the file is rewritten atomically in note order, so its
bytes equal an uninterrupted run's.

Under torchrun (`mistill.shard`: one vLLM engine per process, `models.vllm.data_parallel_size`)
note n of the output order is rank n mod N's. Each rank appends its rows to a part file of its
own beside the output (`<name>.part<rank>`), so no two processes write one file; at the end rank
0 gathers the output and every part file into the output, in note order, and removes the parts.
The bytes are then those of one process's run. A killed run's part files are read on the next
run like the output itself, whatever the number of processes then.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import IO, Any

from mistill.io import write_jsonl
from mistill.shard import Shard

KEY = "input_sha256"
PART = ".part"


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
    """The rows of `path` keyed per note: `keys` maps each note id, in output order, to its input key.
    `shard` is this process's place among torchrun's processes (one process: the whole file)."""

    def __init__(self, path: str | Path, keys: dict[str, str], shard: Shard | None = None):
        self.path, self.keys = Path(path), dict(keys)
        self.shard = shard or Shard()
        self._index = {n: i for i, n in enumerate(self.keys)}
        self.rows: dict[str, dict[str, Any]] = self._reusable()
        self.reused = sum(1 for n in self.rows if self._owns(n))
        self.computed = 0
        self._fh: IO | None = None

    def _parts(self) -> list[Path]:
        return sorted(self.path.parent.glob(f"{self.path.name}{PART}*"))

    def _reusable(self) -> dict[str, dict[str, Any]]:
        """Rows of the output and of any part file a killed sharded run left, under today's input keys."""
        rows: dict[str, dict[str, Any]] = {}
        for source in [self.path, *self._parts()]:
            if not source.exists():
                continue
            for row in complete_rows(source):
                note_id = row.get("note_id")
                if note_id in self.keys and row.get(KEY) == self.keys[note_id]:
                    rows[note_id] = row
        return rows

    def _owns(self, note_id: str) -> bool:
        return self.shard.owns(self._index[note_id])

    @property
    def writes_to(self) -> Path:
        """The file this process appends to: the output itself, or its own part file under torchrun."""
        return self.path if self.shard.world == 1 else self.path.with_name(f"{self.path.name}{PART}{self.shard.rank}")

    def todo(self) -> list[str]:
        """This process's notes without a reusable row, in output order."""
        return [n for n in self.keys if n not in self.rows and self._owns(n)]

    def __enter__(self) -> ResumableRows:
        # keep only this process's reusable rows, then append: rows of other inputs never survive
        mine = [row for row in self.ordered() if self._owns(row["note_id"])]
        write_jsonl(self.writes_to, mine)
        self._fh = self.writes_to.open("a", encoding="utf-8")
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
        """Rewrite the file atomically in note order (every note must have its row) and return its rows.
        Under torchrun every process waits for the others; rank 0 gathers the part files."""
        self.shard.barrier()
        if self.shard.leader:
            self.rows = {**self._reusable(), **self.rows}
            missing = [n for n in self.keys if n not in self.rows]
            if missing:
                raise RuntimeError(f"{self.path}: no row for {len(missing)} notes (first {missing[0]})")
            write_jsonl(self.path, self.ordered())
            for part in self._parts():
                part.unlink()
        self.shard.barrier()
        if not self.shard.leader:
            self.rows = self._reusable()
        return self.ordered()
