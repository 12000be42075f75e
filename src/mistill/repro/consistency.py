"""dvc.yaml, registry.yaml and REGISTRY.md must tell the same story.

* every result with status `demo` has a DVC stage named exactly after its id
  and demo expected values;
* every `R-*` stage in dvc.yaml is a registered id with status `demo` (no stage
  for a result the registry does not claim is reproduced);
* REGISTRY.md is what `mistill repro registry-md` would write now.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from mistill.errors import UserError
from mistill.repro.registry import Registry
from mistill.repro.registry_md import REGISTRY_MD, registry_md_is_current

RESULT_STAGE = re.compile(r"^R-[A-Z]+\d+$")


def dvc_stage_names(dvc_file: str | Path) -> list[str]:
    """Stage names of a dvc.yaml; an absent file has none."""
    dvc_file = Path(dvc_file)
    if not dvc_file.exists():
        return []
    try:
        data = yaml.safe_load(dvc_file.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError:
        raise UserError(f"{dvc_file}: not valid YAML") from None
    stages = data.get("stages") or {}
    if not isinstance(stages, dict):
        raise UserError(f"{dvc_file}: 'stages' must be a mapping")
    return list(stages)


def consistency_problems(registry: Registry, profile: str = "demo") -> list[str]:
    """One line per disagreement between dvc.yaml, the registry and REGISTRY.md."""
    root = registry.root
    stages = set(dvc_stage_names(root / "dvc.yaml"))
    demo_values = registry.expected(profile).values
    problems = []
    for rid, result in registry.results.items():
        if result.status != "demo":
            continue
        if rid not in stages:
            problems.append(f"{rid}: status demo but dvc.yaml has no stage named {rid}")
        if not demo_values.get(rid):
            problems.append(f"{rid}: status demo but results/expected/{profile}.yaml has no values for it")
    for stage in sorted(stages):
        if not RESULT_STAGE.match(stage):
            continue
        if stage not in registry.results:
            problems.append(f"dvc.yaml stage {stage}: not a registered result id")
        elif registry.results[stage].status != "demo":
            problems.append(f"dvc.yaml stage {stage}: registry status is {registry.results[stage].status}, "
                            "not demo")
    if not registry_md_is_current(registry):
        problems.append(f"{REGISTRY_MD}: stale (run `mistill repro registry-md`)")
    return problems
