"""Numbers files: the one contract between a result's reader and everything downstream.

``results/<ID>.json``::

    {"id": "R-C1", "profile": "demo", "reader": "readers/r_c1.py",
     "inputs": {"artifacts/HD-001": "<sha256>", ...},
     "values": {"<key>": {"value": 6.02, "statistic": "median over P1 events",
                          "artifact": "artifacts/HD-001"}},
     "code_version": "<git commit>[+dirty]", "params_sha256": "<sha256>"}

Every reader writes it with `write_numbers` (atomically, after validating the
id and keys against the registry) and the checker and renderer read it with
`read_numbers`.  Both hold `statistic` and `artifact` to their whitelist grammar
(`mistill.repro.text_fields`): a numbers file is shared, so its text may describe
a number, never quote a note.  Under a profile whose `privacy.hash_note_ids` is
true, per-note input paths (and artifact fields) name notes by a keyed hash
(`mistill.repro.privacy.NotePseudonyms`), never by their ids.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from mistill.errors import UserError
from mistill.io import code_version, file_sha256, write_json
from mistill.repro.privacy import NotePseudonyms, PrivacySettings, note_pseudonyms
from mistill.repro.registry import Registry, load_registry
from mistill.repro.text_fields import artifact_problem, statistic_problem

REQUIRED_FIELDS = ("id", "profile", "reader", "inputs", "values", "code_version")
VALUE_FIELDS = ("value", "statistic", "artifact")


@dataclass(frozen=True)
class NumbersFile:
    path: Path
    id: str
    profile: str
    reader: str
    inputs: dict[str, str]
    values: dict[str, dict[str, Any]]      # key -> {value, statistic, artifact}
    code_version: str
    params_sha256: str


def numbers_path(results_dir: str | Path, result_id: str) -> Path:
    return Path(results_dir) / f"{result_id}.json"


def write_numbers(result_id: str, values: Mapping[str, Mapping[str, Any]], *, reader: str,
                  inputs: Iterable[str | Path], params: Mapping[str, Any],
                  results_dir: str | Path | None = None, root: str | Path = ".",
                  registry: Registry | None = None, declared_keys: Iterable[str] = ()) -> Path:
    """Validate and atomically write ``<results_dir>/<result_id>.json``; return its path.

    `params` is the active profile's section (`mistill.params.load_params()`);
    its `profile` names the profile and its `paths.results` the directory unless
    `results_dir` is given.  Keys must be the profile's expected keys for this id
    when the profile records any, else keys the registry knows for it, or keys the
    reader declares it writes under these params (`declared_keys`: a reader's
    `keys(params)`, e.g. a head the demo names by its own rule), which the check
    then reports as values without expected values until they are blessed.  With
    `privacy.hash_note_ids`, note ids in input paths and artifact fields become
    pseudonyms (the note files of `privacy.notes`, relative to `root`, must exist).
    """
    registry = registry or load_registry(root)
    result = registry.get(result_id)
    profile = params.get("profile")
    if not isinstance(profile, str) or profile not in registry.profiles:
        raise UserError(f"{result_id}: params must name a registered profile under 'profile', got {profile!r}")
    profile_keys = registry.expected(profile).values.get(result_id)
    allowed = set(profile_keys) if profile_keys else set(registry.registered_keys(result_id))
    allowed |= set(declared_keys)
    if not values:
        raise UserError(f"{result_id}: no values to write")
    clean: dict[str, dict[str, Any]] = {}
    for key, record in values.items():
        if key not in allowed:
            source = f"{profile} expected values" if profile_keys else "the registry"
            raise UserError(f"{result_id}: unknown value key {key!r} (not in {source} for this id)")
        clean[key] = _clean_value(result_id, key, record)
    if results_dir is None:
        results_dir = Path(root) / params.get("paths", {}).get("results", "results")
    input_hashes = hash_inputs(inputs)
    pseudonyms = _note_pseudonyms(params, root)
    if pseudonyms is not None:
        input_hashes = {pseudonyms.path(path): digest for path, digest in input_hashes.items()}
        for entry in clean.values():
            entry["artifact"] = pseudonyms.artifact(entry["artifact"])
    record = {
        "id": result.id,
        "profile": profile,
        "reader": str(reader),
        "inputs": input_hashes,
        "values": clean,
        "code_version": code_version(),
        "params_sha256": params_sha256(params),
    }
    path = numbers_path(results_dir, result_id)
    write_json(path, record)
    return path


def read_numbers(path: str | Path, registry: Registry | None = None) -> NumbersFile:
    """Parse and validate one numbers file; any defect is one UserError line naming the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: no such numbers file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: malformed numbers file (not JSON: {err})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: malformed numbers file (expected a JSON object)")
    missing = [f for f in REQUIRED_FIELDS if f not in data]
    if missing:
        raise UserError(f"{path}: malformed numbers file (missing {', '.join(missing)})")
    rid = data["id"]
    if registry is not None:
        if rid not in registry.results:
            raise UserError(f"{path}: unknown result id {rid!r}")
        if path.name != f"{rid}.json":
            raise UserError(f"{path}: file name does not match its id {rid!r}")
    if not isinstance(data["values"], dict) or not data["values"]:
        raise UserError(f"{path}: malformed numbers file ('values' must be a non-empty object)")
    if not isinstance(data["inputs"], dict):
        raise UserError(f"{path}: malformed numbers file ('inputs' must map paths to sha256)")
    values = {}
    for key, record in data["values"].items():
        try:
            values[key] = _clean_value(rid, key, record)
        except UserError as err:
            raise UserError(f"{path}: malformed numbers file ({err})") from None
    return NumbersFile(path=path, id=rid, profile=str(data["profile"]), reader=str(data["reader"]),
                       inputs=dict(data["inputs"]), values=values, code_version=str(data["code_version"]),
                       params_sha256=str(data.get("params_sha256", "")))


def hash_inputs(inputs: Iterable[str | Path]) -> dict[str, str]:
    """sha256 of each input file; a directory hashes its files' relative paths and contents."""
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    hashes: dict[str, str] = {}
    for item in inputs:
        path = Path(item)
        if path.is_file():
            hashes[str(item)] = file_sha256(path)
        elif path.is_dir():
            digest = hashlib.sha256()
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                digest.update(str(file.relative_to(path)).encode() + b"\0" + file_sha256(file).encode() + b"\n")
            hashes[str(item)] = digest.hexdigest()
        else:
            raise UserError(f"input {item}: no such file or directory")
    return hashes


def _note_pseudonyms(params: Mapping[str, Any], root: str | Path) -> NotePseudonyms | None:
    """The profile's note pseudonyms when `privacy.hash_note_ids` is set, else None."""
    settings = PrivacySettings.from_params(params)
    return note_pseudonyms(settings, root) if settings.hash_note_ids else None


def params_sha256(params: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()


def _clean_value(result_id: str, key: str, record: Any) -> dict[str, Any]:
    if not isinstance(record, Mapping):
        raise UserError(f"{result_id}.{key}: expected {{value, statistic, artifact}}, got {record!r}")
    missing = [f for f in VALUE_FIELDS if f not in record]
    if missing:
        raise UserError(f"{result_id}.{key}: missing {', '.join(missing)}")
    value = _plain_number(record["value"])
    if value is None:
        raise UserError(f"{result_id}.{key}: value must be a finite number or a list of them, "
                        f"got {record['value']!r}")
    text = {"statistic": record["statistic"], "artifact": record["artifact"]}
    if isinstance(text["artifact"], PurePath):
        text["artifact"] = str(text["artifact"])
    for name, problem in (("statistic", statistic_problem), ("artifact", artifact_problem)):
        why = problem(text[name])
        if why:
            raise UserError(f"{result_id}.{key}: {name} {why}")
    return {"value": value, **text}


def _plain_number(value: Any) -> Any:
    """JSON-safe int/float/list of them (numpy scalars and arrays accepted); None if not finite numbers."""
    if hasattr(value, "tolist"):          # numpy scalar or array
        value = value.tolist()
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)) and value:
        items = [_plain_number(v) for v in value]
        return None if any(v is None for v in items) else items
    return None
