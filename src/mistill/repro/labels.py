"""What the rendered tables and figures call each model and each named head: params of the profile.

Models: params `labels.models`. The paper's tables name Qwen3-14B, Qwen3-4B and SmolLM3-3B; the demo's
models are tiny stand-ins of those architectures, and its tables say so. A table asks
`model("student_qwen")`; a figure spec writes `{student_qwen}` in a title.

Heads: params `readers.named_heads` (`head_names`). A figure spec writes a head role where the paper prints
a head, so the same spec draws the paper's L26H36 and the demo's l1h0. The roles:

* an entry that names one head is a role of its own name: `{leader}`, `{contrastive_specialist}`;
* an entry that lists heads gives its first head the entry's name in the singular (a trailing "s" dropped)
  and its i-th head that name with `_<i>`: `region_readers: [l26h36, l28h21, ...]` gives `{region_reader}`
  (l26h36), `{region_reader_2}` (l28h21), ...; likewise `{prose_reader}`, `{prose_reader_2}`, ...,
  `{contrastive_reader}`, `{contrastive_reader_2}`, and `{recurrent}`, `{recurrent_2}`, `{direct_path}`,
  `{intact_p2}`, ... for the lists whose names have no plural "s".

A head is named as params spell it (`l26h36`, the spelling of the value keys: `R-C5.{region_reader}_region_share`);
`{role|upper}` upper-cases any role's name, the paper's spelling in labels (`{region_reader|upper}` is L26H36).
`{k}` is never a role: it is left as is for a figure's series to range over set sizes.
A role the profile's params do not name is a one-line error naming the role.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mistill.errors import UserError

_ROLE = re.compile(r"\{(\w+)(\|upper)?\}")
KEPT = frozenset({"k"})                  # {k}: a series' set size (mistill.repro.figures), never a role
MODELS = "labels.models"
MODELS_AND_HEADS = "labels.models or readers.named_heads"


def model_names(root: str | Path, profile: str) -> dict[str, str]:
    """params `<profile>.labels.models` of the params.yaml under `root` (role -> name)."""
    from mistill.params import load_params

    names = (load_params(Path(root) / "params.yaml", profile=profile).get("labels") or {}).get("models") or {}
    return {str(role): str(name) for role, name in names.items()}


def head_names(root: str | Path, profile: str) -> dict[str, str]:
    """The head roles of params `<profile>.readers.named_heads` under `root` (role -> head, e.g.
    region_reader -> l26h36; the module docstring gives the rule)."""
    from mistill.params import load_params

    named = (load_params(Path(root) / "params.yaml", profile=profile).get("readers") or {}).get("named_heads") or {}
    return head_roles(named)


def head_roles(named_heads: Mapping[str, Any]) -> dict[str, str]:
    """Role -> head of a `readers.named_heads` mapping: one head under its entry's name, a list's i-th head
    under the entry's name in the singular (`region_readers` -> `region_reader`, `region_reader_2`, ...)."""
    roles: dict[str, str] = {}
    for entry, heads in named_heads.items():
        if isinstance(heads, (list, tuple)):
            base = entry[:-1] if entry.endswith("s") else entry
            for i, head in enumerate(heads, start=1):
                roles[base if i == 1 else f"{base}_{i}"] = str(head)
        elif heads is not None:
            roles[str(entry)] = str(heads)
    return roles


def label_names(models: Mapping[str, str], heads: Mapping[str, str], where: str) -> dict[str, str]:
    """The models' and the heads' roles in one mapping; a role both name is a one-line error."""
    both = sorted(set(models) & set(heads))
    if both:
        raise UserError(f"{where}: params labels.models and readers.named_heads both name role(s) {', '.join(both)}")
    return {**models, **heads}


def model_name(names: Mapping[str, str], role: str, where: str, source: str = MODELS) -> str:
    if role not in names:
        raise UserError(f"{where}: params {source} names no {role!r} (it names: "
                        f"{', '.join(names) or 'nothing'})")
    return names[role]


def name_models(text: str, names: Mapping[str, str], where: str, source: str = MODELS) -> str:
    """`text` with every `{role}` replaced by the profile's name for that model or head (`{role|upper}`:
    upper-cased); `{k}` is left as is."""
    def named(match: re.Match) -> str:
        role, upper = match.group(1), match.group(2)
        if role in KEPT and not upper:
            return match.group(0)
        name = model_name(names, role, where, source)
        return name.upper() if upper else name

    return _ROLE.sub(named, text)
