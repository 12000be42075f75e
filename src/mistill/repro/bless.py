"""Bless: record the current numbers of named results as the demo's goldens.

Goldens change only on purpose: `mistill repro bless R-C1 R-C3` copies those
numbers files into ``results/expected/<profile>.yaml`` with their provenance
(code version, params hash, machine, date) and prints every value that moved;
the commit that carries the change says why.  A profile whose expected file is
marked ``blessable: false`` (the paper's printed values) cannot be blessed.

Each golden keeps the kind and class the registry gives the same key under the
paper profile (so it takes the same default tolerance), and a tolerance that a
previous golden set by hand survives re-blessing.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
from pathlib import Path
from typing import Any

import yaml

from mistill.errors import UserError
from mistill.io import atomic_open, file_sha256
from mistill.repro.check import fmt_value
from mistill.repro.numbers import numbers_path, read_numbers
from mistill.repro.registry import Registry, expected_path, infer_kind

HEADER = """\
# Expected values of the {profile} profile: goldens from a reference run, written by
# `mistill repro bless <IDS>` with their provenance.  Change them only on purpose, in a
# commit that says why the numbers moved.  A value's tolerance is its own `tolerance` or
# the default for its class and kind (registry.yaml: tolerance_defaults).
"""


def bless(registry: Registry, ids: list[str], *, profile: str, results_dir: str | Path) -> list[str]:
    """Write goldens for `ids`; return one line per changed value (and per new id)."""
    if not ids:
        raise UserError("bless needs the result ids to bless (goldens change only on purpose)")
    for rid in ids:
        registry.get(rid)
    path = expected_path(registry.root, profile)
    data: dict[str, Any] = {}
    if path.exists():
        with path.open(encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    meta = data.get("meta") or {"profile": profile, "source": "goldens from a reference run of this profile",
                                 "printed_rounding": False, "blessable": True}
    if not meta.get("blessable", False):
        raise UserError(f"{path}: profile {profile!r} holds fixed expected values (blessable: false)")
    expected = data.get("expected") or {}
    provenance = data.get("provenance") or {}
    paper_like = {p: registry.expected(p).values for p in registry.profiles if p != profile}
    changes: list[str] = []
    blessed: dict[str, dict[str, Any]] = {}
    for rid in ids:
        npath = numbers_path(results_dir, rid)
        numbers = read_numbers(npath, registry)
        if numbers.profile != profile:
            raise UserError(f"{npath}: written under profile {numbers.profile!r}, blessing {profile!r}")
        old = expected.get(rid, {})
        entries = {}
        for key, record in numbers.values.items():
            reference = next((vals[rid][key] for vals in paper_like.values() if key in vals.get(rid, {})), None)
            entry: dict[str, Any] = {
                "value": record["value"],
                "stat": record["statistic"],
                "kind": reference.kind if reference else old.get(key, {}).get(
                    "kind", infer_kind(key, record["value"], record["statistic"])),
                "class": reference.cls if reference else ",".join(registry.results[rid].nondeterminism),
            }
            if "tolerance" in old.get(key, {}):
                entry["tolerance"] = old[key]["tolerance"]
                if str(old[key]["tolerance"].get("basis", "")).startswith("invariant"):
                    # an invariant's expected value is the invariant itself, not the run's rounding error
                    entry.update(value=old[key]["value"], kind=old[key].get("kind", entry["kind"]),
                                 **{"class": old[key].get("class", entry["class"])})
            entries[key] = entry
            before = old.get(key, {}).get("value")
            if before != record["value"]:
                changes.append(f"{rid}.{key}: {fmt_value(before)} -> {fmt_value(record['value'])}")
        for key in old:
            if key not in entries:
                changes.append(f"{rid}.{key}: {fmt_value(old[key].get('value'))} -> (dropped)")
        blessed[rid] = entries
        provenance[rid] = {
            "code_version": numbers.code_version,
            "params_sha256": numbers.params_sha256,
            "reader": numbers.reader,
            "numbers_sha256": file_sha256(npath),
            "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs, "
                       f"{platform.system()} {platform.release()})",
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    expected.update(blessed)
    ordered = {rid: expected[rid] for rid in registry.results if rid in expected}
    out = {"meta": meta, "expected": ordered,
           "provenance": {rid: provenance[rid] for rid in registry.results if rid in provenance}}
    text = yaml.safe_dump(out, sort_keys=False, allow_unicode=True, width=120, default_flow_style=None)
    with atomic_open(path, "w", encoding="utf-8") as fh:
        fh.write(HEADER.format(profile=profile) + text)
    registry._expected.pop(profile, None)       # the cached set is stale now
    registry.expected(profile)                  # and what we wrote must load
    return changes
