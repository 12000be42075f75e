"""The result registry: every one of the paper's 62 results and its expected values per profile.

``registry.yaml`` (repository root) is the one machine-readable source of truth
for what each result id is: where in the paper, the claim, its data artifacts,
the DVC stage and reader that produce it, the params sections it reads, seeds,
compute, nondeterminism classes and status.  Expected values live per profile
in ``results/expected/<profile>.yaml`` as ``id -> key -> {value, stat, kind,
class, tolerance?}``; a value without its own tolerance takes the documented
default for its class and kind (``tolerance_defaults`` in registry.yaml,
derived from the class definitions of App. Q).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mistill.errors import UserError
from mistill.repro.tolerance import Tolerance, flatten, printed_half_unit, says_null

REGISTRY_FILE = "registry.yaml"
EXPECTED_DIR = Path("results") / "expected"

ALL_IDS: tuple[str, ...] = tuple([f"R-C{i}" for i in range(1, 16)] + [f"R-D{i}" for i in range(47)])
CLASSES = ("G", "K", "T", "F", "none")
KINDS = ("share", "percent", "nats", "count", "discrete", "quantity", "p_value")
# libyaml's loader when present: the paper's 774 values parse ten times faster.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UniqueKeyLoader(SAFE_LOADER):
    """YAML keeps the last of two equal keys in one mapping and drops the first without a word (a second
    `extra_keys:` of a result would replace its list): such a file is refused, naming the key."""


def _mapping_without_repeated_keys(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":      # `<<: *anchor` overrides by design
            continue
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice in one mapping",
                                                    key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_repeated_keys)
KEY_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")
RESULT_FIELDS = ("group", "where", "claim", "data", "stage", "reader", "params", "seeds", "compute",
                 "nondeterminism", "status")


@dataclass(frozen=True)
class Result:
    """One registered result id (one DVC stage ending in one reader)."""

    id: str
    group: str
    where: str
    claim: str
    data: list[str]
    stage: str
    reader: str
    params: list[str]
    seeds: str
    compute: dict[str, str]
    nondeterminism: list[str]
    status: str
    status_note: str = ""
    tolerance_note: str = ""
    paper_readers: list[str] = field(default_factory=list)
    caption_tables: list[int] = field(default_factory=list)
    depends_on: list[str] = field(default_factory=list)
    extra_keys: list[str] = field(default_factory=list)   # keys a reader emits beyond the paper's (invariants)
    # paper keys no stage produces yet, each with why; a check reports them NOT REPRODUCED, never a pass
    unproduced_keys: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Expected:
    """One expected value of one result under one profile, with its resolved tolerance."""

    result_id: str
    key: str
    value: Any
    stat: str
    kind: str
    cls: str
    tolerance: Tolerance
    reported: dict[str, Any] = field(default_factory=dict)   # paper's interval, p, higher/lower counts, source
    # a value its replicates show cannot be reproduced as a number (calibration.py): checked for
    # presence and for lying in this [lo, hi] range, element by element, never against `value`
    descriptive: tuple[float, float] | None = None
    descriptive_why: str = ""
    # a descriptive list whose length the run decides (a validation walk that stops where its rule says)
    descriptive_any_length: bool = False
    # a 95% interval of a difference whose golden contains zero (calibration.py): checked for what it
    # says, that it still contains zero (a null finding) up to the tolerance of its ends, never for the
    # ends themselves (tolerance.contains_zero)
    null_interval_why: str | None = None

    def held_to(self) -> str:
        """What the check holds this value to, in words ("±0.02", "descriptive in [-1, 1]")."""
        if self.null_interval_why is not None:
            return f"null interval: contains 0 up to its tolerance {self.tolerance.describe()}"
        if self.descriptive is None:
            return self.tolerance.describe()
        lo, hi = (f"{b:g}" for b in self.descriptive)
        length = ", any length" if self.descriptive_any_length else ""
        return f"descriptive in [{lo}, {hi}]{length} (tolerance {self.tolerance.describe()})"


@dataclass(frozen=True)
class ExpectedSet:
    profile: str
    meta: dict[str, Any]
    values: dict[str, dict[str, Expected]]            # id -> key -> Expected
    provenance: dict[str, dict[str, Any]]             # id -> how its goldens were made (demo)


@dataclass
class Registry:
    root: Path
    results: dict[str, Result]
    statuses: dict[str, str]
    profiles: dict[str, dict[str, Any]]
    classes: dict[str, dict[str, Any]]
    defaults: dict[str, dict[str, dict[str, Any]]]
    _expected: dict[str, ExpectedSet] = field(default_factory=dict)

    def get(self, result_id: str) -> Result:
        try:
            return self.results[result_id]
        except KeyError:
            raise UserError(f"unknown result id {result_id!r} (registered: R-C1..R-C15, R-D0..R-D46)") from None

    def expected_source(self, profile: str) -> str:
        """The profile whose expected values `profile` is checked against: its own, or the one its
        `expected_from` names (the rehearsal is checked against the paper's, which it does not meet)."""
        if profile not in self.profiles:
            raise UserError(f"unknown profile {profile!r}; registry.yaml knows {', '.join(self.profiles)}")
        return str(self.profiles[profile].get("expected_from") or profile)

    @property
    def value_profiles(self) -> list[str]:
        """The profiles that record expected values of their own (not borrowed through `expected_from`)."""
        return [p for p in self.profiles if self.expected_source(p) == p]

    def expected(self, profile: str) -> ExpectedSet:
        source = self.expected_source(profile)
        if source not in self._expected:
            self._expected[source] = load_expected(self, source)
        return self._expected[source]

    def registered_keys(self, result_id: str) -> list[str]:
        """Every value key of a result over all profiles, then its extra keys, in first-seen order."""
        result = self.get(result_id)
        keys: dict[str, None] = {}
        for profile in self.value_profiles:
            keys.update(dict.fromkeys(self.expected(profile).values.get(result_id, {})))
        keys.update(dict.fromkeys(result.extra_keys))
        return list(keys)

    def captioned_tables(self) -> set[int]:
        """Every table number some result's caption cites (registry `caption_tables`)."""
        return {number for result in self.results.values() for number in result.caption_tables}

    def required_statuses(self, profile: str) -> list[str]:
        """Statuses whose results a full check under `profile` must find reproduced."""
        return list(self.profiles[profile].get("required_statuses", []))

    def default_tolerance(self, classes: list[str], kind: str, *, where: str) -> Tolerance:
        """The loosest default over the cited classes (noise sources only add)."""
        absolute = relative = 0.0
        bases = []
        for cls in classes:
            spec = self.defaults.get(cls, {}).get(kind)
            if spec is None:
                raise UserError(f"{where}: registry.yaml has no default tolerance for class {cls} kind {kind}")
            absolute = max(absolute, float(spec.get("absolute", 0.0)))
            relative = max(relative, float(spec.get("relative", 0.0)))
            if spec.get("basis"):
                bases.append(f"{cls}: {spec['basis']}")
        return Tolerance(absolute=absolute, relative=relative, cls=",".join(classes), basis="; ".join(bases))


def load_registry(root: str | Path = ".") -> Registry:
    """Load and validate registry.yaml under `root`; every problem is one UserError line."""
    root = Path(root)
    path = root / REGISTRY_FILE
    data = _load_yaml(path)
    for section in ("statuses", "profiles", "nondeterminism_classes", "tolerance_defaults", "results"):
        if not isinstance(data.get(section), dict):
            raise UserError(f"{path}: missing mapping {section!r}")
    statuses = data["statuses"]
    results: dict[str, Result] = {}
    raw_results = data["results"]
    missing = [i for i in ALL_IDS if i not in raw_results]
    extra = [i for i in raw_results if i not in ALL_IDS]
    if missing or extra:
        raise UserError(f"{path}: result ids must be exactly R-C1..R-C15, R-D0..R-D46"
                        + (f"; missing {', '.join(missing)}" if missing else "")
                        + (f"; unknown {', '.join(map(str, extra))}" if extra else ""))
    for rid in ALL_IDS:
        entry = raw_results[rid]
        where = f"{path}: {rid}"
        if not isinstance(entry, dict):
            raise UserError(f"{where}: expected a mapping")
        absent = [f for f in RESULT_FIELDS if f not in entry]
        if absent:
            raise UserError(f"{where}: missing field(s) {', '.join(absent)}")
        if entry["status"] not in statuses:
            raise UserError(f"{where}: status {entry['status']!r} not one of {', '.join(statuses)}")
        if entry["stage"] != rid:
            raise UserError(f"{where}: stage must be named exactly after the id, got {entry['stage']!r}")
        bad = [c for c in entry["nondeterminism"] if c not in CLASSES]
        if bad or not entry["nondeterminism"]:
            raise UserError(f"{where}: nondeterminism classes must be among {', '.join(CLASSES)}, got {bad}")
        bad_keys = [k for k in entry.get("extra_keys", []) if not KEY_PATTERN.match(str(k))]
        if bad_keys:
            raise UserError(f"{where}: extra_keys must be lower_snake_case, got {', '.join(map(str, bad_keys))}")
        unproduced = entry.get("unproduced_keys") or {}
        if not isinstance(unproduced, dict) or not all(
                KEY_PATTERN.match(str(k)) and isinstance(why, str) and why.strip() for k, why in unproduced.items()):
            raise UserError(f"{where}: unproduced_keys must map lower_snake_case keys to why each is not produced")
        unknown = [d for d in entry.get("depends_on", []) if d not in ALL_IDS]
        if unknown:
            raise UserError(f"{where}: depends_on names unknown id(s) {', '.join(unknown)}")
        results[rid] = Result(
            id=rid, group=str(entry["group"]), where=str(entry["where"]), claim=str(entry["claim"]),
            data=list(entry["data"]), stage=entry["stage"], reader=str(entry["reader"]),
            params=list(entry["params"]), seeds=str(entry["seeds"]), compute=dict(entry["compute"]),
            nondeterminism=list(entry["nondeterminism"]), status=entry["status"],
            status_note=str(entry.get("status_note", "")), tolerance_note=str(entry.get("tolerance_note", "")),
            paper_readers=list(entry.get("paper_readers", [])),
            caption_tables=list(entry.get("caption_tables", [])),
            depends_on=list(entry.get("depends_on", [])),
            extra_keys=list(entry.get("extra_keys", [])),
            unproduced_keys={str(k): str(why) for k, why in unproduced.items()})
    defaults = data["tolerance_defaults"]
    for cls in CLASSES:
        if not isinstance(defaults.get(cls), dict) or any(k not in defaults[cls] for k in KINDS):
            raise UserError(f"{path}: tolerance_defaults.{cls} must give a tolerance for every kind "
                            f"({', '.join(KINDS)})")
    profiles = data["profiles"]
    for name, spec in profiles.items():
        source = (spec or {}).get("expected_from") if isinstance(spec, dict) else None
        if source is not None and (source not in profiles or (profiles[source] or {}).get("expected_from")):
            raise UserError(f"{path}: profiles.{name}.expected_from must name a profile with expected values "
                            f"of its own, got {source!r}")
    return Registry(root=root, results=results, statuses=dict(statuses), profiles=dict(profiles),
                    classes=dict(data["nondeterminism_classes"]), defaults=defaults)


def expected_path(root: str | Path, profile: str) -> Path:
    return Path(root) / EXPECTED_DIR / f"{profile}.yaml"


def load_expected(registry: Registry, profile: str) -> ExpectedSet:
    """Expected values of one profile; an absent file means none are recorded yet."""
    path = expected_path(registry.root, profile)
    if not path.exists():
        return ExpectedSet(profile, {}, {}, {})
    data = _load_yaml(path)
    meta = data.get("meta") or {}
    raw = data.get("expected") or {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: 'expected' must map result ids to values")
    rounding = bool(meta.get("printed_rounding", False))
    values: dict[str, dict[str, Expected]] = {}
    for rid, keys in raw.items():
        if rid not in registry.results:
            raise UserError(f"{path}: unknown result id {rid!r}")
        if not isinstance(keys, dict):
            raise UserError(f"{path}: {rid}: expected a mapping of value keys")
        result = registry.results[rid]
        values[rid] = {}
        for key, entry in keys.items():
            values[rid][key] = _parse_expected(registry, result, key, entry, rounding=rounding,
                                               where=f"{path}: {rid}.{key}")
    provenance = data.get("provenance") or {}
    return ExpectedSet(profile, dict(meta), values, dict(provenance))


def _parse_expected(registry: Registry, result: Result, key: str, entry: Any, *, rounding: bool,
                    where: str) -> Expected:
    if not KEY_PATTERN.match(str(key)):
        raise UserError(f"{where}: value keys are lower_snake_case identifiers")
    if not isinstance(entry, dict) or "value" not in entry:
        raise UserError(f"{where}: expected a mapping with 'value'")
    value = entry["value"]
    if flatten(value) is None:
        raise UserError(f"{where}: value must be a number or a list of numbers, got {value!r}")
    kind = entry.get("kind", "share")
    if kind not in KINDS:
        raise UserError(f"{where}: kind {kind!r} not one of {', '.join(KINDS)}")
    cls = str(entry.get("class", ",".join(result.nondeterminism)))
    classes = cls.split(",")
    if any(c not in CLASSES for c in classes):
        raise UserError(f"{where}: class {cls!r} must be among {', '.join(CLASSES)} (comma-separated)")
    if "tolerance" in entry:
        tol = Tolerance.from_spec(entry["tolerance"], cls_name=cls, where=where)
    else:
        tol = registry.default_tolerance(classes, kind, where=where)
    if rounding and tol.interval is None and kind not in ("count", "discrete"):
        # App. Q prints rounded numbers: widen by half a unit in the last printed digit.
        half = printed_half_unit(value)
        if half:
            tol = Tolerance(absolute=round(tol.absolute + half, 12), relative=tol.relative, cls=tol.cls,
                            basis=(tol.basis + "; " if tol.basis else "") + f"+{half:g} printed rounding")
    descriptive, why, any_length = _parse_descriptive(entry.get("descriptive"), where)
    null_interval = _parse_null_interval(entry.get("null_interval"), str(key), value, where)
    if null_interval is not None and descriptive is not None:
        raise UserError(f"{where}: a value is either descriptive or a null interval, not both")
    return Expected(result_id=result.id, key=str(key), value=value, stat=str(entry.get("stat", "")),
                    kind=kind, cls=cls, tolerance=tol, reported=dict(entry.get("reported") or {}),
                    descriptive=descriptive, descriptive_why=why, descriptive_any_length=any_length,
                    null_interval_why=null_interval)


def _parse_null_interval(spec: Any, key: str, value: Any, where: str) -> str | None:
    """`null_interval: {why: ...}` (written by `mistill repro calibrate apply`) on an interval golden that
    contains zero (`tolerance.says_null`)."""
    if spec is None:
        return None
    if not isinstance(spec, dict) or not says_null(key, value):
        raise UserError(f"{where}: null_interval marks a golden [lo, hi] that contains zero, as "
                        f"{{why: ...}}; got {spec!r} on {value!r}")
    return str(spec.get("why", ""))


def _parse_descriptive(spec: Any, where: str) -> tuple[tuple[float, float] | None, str, bool]:
    """`descriptive: {range: [lo, hi], why: ..., length: any}` (written by `mistill repro calibrate`; `length:
    any` for a list whose length the run decides)."""
    if spec is None:
        return None, "", False
    bounds = spec.get("range") if isinstance(spec, dict) else None
    if (not isinstance(bounds, list) or len(bounds) != 2
            or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
            or bounds[0] > bounds[1]):
        raise UserError(f"{where}: descriptive must be {{range: [lo, hi], why: ...}} with lo <= hi, got {spec!r}")
    length = spec.get("length")
    if length not in (None, "any"):
        raise UserError(f"{where}: descriptive length must be 'any' or absent, got {length!r}")
    return (float(bounds[0]), float(bounds[1])), str(spec.get("why", "")), length == "any"


def _load_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise UserError(f"{path}: no such file (run from the repository root)")
    try:
        with path.open(encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=UniqueKeyLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None)
        raise UserError(f"{path}:{line} not valid YAML" + (f" ({problem})" if problem else "")) from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a YAML mapping at top level")
    return data


# Words that name what a number measures.  A unit is matched as a whole word ("percentile" is
# not "percent"), and units come first: "nats, 10th percentile" is in nats.
UNIT_WORDS = {"nats": "nats", "percent": "percent"}
DISCRETE_WORDS = ("layer", "rank", "ranks", "lambda", "pre-fixed", "heads")
QUANTITY_WORDS = ("token", "tokens", "minute", "minutes", "second", "seconds", "gib", "questions", "problems",
                  "codes")
# What a statistic is taken over or of starts here ("macro-F1 over tail codes" is a macro-F1, not codes).
POPULATION_WORDS = ("over", "of", "at", "per", "before", "in", "for", "on", "within", "across")


def statistic_words(stat: str) -> list[str]:
    """The whole words of a statistic, lower case, without its parenthesised aside."""
    head = stat.lower().split("(")[0]
    return re.findall(r"%|[a-z0-9]+(?:-[a-z0-9]+)*", head)


# A statistic that names a ratio measures no proportion, whatever values it took so far (a lift of 0.999
# on one machine is 1.004 on another).
RATIO_WORDS = ("lift", "ratio", "perplexity", "odds")


def kind_range(kind: str, values: list[float], stat: str = "") -> list[float]:
    """The range a descriptive value of `kind` must lie in. A share or percent is a bounded proportion
    unless its statistic names a ratio or its golden and replicates (`values`) already left the bound."""
    if kind == "p_value":
        return [0.0, 1.0]
    if kind == "count":
        return [0.0, math.inf]
    bound = {"share": 1.0, "percent": 100.0}.get(kind)
    ratio = any(word in RATIO_WORDS for word in statistic_words(stat))
    if bound is not None and not ratio and all(abs(v) <= bound for v in values):
        return [-bound, bound]
    return [-math.inf, math.inf]


def infer_kind(name: str, value, stat: str) -> str:
    """What sort of number a value is, read from the whole words of its statistic; selects its default tolerance.

    In order: a p-value (key ending ``_p``, or a statistic that is "p", "sign-test p", "p-value ..."); a unit
    anywhere in the statistic (nats, then percent; "%" only as its first word); a choice named by the statistic's first word (layer, rank,
    lambda, heads); a quantity named before what the statistic is taken over (tokens, minutes, GiB, codes);
    else a count when every element is an integer, and a share otherwise.
    """
    words = statistic_words(stat)
    if name.endswith("_p") or words[-1:] == ["p"] or words[:1] == ["p-value"]:
        return "p_value"
    for unit, kind in UNIT_WORDS.items():
        if unit in words:
            return kind
    if words[:1] == ["%"]:
        return "percent"
    if words[:1] and words[0] in DISCRETE_WORDS:
        return "discrete"
    subject = words[:next((i for i, w in enumerate(words) if w in POPULATION_WORDS), len(words))]
    if any(w in QUANTITY_WORDS for w in subject):
        return "quantity"
    elements = flatten(value) or []
    if elements and all(isinstance(x, int) for x in elements):
        return "count"
    return "share"
