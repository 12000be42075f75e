"""What the rendered tables and figures call each model: params `labels.models` of the profile.

The paper's tables name Qwen3-14B, Qwen3-4B and SmolLM3-3B; the demo's models are tiny stand-ins of
those architectures, and its tables say so. A table asks `model("student_qwen")`; a figure spec writes
`{student_qwen}` in a title. A role the profile's params do not name is a one-line error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from mistill.errors import UserError

_ROLE = re.compile(r"\{(\w+)\}")


def model_names(root: str | Path, profile: str) -> dict[str, str]:
    """params `<profile>.labels.models` of the params.yaml under `root` (role -> name)."""
    from mistill.params import load_params

    names = (load_params(Path(root) / "params.yaml", profile=profile).get("labels") or {}).get("models") or {}
    return {str(role): str(name) for role, name in names.items()}


def model_name(names: Mapping[str, str], role: str, where: str) -> str:
    if role not in names:
        raise UserError(f"{where}: params labels.models names no {role!r} (it names: "
                        f"{', '.join(names) or 'nothing'})")
    return names[role]


def name_models(text: str, names: Mapping[str, str], where: str) -> str:
    """`text` with every `{role}` replaced by the profile's name for that model."""
    return _ROLE.sub(lambda m: model_name(names, m.group(1), where), text)
