r"""Rebuild the paper's tables and number macros from the numbers files.

Every table is one jinja2 template in ``paper/templates/tables/`` that starts by
declaring what it reads, ``{# reads: R-C3 #}``, and fetches each cell with
``v("R-C3", "knockin_top40_p1")`` (``v(id, key, i)`` for element i of a list
value).  A key whose name carries a size or head names that the profile's params choose
(``p2_top40_overlap`` on the paper, ``p2_top8_overlap`` on the demo) is found with
``keys_like("R-C8", "p2_top(\d+)_overlap")``: the profile's keys of the result that match, each with
its groups.  It is rendered twice, as LaTeX (``tables/<name>.tex``) and as Markdown
readable on a code host (``tables/<name>.md``), through the shared layout
``_layout.j2``.  ``macros.tex`` holds one ``\newcommand`` per registered value.
A cell that more than one result can hold reads ``first(("R-D12", "qwen_mistill_own_p2c_seeds", 0),
("R-D6", "qwen_mistill_own_p2c_seeds", 0))``: the first of them a numbers file holds (the paper's seed grid
writes R-D12; a profile with one training seed writes the same medians under R-D6), shown ``??`` only when
none does.  ``per_seed(("R-D12", key), ("R-D6", key))`` is that cell for each seed of the profile's
``distill.seeds``, joined ``a / b / c``: the demo's one seed shows one number, the paper's three show three.
``pm_seeds((id, mean_key), (id, sd_key))`` is "mean ± sd" over the seeds, or the mean alone under a one-seed profile.
A row that names a model says ``model("student_qwen")``: the profile's own name for it
(params ``labels.models``, `mistill.repro.labels`), so the demo's tables never call its tiny
models Qwen3-4B; a figure's titles write ``{student_qwen}``.
``directions()`` gives the rows of `mistill.repro.directions` (each Mistill-versus-Vanilla key's direction beside
the paper's), the same rows README's table shows; a row's own value is still fetched with ``v``.

A cell whose number no numbers file holds shows ``??`` and is reported.  In
strict mode a missing number is an error when the active profile claims it: a
profile claims the results whose registry status it requires (registry.yaml
``profiles.<p>.required_statuses``: on the demo, status ``demo``) and of those
the values it records expected values for.  Every other gap (a paper-only
result, a paper-only key or seed of a demo result) shows ``??`` in both modes
and is counted in the summary.  A template naming an id it did not declare, or
a key the registry does not know, is an error in both modes.  Nothing is
written until every output has rendered.

Figures: every spec in ``paper/templates/figures/*.yaml`` is drawn with matplotlib into
``figures/<name>.pdf`` and ``.png`` (``mistill.repro.figures``), from the same numbers files and
under the same rules; a number a figure cannot draw is reported like a missing cell, and a
figure with no number at all is a missing-data placeholder, counted in ``RenderReport.figures``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from mistill.errors import UserError
from mistill.io import atomic_open
from mistill.repro.directions import DirectionTable, direction_rows
from mistill.repro.labels import model_name, model_names
from mistill.repro.macros import macro_name
from mistill.repro.numbers import NumbersFile, read_numbers
from mistill.repro.registry import Registry

MISSING = "??"
READS_HEADER = re.compile(r"^\s*\{#\s*reads:\s*(?P<ids>[^#]*?)\s*#\}")
FORMATS = ("tex", "md")
DEFAULT_DIGITS = 3


@dataclass(frozen=True)
class Cell:
    """One number of one result, or a visible gap."""

    result_id: str
    key: str
    value: Any          # None when no numbers file holds it
    digits: int


@dataclass(frozen=True)
class Joined:
    """Cells and literal text shown together (mean ± sd, a value beside its floor)."""

    parts: tuple[Any, ...]


@dataclass
class RenderReport:
    profile: str
    outputs: dict[Path, str | bytes] = field(default_factory=dict)   # text, or a figure's bytes
    missing: dict[str, list[str]] = field(default_factory=dict)    # output name -> "id.key" ("id.key[i]") shown ??
    claimed: set[str] = field(default_factory=set)                 # of those, the numbers the profile claims
    figures: Any = None                                            # a figures.FiguresReport, when specs exist

    def tables(self) -> dict[str, bool]:
        """Each rendered table template's name -> whether it is complete (no ?? cell)."""
        return {path.stem: f"tables/{path.name}" not in self.missing
                for path in sorted(self.outputs) if path.parent.name == "tables" and path.suffix == ".md"}

    def tables_summary(self, captioned: set[int]) -> str:
        """How many of the paper's captioned tables have a template, and how many of those are complete."""
        tables = self.tables()
        numbers = {int(m.group(1)) for name in tables if (m := re.fullmatch(r"table(\d+)", name))}
        without = sorted(captioned - numbers)
        complete = sorted(name for name, done in tables.items() if done)
        return (f"tables: {len(numbers & captioned)} of the paper's {len(captioned)} captioned tables have a template "
                f"({len(tables)} templates in all); {len(complete)} complete under profile {self.profile} (no ??), "
                f"{len(tables) - len(complete)} with ?? cells; no template yet: "
                + (", ".join(map(str, without)) if without else "none"))

    def shown_missing(self) -> set[str]:
        return {m for ms in self.missing.values() for m in ms}

    def summary(self) -> str:
        shown = self.shown_missing()
        claimed = shown & self.claimed
        return (f"profile {self.profile}: ?? for {len(shown)} number(s), {len(claimed)} of them claimed by the "
                f"profile, {len(shown) - len(claimed)} not claimed (results, keys or seeds it does not produce)")


def claimed_numbers(registry: Registry, profile: str) -> dict[str, dict[str, Any]]:
    """What `profile` claims to produce: id -> key -> its expected value under the profile (None if none recorded).

    The results whose status the profile requires; of each, the keys the profile records expected values
    for, or every registered key where it records none.
    """
    statuses = registry.required_statuses(profile)
    expected = registry.expected(profile).values
    claims: dict[str, dict[str, Any]] = {}
    for rid, result in registry.results.items():
        if result.status in statuses:
            recorded = expected.get(rid)
            claims[rid] = ({key: exp.value for key, exp in recorded.items()} if recorded
                           else dict.fromkeys(registry.registered_keys(rid)))
    return claims


def is_claimed(claims: dict[str, dict[str, Any]], result_id: str, key: str, index: int | None = None) -> bool:
    """Whether the profile claims this number (element `index` of a list value: only within its claimed length)."""
    if key not in claims.get(result_id, {}):
        return False
    value = claims[result_id][key]
    return index is None or not isinstance(value, list) or -len(value) <= index < len(value)


def load_numbers(registry: Registry, results_dir: str | Path, profile: str) -> dict[str, NumbersFile]:
    """Every numbers file under `results_dir`; a malformed one or another profile's is an error."""
    numbers = {}
    results_dir = Path(results_dir)
    for path in sorted(results_dir.glob("R-*.json")) if results_dir.is_dir() else []:
        record = read_numbers(path, registry)
        if record.profile != profile:
            raise UserError(f"{path}: written under profile {record.profile!r}, rendering {profile!r}")
        numbers[record.id] = record
    return numbers


def render_paper(registry: Registry, *, results_dir: str | Path, out_dir: str | Path,
                 templates_dir: str | Path, profile: str, strict: bool = False) -> RenderReport:
    """Render every table and macros.tex into memory, then write them atomically."""
    numbers = load_numbers(registry, results_dir, profile)
    digits = _printed_digits(registry)
    templates_dir = Path(templates_dir)
    tables_dir = templates_dir / "tables"
    if not tables_dir.is_dir():
        raise UserError(f"{tables_dir}: no templates directory")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader([str(tables_dir), str(templates_dir)]),
                             undefined=jinja2.StrictUndefined, autoescape=False,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["cell"] = format_cell
    env.globals["pm"] = lambda mean, sd: Joined((mean, " ± ", sd))
    env.globals["floor"] = lambda value, floor_value: Joined((value, " (", floor_value, ")"))
    env.globals["seeds"] = lambda *cells: Joined(tuple(_interleave(cells, " / ")))
    env.globals["ci"] = lambda estimate, low, high: Joined((estimate, " [", low, ", ", high, "]"))
    env.globals["decimals"] = lambda cell, digits: dataclasses.replace(cell, digits=int(digits))  # a column the paper never printed
    claims = claimed_numbers(registry, profile)
    env.globals["keys_like"] = _keys_like(registry, numbers, profile)
    names = model_names(registry.root, profile)
    env.globals["model"] = lambda role: model_name(names, role, f"profile {profile}")
    # the Mistill-versus-Vanilla direction table's rows, the ones README shows (tables/directions.j2)
    env.globals["directions"] = lambda: DirectionTable(profile, direction_rows(registry, numbers, profile))
    seed_count = len(profile_seeds(registry.root, profile))
    report = RenderReport(profile)
    out_dir = Path(out_dir)

    templates = sorted(p for p in tables_dir.glob("*.j2") if not p.name.startswith("_"))
    if not templates:
        raise UserError(f"{tables_dir}: no table templates (*.j2)")
    for template_path in templates:
        name = template_path.name[: -len(".j2")]
        reads = _declared_reads(template_path, registry)
        for fmt in FORMATS:
            missing: list[str] = []
            lookup = _Lookup(registry, numbers, digits, reads, template_path.name, missing, claims, report.claimed)
            try:
                text = env.get_template(template_path.name).render(
                    v=lookup, first=lookup.first, per_seed=lookup.per_seed(seed_count),
                    pm_seeds=lookup.mean_sd(seed_count), fmt=fmt)
            except jinja2.TemplateError as err:
                line = f" line {err.lineno}" if getattr(err, "lineno", None) else ""
                raise UserError(f"{template_path}:{line} {err.message}") from None
            target = out_dir / "tables" / f"{name}.{fmt}"
            report.outputs[target] = text
            if missing:
                report.missing[str(target.relative_to(out_dir))] = sorted(set(missing))

    macros_text, macros_missing = render_macros(registry, numbers, digits)
    report.outputs[out_dir / "macros.tex"] = macros_text
    if macros_missing:
        report.missing["macros.tex"] = macros_missing
        report.claimed.update(m for m in macros_missing if is_claimed(claims, *m.split(".", 1)))

    figures_dir = templates_dir / "figures"
    if figures_dir.is_dir():
        _add_figures(report, registry, numbers, figures_dir, out_dir, profile, claims, names)

    if strict and report.claimed:
        raise UserError(f"strict: profile {profile} claims numbers that no numbers file holds: "
                        f"{_by_result(sorted(report.claimed), numbers)} (run their stages, or render without "
                        "--strict)")
    for path, content in report.outputs.items():
        if isinstance(content, bytes):
            with atomic_open(path, "wb") as fh:
                fh.write(content)
        else:
            with atomic_open(path, "w", encoding="utf-8") as fh:
                fh.write(content)
    return report


def _add_figures(report: RenderReport, registry: Registry, numbers: dict[str, NumbersFile], figures_dir: Path,
                 out_dir: Path, profile: str, claims: dict[str, dict[str, Any]], names: dict[str, str]) -> None:
    """Every figure spec's PDF and PNG, and figures/index.md, into the report's outputs (`names`: the
    profile's model names, params labels.models)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("figures need matplotlib, a dependency of this package: reinstall it "
                        "(`pip install -e .`, or ./setup.sh)") from None
    from mistill.repro.figures import figures_index, render_figures

    figures = render_figures(registry, numbers, figures_dir, profile, names)
    for fig in figures.figures:
        for fmt, content in fig.files.items():
            report.outputs[out_dir / "figures" / f"{fig.name}.{fmt}"] = content
        if fig.missing:
            report.missing[f"figures/{fig.name}"] = fig.missing
            for label in fig.missing:
                rid, rest = label.split(".", 1)
                key, _, index = rest.partition("[")
                if is_claimed(claims, rid, key, int(index[:-1]) if index else None):
                    report.claimed.add(label)
    report.outputs[out_dir / "figures" / "index.md"] = figures_index(figures, profile)
    report.figures = figures


def render_macros(registry: Registry, numbers: dict[str, NumbersFile],
                  digits: dict[tuple[str, str], int]) -> tuple[str, list[str]]:
    r"""One ``\newcommand`` per registered value (and per element of a list value)."""
    lines = ["% Generated by `mistill repro render` from results/*.json; do not edit.",
             "% One command per registered value: \\<id><key>, digits spelled out; ?? = not reproduced."]
    missing = []
    for rid in registry.results:
        for key in registry.registered_keys(rid):
            record = numbers.get(rid)
            value = record.values[key]["value"] if record and key in record.values else None
            if value is None:
                missing.append(f"{rid}.{key}")
            cell = Cell(rid, key, value, digits.get((rid, key), DEFAULT_DIGITS))
            lines.append(f"\\newcommand{{\\{macro_name(rid, key)}}}{{{format_cell(cell, 'tex')}}}")
            # Part macros follow the registered shape, so their names exist whether or not the value does.
            for i in range(_registered_length(registry, rid, key)):
                element = value[i] if isinstance(value, list) and i < len(value) else None
                part = Cell(rid, key, element, cell.digits)
                lines.append(f"\\newcommand{{\\{macro_name(rid, key, i)}}}{{{format_cell(part, 'tex')}}}")
    return "\n".join(lines) + "\n", missing


def _registered_length(registry: Registry, result_id: str, key: str) -> int:
    """Elements of a list value as registered (0 for a scalar)."""
    for profile in registry.value_profiles:
        exp = registry.expected(profile).values.get(result_id, {}).get(key)
        if exp is not None:
            return len(exp.value) if isinstance(exp.value, list) else 0
    return 0


def format_cell(item: Any, fmt: str) -> str:
    """A cell, joined cells or literal text, formatted for LaTeX ('tex') or Markdown ('md')."""
    if isinstance(item, Joined):
        return "".join(format_cell(part, fmt) for part in item.parts)
    if isinstance(item, Cell):
        if item.value is None:
            return MISSING
        return _format_number(item.value, item.digits, fmt)
    text = str(item)
    if fmt == "tex":
        text = re.sub(r"([%&_#])", r"\\\1", text)
        text = text.replace("±", "$\\pm$").replace("–", "--").replace("×", "$\\times$")
    else:
        text = text.replace("|", "\\|")
    return text


def _format_number(value: Any, digits: int, fmt: str) -> str:
    if isinstance(value, list):
        return ", ".join(_format_number(v, digits, fmt) for v in value)
    if isinstance(value, int):
        text = str(value)
    elif digits < 0:                      # p-values: two significant digits
        text = f"{value:.2g}"
    else:
        text = f"{value:.{digits}f}"
    if text.startswith("-"):
        text = ("$-$" if fmt == "tex" else "−") + text[1:]
    return text


def _by_result(labels: list[str], numbers: dict[str, NumbersFile]) -> str:
    """'R-C2 (no numbers file; 21 value(s): key_a, key_b, key_c, ...)' per result, from 'id.key' labels."""
    keys: dict[str, list[str]] = {}
    for label in labels:
        rid, key = label.split(".", 1)
        keys.setdefault(rid, []).append(key)
    parts = []
    for rid, names in keys.items():
        why = "no numbers file; " if rid not in numbers else ""
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        parts.append(f"{rid} ({why}{len(names)} value(s): {shown})")
    return ", ".join(parts)


def profile_seeds(root: str | Path, profile: str) -> list[int]:
    """params `<profile>.distill.seeds` of the params.yaml under `root` (the training seeds a table's rows show)."""
    from mistill.params import load_params

    seeds = (load_params(Path(root) / "params.yaml", profile=profile).get("distill") or {}).get("seeds")
    if not seeds:
        raise UserError(f"params.yaml: profile {profile} names no distill.seeds (the seeds its tables show)")
    return [int(s) for s in seeds]


class _Lookup:
    """`v(id, key, i)` for a template, with `first(...)`, `per_seed(...)` and `pm_seeds(...)`; records every gap it
    shows (a reference `first` passes over because another holds the cell is not a gap)."""

    def __init__(self, registry: Registry, numbers: dict[str, NumbersFile], digits: dict[tuple[str, str], int],
                 reads: list[str], template: str, missing: list[str], claims: dict[str, dict[str, Any]],
                 claimed: set[str]):
        self.registry, self.numbers, self.digits = registry, numbers, digits
        self.reads, self.template = reads, template
        self.missing, self.claims, self.claimed = missing, claims, claimed

    def __call__(self, result_id: str, key: str, index: int | None = None) -> Cell:
        cell = self._cell(result_id, key, index)
        if cell.value is None:
            self._record_gap(result_id, key, index)
        return cell

    def first(self, *refs) -> Cell:
        """The first of `refs` ((id, key) or (id, key, i)) that a numbers file holds; else a gap for each."""
        if not refs:
            raise UserError(f"{self.template}: first() needs at least one (id, key) reference")
        cells = [self._cell(*ref) for ref in refs]
        for cell in cells:
            if cell.value is not None:
                return cell
        for ref in refs:
            self._record_gap(*ref)
        return cells[0]

    def per_seed(self, seed_count: int):
        """`per_seed((id, key), ...)`: `first` of the references' i-th elements for each of the profile's seeds."""
        def cells(*refs) -> Joined:
            row = [self.first(*((rid, key, i) for rid, key in refs)) for i in range(seed_count)]
            return Joined(tuple(_interleave(row, " / ")))
        return cells

    def mean_sd(self, seed_count: int):
        """`pm_seeds((id, mean_key), (id, sd_key))`: "mean ± sd" over the profile's seeds, or the mean alone under a
        profile that trains one seed (a sample s.d. needs two)."""
        def cell(mean_ref, sd_ref):
            if seed_count < 2:
                return self(*mean_ref)
            return Joined((self(*mean_ref), " ± ", self(*sd_ref)))
        return cell

    def _cell(self, result_id: str, key: str, index: int | None = None) -> Cell:
        if result_id not in self.registry.results:
            raise UserError(f"{self.template}: unknown result id {result_id!r}")
        if result_id not in self.reads:
            raise UserError(f"{self.template}: reads {result_id} without declaring it in its reads header")
        if key not in self.registry.registered_keys(result_id):
            raise UserError(f"{self.template}: {result_id} has no registered value key {key!r}")
        record = self.numbers.get(result_id)
        value = record.values[key]["value"] if record and key in record.values else None
        if value is not None and index is not None:
            if not isinstance(value, list):
                raise UserError(f"{self.template}: {result_id}.{key} is not a list (value {value!r})")
            # a per-seed list of a profile with fewer seeds than the paper's: the absent seeds are missing
            value = value[index] if -len(value) <= index < len(value) else None
        return Cell(result_id, key, value, self.digits.get((result_id, key), DEFAULT_DIGITS))

    def _record_gap(self, result_id: str, key: str, index: int | None = None) -> None:
        label = f"{result_id}.{key}" + (f"[{index}]" if index is not None else "")
        self.missing.append(label)
        if is_claimed(self.claims, result_id, key, index):
            self.claimed.add(label)


def _keys_like(registry: Registry, numbers: dict[str, NumbersFile], profile: str):
    """`keys_like(id, pattern)`: the registered keys of a result under this profile (its expected values,
    then its numbers file) that match `pattern` whole, as (key, groups), ordered by their numeric groups."""
    def keys_like(result_id: str, pattern: str) -> list[tuple[str, tuple[str, ...]]]:
        if result_id not in registry.results:
            raise UserError(f"keys_like: unknown result id {result_id!r}")
        keys = dict.fromkeys(registry.expected(profile).values.get(result_id, {}))
        record = numbers.get(result_id)
        registered = set(registry.registered_keys(result_id))
        keys.update(dict.fromkeys(k for k in (record.values if record else ()) if k in registered))
        regex = re.compile(pattern)
        found = [(key, m.groups()) for key in keys if (m := regex.fullmatch(key))]
        return sorted(found, key=lambda kg: [int(g) if g and g.isdigit() else 0 for g in kg[1]])
    return keys_like


def _declared_reads(path: Path, registry: Registry) -> list[str]:
    text = path.read_text(encoding="utf-8")
    match = READS_HEADER.match(text)
    if not match:
        raise UserError(f"{path}: a table template must start with {{# reads: R-.., R-.. #}}")
    ids = [i for i in re.split(r"[\s,]+", match.group("ids")) if i]
    unknown = [i for i in ids if i not in registry.results]
    if unknown:
        raise UserError(f"{path}: reads unknown result id(s) {', '.join(unknown)}")
    return ids


def _printed_digits(registry: Registry) -> dict[tuple[str, str], int]:
    """Decimals the paper prints for each value (so rebuilt tables read like the paper's)."""
    digits: dict[tuple[str, str], int] = {}
    for profile in registry.value_profiles:
        expected = registry.expected(profile)
        if not expected.meta.get("printed_rounding", False):
            continue                      # goldens carry full precision; their keys print DEFAULT_DIGITS
        for rid, keys in expected.values.items():
            for key, exp in keys.items():
                if (rid, key) in digits:
                    continue
                if exp.kind == "p_value":
                    digits[(rid, key)] = -1
                    continue
                elements = exp.value if isinstance(exp.value, list) else [exp.value]
                decimals = [_decimals(x) for x in _flat(elements)]
                # Trailing zeros are lost in transcription (0.130 -> 0.13): at least 2 decimals.
                floats = any(isinstance(x, float) for x in _flat(elements))
                digits[(rid, key)] = max([*decimals, 2 if floats else 0])
    return digits


def _flat(values: list) -> list:
    out = []
    for x in values:
        out.extend(_flat(x) if isinstance(x, list) else [x])
    return out


def _decimals(x: Any) -> int:
    if isinstance(x, int):
        return 0
    text = repr(float(x))
    if "e" in text:
        return DEFAULT_DIGITS
    return len(text.split(".")[1].rstrip("0")) if "." in text else 0


def _interleave(items, sep):
    for i, item in enumerate(items):
        if i:
            yield sep
        yield item
