"""Training-set size (App. M.5, R-D8): the nested note subsets a learning curve trains on.

A run told to train on n notes trains on the n notes of its targets whose ids come first when the ids are
ordered by their SHA-256 digests.  The order depends on the ids alone, not on the file's order or the run's
seed, so every arm and seed at one size trains on the same notes, and the notes of a smaller size are among
those of every larger one: the curve adds notes, it does not swap them.  The chosen notes keep the
targets' order, so a run's batches are drawn as the full run's are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from mistill.errors import UserError


def _rank(note_id: str) -> str:
    return hashlib.sha256(note_id.encode()).hexdigest()


def training_subset(note_ids: Sequence[str], n: int | None) -> list[str]:
    """The first `n` of `note_ids` by the digest of the id, in their given order; all of them when `n` is None."""
    ids = list(note_ids)
    if n is None:
        return ids
    if len(set(ids)) != len(ids):
        raise UserError("training notes: the targets name a note twice")
    if not 1 <= int(n) <= len(ids):
        raise UserError(f"--n-train {n}: the targets hold {len(ids)} training notes; give 1 to {len(ids)}")
    chosen = set(sorted(ids, key=_rank)[: int(n)])
    return [i for i in ids if i in chosen]
