"""What the instrument's readers share: locating HD-001's artifacts and writing numbers files.

Readers emit keys named by what they are.  A key the registry does not (yet) know
for the result is not written; it is printed on one line, so nothing is dropped
silently, and `--strict` makes it an error.

Where the paper names a set size, a layer range or a head in a key (`knockin_top40_p1`,
`chapter_top40_heads_in_layers_24_31`, `l39h38_ic_p1`), the reader takes it from params:
set sizes from the instrument's sections, the rest from the profile's `readers` section
(`reader_settings`), so one reader writes the paper's keys under the paper profile and the
demo's own under the demo.  Each reader's `keys(params)` lists every key it can write.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
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
         strict: bool = False, declared: list[str] = ()) -> Path:
    """Write the keys the registry knows or the reader declares (`keys(params)`); report the others."""
    from mistill.repro.numbers import write_numbers
    from mistill.repro.registry import load_registry

    registry = load_registry(".")
    profile_keys = registry.expected(params["profile"]).values.get(result_id)
    allowed = set(profile_keys) if profile_keys else set(registry.registered_keys(result_id))
    allowed |= set(declared)
    unknown = sorted(k for k in values if k not in allowed)
    if unknown:
        message = f"{result_id}: keys not in the registry, not written: {', '.join(unknown)}"
        if strict:
            raise UserError(message)
        print(f"{reader}: {message}", file=sys.stderr)
    kept = {k: v for k, v in values.items() if k in allowed}
    if not kept:
        raise UserError(f"{result_id}: none of the computed keys is registered ({', '.join(sorted(values))})")
    path = write_numbers(result_id, kept, reader=reader, inputs=[str(p) for p in inputs], params=params,
                         declared_keys=declared)
    print(f"{reader}: wrote {path} ({len(kept)} values)")
    return path


PHASES = ("P1", "P2", "P2C")
HEAD_NAME = re.compile(r"^l(\d+)h(\d+)$")


@dataclass(frozen=True)
class NamedHeads:
    """Heads whose own numbers R-C4 and R-D20 report (params `readers.named_heads`), named l<layer>h<head>, 0-based."""

    leader: str | None = None                 # its I_c per phase and its top-k pool weights (the paper's L39H38)
    contrastive_specialist: str | None = None  # its rank at P1 and at P2C (the paper's L30H11)
    recurrent: list[str] = field(default_factory=list)  # notes with each in the per-note top-k (recurrence)
    # final-layer heads whose direct path the proxy c sees, reported beside the specialist (L39H12, L39H10; R-D20)
    direct_path: list[str] = field(default_factory=list)
    # heads whose P2 rank R-C8 reports under both hooks (L39H10, L39H29, L39H12, L37H6)
    intact_p2: list[str] = field(default_factory=list)
    # the read side's roles (App. E; R-C5, R-C10, R-C11): the paper's L26H36, L28H21, L26H37, L26H18 read the
    # emitted chapter's lines, L39H38 ... the trace prose, L30H11 and L38H39 the near-miss's earlier mentions
    region_readers: list[str] = field(default_factory=list)
    prose_readers: list[str] = field(default_factory=list)
    contrastive_readers: list[str] = field(default_factory=list)


READ_ROLES = ("region_readers", "prose_readers", "contrastive_readers")


@dataclass(frozen=True)
class ReaderSettings:
    """The profile's `readers` section: what the paper's keys name that no pass setting gives."""

    necessity_k: int                          # Table 1's necessity set size (sign tests, spread over notes)
    knockin_k: int                            # Table 1's knock-in set size (sign tests, global vs own gap)
    layer_ranges: list[tuple[int, int]]       # chapter top-k heads counted per range of layers
    importance_share_layers: list[tuple[int, int]]  # share of the chapter top-k's I_c per range of layers
    named_heads: NamedHeads



def run_reader(result_id: str, reader: str, description: str, compute_values, keys) -> int:
    """A reader's entry point: `--profile` and `--strict`, the values under the active params, the
    numbers file with the keys `keys(params)` declares."""
    args = reader_args(description)
    params = active_params(args.profile)
    values, inputs = compute_values(params)
    emit(result_id, values, reader=reader, inputs=inputs, params=params, strict=args.strict, declared=keys(params))
    return 0

def reader_settings(params: dict) -> ReaderSettings:
    """The `readers` section of the active profile; a malformed one is a one-line UserError."""
    where = f"params.yaml {params.get('profile', '<profile>')}.readers"
    section = params.get("readers")
    if not isinstance(section, dict):
        raise UserError(f"{where}: missing; it names the set sizes, layer ranges and heads the readers report")
    for name in ("necessity_k", "knockin_k"):
        if not isinstance(section.get(name), int) or section[name] < 1:
            raise UserError(f"{where}.{name}: must be a positive set size, got {section.get(name)!r}")
    heads = section.get("named_heads") or {}
    if not isinstance(heads, dict):
        raise UserError(f"{where}.named_heads: must map roles to head names")
    unknown = sorted(set(heads) - {"leader", "contrastive_specialist", "recurrent", "direct_path", "intact_p2",
                                   *READ_ROLES})
    if unknown:
        raise UserError(f"{where}.named_heads: unknown role(s) {', '.join(unknown)}")
    recurrent, direct_path = heads.get("recurrent") or [], heads.get("direct_path") or []
    intact_p2 = heads.get("intact_p2") or []
    roles = {role: list(heads.get(role) or []) for role in READ_ROLES}
    for name in [heads.get("leader"), heads.get("contrastive_specialist"), *recurrent, *direct_path, *intact_p2,
                 *(h for hs in roles.values() for h in hs)]:
        if name is not None and not (isinstance(name, str) and HEAD_NAME.match(name)):
            raise UserError(f"{where}.named_heads: {name!r} is not a head name such as l39h38")
    return ReaderSettings(
        necessity_k=section["necessity_k"], knockin_k=section["knockin_k"],
        layer_ranges=_layer_ranges(section.get("layer_ranges") or [], f"{where}.layer_ranges"),
        importance_share_layers=_layer_ranges(section.get("importance_share_layers") or [],
                                              f"{where}.importance_share_layers"),
        named_heads=NamedHeads(heads.get("leader"), heads.get("contrastive_specialist"), list(recurrent),
                               list(direct_path), list(intact_p2), **roles))


def _layer_ranges(ranges, where: str) -> list[tuple[int, int]]:
    out = []
    for r in ranges:
        if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and x >= 0 for x in r)
                and r[0] <= r[1]):
            raise UserError(f"{where}: each range is [first layer, last layer], got {r!r}")
        out.append((r[0], r[1]))
    return out


def layers_name(layers: tuple[int, int]) -> str:
    """`24_31` for layers 24 to 31, as the paper's keys name a range."""
    return f"{layers[0]}_{layers[1]}"


def head_index(name: str, n_layers: int, n_heads: int) -> int:
    """The flat index layer * n_heads + head of a head named l<layer>h<head>."""
    match = HEAD_NAME.match(name)
    if not match:
        raise UserError(f"{name!r} is not a head name such as l39h38")
    layer, head = int(match.group(1)), int(match.group(2))
    if layer >= n_layers or head >= n_heads:
        raise UserError(f"params.yaml readers.named_heads: {name} is outside the model's {n_layers} layers x "
                        f"{n_heads} heads (the named heads are the profile's model's)")
    return layer * n_heads + head


def instrument_dir(params: dict) -> Path:
    section = params.get("instrument") or {}
    return Path(section.get("out_dir", "artifacts/HD-001"))


def proxy_dir(params: dict) -> Path:
    """Where the proxy pass (stage HD-001-proxy) writes each note's proxy.npz."""
    return Path(f"{instrument_dir(params)}-proxy")


def active_params(profile: str | None) -> dict:
    return load_params(profile=profile)
