"""Bless: record the current numbers of named results as the demo's goldens.

Goldens change only on purpose: `mistill repro bless R-C1 R-C3` copies those
numbers files into ``results/expected/<profile>.yaml`` with their provenance
(code version, params hash, machine, date) and prints every value that moved;
the commit that carries the change says why.  A profile whose expected file is
marked ``blessable: false`` (the paper's printed values) cannot be blessed.

Before writing anything, bless refuses

* a work tree with uncommitted changes to tracked files (other than what the
  pipeline and bless write: every dvc.lock, the results directory, REGISTRY.md), so
  that the provenance's commit names the code that made the numbers;
* a numbers file whose recorded input hashes no longer match the artifacts on
  disk (the numbers were read from other artifacts than the ones now there);
* a breach: a value the check finds outside its tolerance, or an expected value
  the numbers file no longer holds, unless ``--accept-breach "<reason>"`` is
  given; the reason and the breached values go into the golden's provenance.
  Values never blessed before are additions, not breaches.

Each golden keeps the kind and class the registry gives the same key under the
paper profile (so it takes the same default tolerance), and a tolerance that a
previous golden set by hand or by the calibration (with its descriptive mark)
survives re-blessing.
"""

from __future__ import annotations

import datetime as dt
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mistill.errors import UserError
from mistill.io import atomic_open, file_sha256
from mistill.repro.check import FAIL, NOT_REPRODUCED, CheckLine, fmt_value, run_check
from mistill.repro.machine import describe_machine
from mistill.repro.numbers import NumbersFile, hash_inputs, numbers_path, read_numbers
from mistill.repro.pipeline import lock_files
from mistill.repro.registry import EXPECTED_DIR, Registry, expected_path, infer_kind, kind_range
from mistill.repro.registry_md import REGISTRY_MD
from mistill.repro.tolerance import flatten, says_null

# Verdicts of the check that make blessing a change of the goldens rather than a refresh of them.
BREACH_VERDICTS = (FAIL, NOT_REPRODUCED)
# Tracked files the pipeline and bless itself write: changes to them are not changes to the code.
PIPELINE_OUTPUTS = (REGISTRY_MD,)           # and every pipeline file's dvc.lock (mistill.repro.pipeline)

HEADER = """\
# Expected values of the {profile} profile: goldens from a reference run, written by
# `mistill repro bless <IDS>` with their provenance.  Change them only on purpose, in a
# commit that says why the numbers moved.  A value's tolerance is its own `tolerance` or
# the default for its class and kind (registry.yaml: tolerance_defaults).
"""


@dataclass
class Blessing:
    changes: list[str] = field(default_factory=list)             # one line per moved, new or dropped value
    accepted: dict[str, list[str]] = field(default_factory=dict)  # id -> its breaches accepted with a reason


def bless(registry: Registry, ids: list[str], *, profile: str, results_dir: str | Path,
          accept_breach: str | None = None) -> Blessing:
    """Write goldens for `ids` after the refusals above; return what changed and which breaches were accepted."""
    if not ids:
        raise UserError("bless needs the result ids to bless (goldens change only on purpose)")
    for rid in ids:
        registry.get(rid)
    if accept_breach is not None and not accept_breach.strip():
        raise UserError("--accept-breach needs a reason: say why the numbers moved")
    if registry.expected_source(profile) != profile:
        raise UserError(f"profile {profile!r} is checked against {registry.expected_source(profile)!r}'s expected "
                        "values (registry.yaml expected_from): it has no goldens of its own to bless")
    path = expected_path(registry.root, profile)
    data: dict[str, Any] = {}
    if path.exists():
        with path.open(encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    meta = data.get("meta") or {"profile": profile, "source": "goldens from a reference run of this profile",
                                 "printed_rounding": False, "blessable": True}
    if not meta.get("blessable", False):
        raise UserError(f"{path}: profile {profile!r} holds fixed expected values (blessable: false)")
    refuse_uncommitted_code(registry.root, results_dir)
    numbers = {rid: read_numbers(numbers_path(results_dir, rid), registry) for rid in ids}
    for record in numbers.values():
        if record.profile != profile:
            raise UserError(f"{record.path}: written under profile {record.profile!r}, blessing {profile!r}")
        refuse_stale_inputs(record, registry.root)
    breaches = breaches_of(registry, profile, results_dir, ids)
    if breaches and accept_breach is None:
        listed = [phrase for phrases in breaches.values() for phrase in phrases]
        raise UserError(f"bless: {len(listed)} value(s) breach the current goldens, e.g. {listed[0]}; rerun, "
                        'or bless with --accept-breach "<why the numbers moved>"')

    expected = data.get("expected") or {}
    provenance = data.get("provenance") or {}
    paper_like = {p: registry.expected(p).values for p in registry.value_profiles if p != profile}
    blessing = Blessing()
    blessed: dict[str, dict[str, Any]] = {}
    for rid, record in numbers.items():
        old = expected.get(rid, {})
        entries = {}
        for key, number in record.values.items():
            reference = next((vals[rid][key] for vals in paper_like.values() if key in vals.get(rid, {})), None)
            entry: dict[str, Any] = {
                "value": number["value"],
                "stat": number["statistic"],
                "kind": reference.kind if reference else old.get(key, {}).get(
                    "kind", infer_kind(key, number["value"], number["statistic"])),
                "class": reference.cls if reference else ",".join(registry.results[rid].nondeterminism),
            }
            if "descriptive" in old.get(key, {}):       # the calibration's mark, or one set by hand
                entry["descriptive"] = dict(old[key]["descriptive"])
                low, high = entry["descriptive"]["range"]
                values = flatten(number["value"]) or []      # a list of intervals too: every number in it
                if any(not low <= float(v) <= high for v in values):
                    # a ratio the calibration saw below its kind's bound (a lift under 1) is unbounded after all
                    entry["descriptive"]["range"] = kind_range(entry["kind"], [low, high, *map(float, values)],
                                                                  entry["stat"])
            if "null_interval" in old.get(key, {}) and says_null(key, number["value"]):
                entry["null_interval"] = old[key]["null_interval"]   # the same, while the interval still says null
            if "tolerance" in old.get(key, {}):
                # a tolerance of its own cites its class: kept with it (the demo recomputes what the paper
                # holds exact given stored artifacts, so some of its values cite a class the paper's do not)
                entry["tolerance"] = old[key]["tolerance"]
                entry["class"] = old[key].get("class", entry["class"])
                if str(old[key]["tolerance"].get("basis", "")).startswith("invariant"):
                    # an invariant's expected value is the invariant itself, not the run's rounding error
                    entry.update(value=old[key]["value"], kind=old[key].get("kind", entry["kind"]),
                                 **{"class": old[key].get("class", entry["class"])})
            entries[key] = entry
            before = old.get(key, {}).get("value")
            if before != number["value"]:
                blessing.changes.append(f"{rid}.{key}: {fmt_value(before)} -> {fmt_value(number['value'])}")
        for key in old:
            if key not in entries:
                blessing.changes.append(f"{rid}.{key}: {fmt_value(old[key].get('value'))} -> (dropped)")
        blessed[rid] = entries
        provenance[rid] = {
            "code_version": record.code_version,
            "params_sha256": record.params_sha256,
            "reader": record.reader,
            "numbers_sha256": file_sha256(record.path),
            "machine": describe_machine(),
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if rid in breaches:
            provenance[rid]["accepted_breach"] = accept_breach
            provenance[rid]["breached"] = "; ".join(breaches[rid])
            blessing.accepted[rid] = breaches[rid]
    expected.update(blessed)
    ordered = {rid: expected[rid] for rid in registry.results if rid in expected}
    out = {"meta": meta, "expected": ordered,
           "provenance": {rid: provenance[rid] for rid in registry.results if rid in provenance}}
    text = yaml.safe_dump(out, sort_keys=False, allow_unicode=True, width=120, default_flow_style=None)
    with atomic_open(path, "w", encoding="utf-8") as fh:
        fh.write(HEADER.format(profile=profile) + text)
    registry._expected.pop(profile, None)       # the cached set is stale now
    registry.expected(profile)                  # and what we wrote must load
    return blessing


def breaches_of(registry: Registry, profile: str, results_dir: str | Path, ids: list[str]) -> dict[str, list[str]]:
    """id -> one phrase per value the check finds breached ("R-C1.p1_event_count 322 -> 999 (exact)")."""
    breaches: dict[str, list[str]] = {}
    for line in run_check(registry, profile, results_dir, ids).lines:
        if line.verdict in BREACH_VERDICTS and line.key != "*":
            breaches.setdefault(line.result_id, []).append(_breach(line))
    return breaches


def _breach(line: CheckLine) -> str:
    if line.verdict == NOT_REPRODUCED:
        return f"{line.result_id}.{line.key} {fmt_value(line.expected)} -> (not in the numbers file)"
    return f"{line.result_id}.{line.key} {fmt_value(line.expected)} -> {fmt_value(line.got)} ({line.tolerance})"


def refuse_uncommitted_code(root: Path, results_dir: str | Path) -> None:
    """Refuse a work tree whose tracked files (outside what the pipeline writes) differ from HEAD."""
    head = _git(root, "rev-parse", "--short", "HEAD")
    changed = _git(root, "diff", "--name-only", "--relative", "-z", "HEAD").split("\0")
    written = _pipeline_outputs(root, results_dir)
    dirty = [f for f in changed if f and not any(f == w or f.startswith(w + "/") for w in written)]
    if dirty:
        raise UserError(f"bless: {len(dirty)} tracked file(s) have uncommitted changes (code version "
                        f"{head}+dirty, e.g. {dirty[0]}); commit them first so the goldens' provenance names "
                        "the code that made them")


def _pipeline_outputs(root: Path, results_dir: str | Path) -> list[str]:
    """Paths relative to `root` that the pipeline and bless write (the results directory among them)."""
    written = [*(p.as_posix() for p in lock_files(root)), *PIPELINE_OUTPUTS]
    for directory in (Path(results_dir), Path(root) / EXPECTED_DIR):
        try:
            written.append(directory.resolve().relative_to(root.resolve()).as_posix())
        except ValueError:
            pass                                # outside the work tree: git does not see it
    return written


def _git(root: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        raise UserError(f"bless: {root.resolve()} is not a git work tree with a commit; goldens record the "
                        "commit of the code that made them") from None
    return done.stdout.strip()


def refuse_stale_inputs(numbers: NumbersFile, root: Path) -> None:
    """Refuse numbers whose recorded input hashes differ from the artifacts on disk now."""
    for name, recorded in numbers.inputs.items():
        path = Path(name) if Path(name).is_absolute() else Path(root) / name
        if not path.exists():
            raise UserError(f"bless: {numbers.path} was read from {name}, which is missing; "
                            f"restore it (dvc checkout) or rerun `dvc repro {numbers.id}`")
        if hash_inputs([path])[str(path)] != recorded:
            raise UserError(f"bless: {numbers.path} was read from another {name} than the one on disk "
                            f"(sha256 differs); rerun `dvc repro {numbers.id}`")
