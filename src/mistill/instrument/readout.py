"""What the instrument's readers share: locating HD-001's artifacts and writing numbers files.

Readers emit keys named by what they are.  A key the registry does not (yet) know
for the result is not written; it is printed on one line, so nothing is dropped
silently, and `--strict` makes it an error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mistill.errors import UserError
from mistill.io import read_json
from mistill.params import load_params


def reader_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--profile", default=None, help="params.yaml profile (default: the active one)")
    parser.add_argument("--strict", action="store_true", help="fail on keys the registry does not know")
    return parser.parse_args()


def load_json(path: Path) -> dict:
    if not path.exists():
        raise UserError(f"{path}: missing; run the instrument pass that writes it first")
    return read_json(path, "instrument output")


def value(v: Any, statistic: str, artifact: str | Path) -> dict:
    return {"value": v, "statistic": statistic, "artifact": str(artifact)}


def emit(result_id: str, values: dict[str, dict], *, reader: str, inputs: list, params: dict,
         strict: bool = False) -> Path:
    """Write the registry-known keys through mistill.repro.numbers; report the others."""
    from mistill.repro.numbers import write_numbers
    from mistill.repro.registry import load_registry

    registry = load_registry(".")
    profile_keys = registry.expected(params["profile"]).values.get(result_id)
    allowed = set(profile_keys) if profile_keys else set(registry.registered_keys(result_id))
    unknown = sorted(k for k in values if k not in allowed)
    if unknown:
        message = f"{result_id}: keys not in the registry, not written: {', '.join(unknown)}"
        if strict:
            raise UserError(message)
        print(f"{reader}: {message}", file=sys.stderr)
    kept = {k: v for k, v in values.items() if k in allowed}
    if not kept:
        raise UserError(f"{result_id}: none of the computed keys is registered ({', '.join(sorted(values))})")
    path = write_numbers(result_id, kept, reader=reader, inputs=[str(p) for p in inputs], params=params)
    print(f"{reader}: wrote {path} ({len(kept)} values)")
    return path


def instrument_dir(params: dict) -> Path:
    section = params.get("instrument") or {}
    return Path(section.get("out_dir", "artifacts/HD-001"))


def active_params(profile: str | None) -> dict:
    return load_params(profile=profile)
