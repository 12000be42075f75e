"""The lock and the hash-frozen stages of the evidence-flip cohort (App. N.1-N.2; R-D35).

The cohort is built in stages (draw, retriever and shortlist, screen, proposals, review selection,
authored flips, approval ledger), each of which must not change once a later stage has read it:

* `LOCK.json` pins the rules (params `evidence_flip.rules`) before anything is drawn.  Every stage
  checks the active rules against it; a changed rule is refused, never silently re-drawn.
* `FROZEN.json` holds, per stage, the sha256 of each file the stage wrote.  A stage verifies every
  input it reads against it first: a file that is not frozen, or whose bytes differ from what was
  frozen, stops the stage with one line naming the file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mistill.errors import UserError
from mistill.io import file_sha256, read_json, write_json

LOCK = "LOCK.json"
FROZEN = "FROZEN.json"


def rules_sha256(rules: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(rules, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_lock(root: str | Path, rules: Mapping[str, Any]) -> dict:
    """Pin `rules` in <root>/LOCK.json; an existing lock must hold the same rules."""
    path = Path(root) / LOCK
    if path.exists():
        check_lock(root, rules)
        return read_json(path, "cohort lock")
    lock = {"rules": dict(rules), "rules_sha256": rules_sha256(rules)}
    write_json(path, lock)
    return lock


def check_lock(root: str | Path, rules: Mapping[str, Any]) -> None:
    """Refuse rules that differ from the lock's (one line naming the lock and the first differing rule)."""
    path = Path(root) / LOCK
    if not path.exists():
        raise UserError(f"{path}: no lock; the cohort's first stage writes it from params evidence_flip.rules")
    locked = read_json(path, "cohort lock")
    if locked.get("rules_sha256") != rules_sha256(rules):
        old = locked.get("rules") or {}
        key = next((k for k in sorted(set(old) | set(rules)) if old.get(k) != rules.get(k)), "?")
        raise UserError(f"{path}: the cohort is locked to other rules ({key}: locked {old.get(key)!r}, "
                        f"params {rules.get(key)!r}); a locked rule is not changed after the draw")


def _relative(root: Path, path: str | Path) -> str:
    path = Path(path)
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise UserError(f"{path}: outside the cohort directory {root}; only its own files are frozen") from None


def freeze(root: str | Path, stage: str, paths: Iterable[str | Path]) -> dict[str, str]:
    """Record the sha256 of each of `paths` (files under `root`) as stage `stage`'s outputs."""
    root = Path(root)
    ledger_path = root / FROZEN
    ledger = read_json(ledger_path, "frozen stages") if ledger_path.exists() else {}
    entry = {_relative(root, p): file_sha256(p) for p in paths}
    ledger[stage] = entry
    write_json(ledger_path, ledger)
    return entry


def verify(root: str | Path, paths: Iterable[str | Path]) -> None:
    """Check each input against the frozen ledger before a stage reads it."""
    root = Path(root)
    ledger_path = root / FROZEN
    ledger = read_json(ledger_path, "frozen stages") if ledger_path.exists() else {}
    frozen = {name: (stage, sha) for stage, entry in ledger.items() for name, sha in entry.items()}
    for path in paths:
        name = _relative(root, path)
        if name not in frozen:
            raise UserError(f"{path}: not frozen by any stage of {ledger_path}; run the stage that writes it")
        stage, sha = frozen[name]
        got = file_sha256(path) if Path(path).exists() else "missing"
        if got != sha:
            raise UserError(f"{path}: differs from what stage {stage} froze (sha256 {got[:12]}, frozen "
                            f"{sha[:12]}); a frozen input may not change")
