"""The active profile's parameters.

`params.yaml` holds one section per profile (`demo: &demo`, `paper: &paper`,
each with its `name`) and, last, `profile: *demo`: a YAML alias that makes one
section the active profile, so DVC stages can read `profile.<section>` directly.
Code never branches on the profile's name: it reads sizes, paths and model ids
from the active section, which `load_params()` returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mistill.errors import UserError

DEFAULT_PARAMS = Path("params.yaml")
# libyaml's parser under the safe constructor: the values of yaml.safe_load in an eighth of the time
# (every stage reads the whole file, every profile's section, several times)
FAST_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_all(path: str | Path = DEFAULT_PARAMS) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such parameters file (run from the repository root)")
    try:
        text = path.read_text(encoding="utf-8")
        try:
            data = yaml.load(text, Loader=FAST_SAFE_LOADER)
        except yaml.YAMLError:
            data = yaml.safe_load(text)   # the pure-Python parser's message names what is wrong
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if "undefined alias" in problem:   # `profile: *name` with no `name: &name` section
            import re

            known = re.findall(r"(?m)^[\w-]+: &([\w-]+)", path.read_text(encoding="utf-8"))
            raise UserError(f"{where}: {problem}: no profile section of that name; it defines: "
                            f"{', '.join(known)}") from None
        raise UserError(f"{where}: not valid YAML ({problem}); fix the file") from None
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text ({err.reason}); is it the parameters file?") from None
    if not isinstance(data, dict) or "profile" not in data:
        raise UserError(f"{path}: expected a mapping with a 'profile' key")
    return data


def active_profile_name(data: dict[str, Any]) -> str:
    """The name of the active profile: `profile: *name` (an alias of a section) or `profile: name`."""
    active = data["profile"]
    if isinstance(active, dict):
        if not isinstance(active.get("name"), str):
            raise UserError("params.yaml: the active profile section has no `name`")
        return active["name"]
    return str(active)


def load_params(path: str | Path = DEFAULT_PARAMS, profile: str | None = None) -> dict[str, Any]:
    """The active profile's section (or `profile`'s, when given), with its name under `profile`."""
    data = load_all(path)
    name = profile or active_profile_name(data)
    if name not in data or not isinstance(data[name], dict):
        known = sorted(k for k, v in data.items() if isinstance(v, dict))
        raise UserError(f"{path}: unknown profile {name!r} (no such section); it defines: {', '.join(known)}")
    section = dict(data[name])
    section["profile"] = name
    return section


def profile_section(params: dict[str, Any], name: str, purpose: str) -> tuple[str, dict[str, Any]]:
    """(where, section): the active profile's section `name`, and how an error names it
    ("params.yaml demo.isolation"); a missing section is one line saying what it is for."""
    where = f"params.yaml {params.get('profile', '<profile>')}.{name}"
    section = params.get(name)
    if not isinstance(section, dict):
        raise UserError(f"{where}: missing; {purpose}")
    return where, section

