"""Rebuild the paper's figures (and the reproduction's own) from the numbers files, with matplotlib.

Every figure is one YAML spec in ``paper/templates/figures/<name>.yaml`` that, like a table
template, declares the result ids it reads and names every plotted number by ``<id>.<key>`` (or
``<id>.<key>[i]`` for element i of a list value).  Nothing plotted is written in a spec or in this
module: a spec holds labels, and the numbers come from ``results/<ID>.json``.  Each figure is
written as ``figures/<name>.pdf`` and ``figures/<name>.png``, plus ``figures/index.md``.

A spec::

    title: "Figure 2: controls and ablations on own-heads P2C recovery"
    reads: [R-D6, R-D7]
    caption: "..."                    # optional, printed under the panels
    panels:
      - title: "{student_qwen}"       # a model's name as the profile gives it (params labels.models)
        kind: bars                    # one bar per entry
        ylabel: own-heads P2C recovery
        bars:
          - {label: untrained, value: R-D6.untrained_qwen_own_p2c_k40}
          - {label: RandPos, value: R-D7.qwen_randpos_own_p2c, lo: ..., hi: ...}   # lo/hi: optional range
          - {label: Mistill, value: [R-D27.mean_of_per_seed_medians, R-D6.smollm_mistill_own_p2c_seed_mean]}
                                      # a list: the first reference a numbers file holds
        references:                   # optional horizontal lines
          - {label: teacher, value: R-D6.teacher_hd002_p2c_k40}
      - title: P1
        kind: lines                   # one line per series over x
        xlabel: set size k
        series:                       # "{k}" ranges over every k for which the key is registered
          - {label: top-k, value: "R-C3.knockin_top{k}_p1"}
      - kind: lines
        x: ["100", "250", "493"]      # or explicit x tick labels, one value per tick
        series:
          - {label: M1 lead, values: ["R-D8.m1_p2c_lead_n100_n250_n493[0]", ...]}
      - kind: lines
        x_list: R-C12.swap_layer_grid # or the ticks from a list value, as long as the profile makes it
        x_prefix: L                   # optional, before each tick (L0, L4, ...)
        series:
          - {label: forced drop, list: R-C12.tail_swap_forced_drop_by_layer}   # a list value, one per tick

Roles: ``{student_qwen}`` (a model, params ``labels.models``) and ``{region_reader}`` (a named head, params
``readers.named_heads``: ``{region_reader}``, ``{region_reader_2}``, ``{prose_reader}``, ``{contrastive_reader}``,
``{contrastive_reader_2}``, ...; the rule is in `mistill.repro.labels`) are replaced by the profile's names in
the title, the caption, panel titles, every bar's, series' and reference's label and in its number references
(``value``, ``lo``, ``hi``, ``values``), so one spec serves every profile::

      - {label: "{region_reader|upper}", value: "R-C5.{region_reader}_region_share"}   # L26H36 / L1H0

``{role|upper}`` upper-cases the name (the paper prints heads as L26H36; value keys spell them l26h36);
``{k}`` is not a role (it ranges over set sizes); a role the profile's params do not name is a one-line error.
A reference a head role named whose key no profile registers (the rehearsal's stand-in heads, which the paper's
expected values do not name) is a gap shown ``??``, not an error.

A number no numbers file holds is drawn as a hatched empty bar marked ``??`` (a gap in a line) and
reported, exactly as a missing table cell is; a panel with no number at all shows a note naming what
is missing; a figure with no number at all (or a spec with ``placeholder:`` text and no reads, such as
the paper's hand-drawn worked example) is rendered as a placeholder page that says so.  Files are
byte-stable: the same numbers give the same PDF and PNG bytes.
"""

from __future__ import annotations

import io
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mistill.errors import UserError
from mistill.repro.numbers import NumbersFile
from mistill.repro.registry import Registry

FIGURE_FORMATS = ("pdf", "png")
MISSING = "??"
REF = re.compile(r"^(?P<id>R-[CD]\d+)\.(?P<key>[a-z0-9_{}]+)(?:\[(?P<index>-?\d+)\])?$")
PANEL_KINDS = ("bars", "lines")
PANEL_WIDTH, PANEL_HEIGHT = 3.4, 2.8          # inches
DPI = 150
MISSING_COLOUR = "#b0b0b0"
_DRAWN: OrderedDict[str, dict[str, bytes]] = OrderedDict()     # what was drawn -> its files, most recent last
_DRAWN_MAX = 64
BAR_ROLES = ("value", "floor")
BAR_COLOURS = {"value": "#4c72b0", "floor": "#9a9a9a"}


@dataclass
class FigureResult:
    """One rendered figure: its files' bytes, the numbers it drew and the ones it could not."""

    name: str
    title: str
    reads: list[str]
    files: dict[str, bytes] = field(default_factory=dict)     # format -> bytes
    drawn: int = 0
    missing: list[str] = field(default_factory=list)          # "id.key" / "id.key[i]" labels
    placeholder: str = ""                                     # why the whole figure is a placeholder


@dataclass
class FiguresReport:
    figures: list[FigureResult] = field(default_factory=list)

    @property
    def placeholders(self) -> list[FigureResult]:
        return [f for f in self.figures if f.placeholder]

    def summary(self) -> str:
        drawn = len(self.figures) - len(self.placeholders)
        partial = sum(1 for f in self.figures if not f.placeholder and f.missing)
        return (f"figures: {len(self.figures)} rendered, {drawn} from numbers files ({partial} with ?? points), "
                f"{len(self.placeholders)} missing-data placeholder(s)")


class _Lookup:
    """Numbers by reference, with the table renderer's rules: declared reads, registered keys."""

    def __init__(self, registry: Registry, numbers: dict[str, NumbersFile], reads: list[str], where: str,
                 named_refs: frozenset[str] = frozenset()):
        self.registry, self.numbers, self.reads, self.where = registry, numbers, reads, where
        self.named_refs = named_refs     # references a {role} named: an unregistered key is a gap, not an error
        self.missing: list[str] = []
        self.drawn = 0

    def parse(self, ref: Any) -> tuple[str, str, int | None]:
        match = REF.match(str(ref)) if isinstance(ref, str) else None
        if not match:
            raise UserError(f"{self.where}: {ref!r} is not a number reference (<id>.<key> or <id>.<key>[i])")
        rid, key = match["id"], match["key"]
        if rid not in self.registry.results:
            raise UserError(f"{self.where}: unknown result id {rid!r}")
        if rid not in self.reads:
            raise UserError(f"{self.where}: reads {rid} without declaring it in its reads list")
        return rid, key, int(match["index"]) if match["index"] is not None else None

    def expand(self, pattern: str) -> list[int]:
        """Every k for which `pattern` (an <id>.<key> with "{k}") names a registered key, ascending."""
        rid, key, _ = self.parse(pattern)
        if "{k}" not in key:
            raise UserError(f"{self.where}: {pattern!r} has no {{k}} to range over")
        regex = re.compile("^" + re.escape(key).replace(re.escape("{k}"), r"(\d+)") + "$")
        ks = sorted({int(m.group(1)) for k in self.registry.registered_keys(rid) if (m := regex.match(k))})
        if not ks:
            raise UserError(f"{self.where}: no registered key of {rid} matches {key!r}")
        return ks

    def value(self, ref: str | list[str], k: int | None = None) -> float | None:
        if isinstance(ref, list):
            return self.first(ref, k)
        rid, key, index = self.parse(ref.replace("{k}", str(k)) if k is not None else ref)
        if key not in self.registry.registered_keys(rid):
            if ref in self.named_refs:
                # a head of this profile that no profile's expected values name (the rehearsal's stand-ins)
                self.missing.append(f"{rid}.{key}" + (f"[{index}]" if index is not None else ""))
                return None
            raise UserError(f"{self.where}: {rid} has no registered value key {key!r}")
        record = self.numbers.get(rid)
        value = record.values[key]["value"] if record and key in record.values else None
        if value is not None and index is not None:
            if not isinstance(value, list):
                raise UserError(f"{self.where}: {rid}.{key} is not a list (value {value!r})")
            value = value[index] if -len(value) <= index < len(value) else None
        elif isinstance(value, list):
            raise UserError(f"{self.where}: {rid}.{key} is a list: name one element, {rid}.{key}[i]")
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            self.missing.append(f"{rid}.{key}" + (f"[{index}]" if index is not None else ""))
            return None
        self.drawn += 1
        return float(value)


    def whole_list(self, ref: str) -> list[float] | None:
        """A list value as a whole (a series over a grid whose length the profile decides); None: missing."""
        rid, key, index = self.parse(ref)
        if index is not None:
            raise UserError(f"{self.where}: {ref}: a whole list is named without an index")
        if key not in self.registry.registered_keys(rid):
            raise UserError(f"{self.where}: {rid} has no registered value key {key!r}")
        record = self.numbers.get(rid)
        value = record.values[key]["value"] if record and key in record.values else None
        if value is None:
            self.missing.append(f"{rid}.{key}")
            return None
        if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  for v in value):
            raise UserError(f"{self.where}: {rid}.{key} is not a list of numbers (value {value!r})")
        self.drawn += len(value)
        return [float(v) for v in value]

    def first(self, refs: list[str], k: int | None = None) -> float | None:
        """The first of `refs` a numbers file holds (the paper's grid result, then the cell a smaller profile
        computes); a gap for each of them when none does."""
        if not refs:
            raise UserError(f"{self.where}: an empty list of number references")
        before = len(self.missing)
        for ref in refs:
            value = self.value(ref, k)
            if value is not None:
                del self.missing[before:]
                return value
        return None


def load_specs(figures_dir: str | Path, registry: Registry) -> list[tuple[str, dict[str, Any]]]:
    """(name, spec) for every figures/*.yaml, in name order; a malformed spec is a one-line error."""
    specs = []
    for path in sorted(Path(figures_dir).glob("*.yaml")):
        try:
            spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            raise UserError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
        if not isinstance(spec, dict) or not isinstance(spec.get("title"), str):
            raise UserError(f"{path}: a figure spec is a mapping with a title")
        reads = spec.get("reads") or []
        if not isinstance(reads, list) or not all(isinstance(r, str) for r in reads):
            raise UserError(f"{path}: reads must be a list of result ids")
        unknown = [r for r in reads if r not in registry.results]
        if unknown:
            raise UserError(f"{path}: reads unknown result id(s) {', '.join(unknown)}")
        if not reads and not spec.get("placeholder"):
            raise UserError(f"{path}: a figure reads at least one result id (or says why not in `placeholder`)")
        panels = spec.get("panels") or []
        if reads and (not isinstance(panels, list) or not panels):
            raise UserError(f"{path}: a figure that reads results needs panels")
        for i, panel in enumerate(panels):
            if not isinstance(panel, dict) or panel.get("kind") not in PANEL_KINDS:
                raise UserError(f"{path}: panel {i + 1}: kind must be one of {', '.join(PANEL_KINDS)}")
            for entry in (panel.get("bars") or []) + (panel.get("series") or []) + (panel.get("references") or []):
                if not isinstance(entry, dict) or not isinstance(entry.get("label"), (str, int, float)):
                    raise UserError(f"{path}: panel {i + 1}: every bar, series and reference needs a label "
                                    f"(quote labels YAML reads as null or true: \"NULL\"), got {entry!r}")
        specs.append((path.stem, spec))
    return specs


def render_figures(registry: Registry, numbers: dict[str, NumbersFile], figures_dir: str | Path,
                   profile: str, model_names: Mapping[str, str] | None = None,
                   head_names: Mapping[str, str] | None = None) -> FiguresReport:
    """Render every spec under `figures_dir` into memory (PDF and PNG bytes); a `{role}` in a title, caption,
    label or number reference is the profile's name for that model (`model_names`, params labels.models) or
    head (`head_names`, params readers.named_heads; read from the registry root's params.yaml when not given)."""
    from mistill.repro import labels

    if head_names is None:
        head_names = labels.head_names(registry.root, profile)
    names = labels.label_names(model_names or {}, head_names, f"profile {profile}")
    report = FiguresReport()
    for name, spec in load_specs(figures_dir, registry):
        where = Path(figures_dir) / f"{name}.yaml"
        spec, named_refs = _roles_named(spec, names, str(where))
        report.figures.append(_render_one(registry, numbers, name, spec, profile, where, named_refs))
    return report


ROLE_ENTRY_FIELDS = ("label", "value", "lo", "hi")     # a bar's, series' or reference's fields that take {role}


def _roles_named(spec: dict[str, Any], names: Mapping[str, str],
                 where: str) -> tuple[dict[str, Any], frozenset[str]]:
    """A copy of `spec` whose titles, caption, labels and number references name the models and heads as the
    profile does (one substitution, `mistill.repro.labels.name_models`, for all of them), and the number
    references a role changed.  A key named by a head no profile's expected values register (the rehearsal's
    stand-in heads) is drawn as a gap and reported, not an error; every other unregistered key is one."""
    from mistill.repro.labels import MODELS_AND_HEADS, name_models

    named_refs: set[str] = set()

    def named(text: Any) -> Any:
        return name_models(text, names, where, MODELS_AND_HEADS) if isinstance(text, str) else text

    def ref(text: Any) -> Any:
        out = named(text)
        if out != text:
            named_refs.add(out)
        return out

    def refs(value: Any) -> Any:
        return [ref(r) for r in value] if isinstance(value, list) else ref(value)

    def entry(item: Any) -> Any:
        if not isinstance(item, dict):
            return item
        out = {**item, **{f: (named if f == "label" else refs)(item[f]) for f in ROLE_ENTRY_FIELDS if f in item}}
        if isinstance(item.get("values"), list):
            out["values"] = [ref(r) for r in item["values"]]
        return out

    panels = []
    for panel in spec.get("panels") or []:
        panel = dict(panel)
        if "title" in panel:
            panel["title"] = named(str(panel["title"]))
        for group in ("bars", "series", "references"):
            if isinstance(panel.get(group), list):
                panel[group] = [entry(item) for item in panel[group]]
        panels.append(panel)
    out = {**spec, "title": named(spec["title"]), **({"panels": panels} if panels else {})}
    if spec.get("caption"):
        out["caption"] = named(str(spec["caption"]))
    return out, frozenset(named_refs)


def figures_index(report: FiguresReport, profile: str) -> str:
    """A Markdown page listing every figure, what it reads and what it could not draw."""
    lines = ["<!-- Generated by `mistill repro render` from results/*.json; do not edit. -->", "",
             f"# Figures (profile {profile})", "", report.summary() + ".", ""]
    for fig in report.figures:
        lines += [f"## {fig.title}", "", f"![{fig.name}]({fig.name}.png) ([PDF]({fig.name}.pdf))", "",
                  f"- reads: {', '.join(fig.reads) or 'no result'}"]
        if fig.placeholder:
            lines.append(f"- missing-data placeholder: {fig.placeholder}")
        else:
            lines.append(f"- {fig.drawn} number(s) drawn, {len(fig.missing)} shown as {MISSING}"
                         + (f": {', '.join(fig.missing)}" if fig.missing else ""))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# ---- drawing ----------------------------------------------------------------------------------------


def _render_one(registry: Registry, numbers: dict[str, NumbersFile], name: str, spec: dict[str, Any],
                profile: str, where: Path, named_refs: frozenset[str] = frozenset()) -> FigureResult:
    from matplotlib.figure import Figure

    reads = list(spec.get("reads") or [])
    result = FigureResult(name=name, title=spec["title"], reads=reads)
    lookup = _Lookup(registry, numbers, reads, str(where), named_refs)
    panels = [_panel_data(lookup, panel, where, i) for i, panel in enumerate(spec.get("panels") or [])]
    result.drawn, result.missing = lookup.drawn, sorted(set(lookup.missing))

    if not reads:
        result.placeholder = str(spec["placeholder"]).strip()
    elif lookup.drawn == 0:
        absent = [r for r in reads if r not in numbers]
        result.placeholder = (f"no numbers file holds any of its {len(result.missing)} number(s) under profile "
                              f"{profile}" + (f" ({', '.join(absent)} not reproduced: `dvc repro <ID>` writes "
                                              "results/<ID>.json)" if absent else ""))

    # Drawing is deterministic in what is drawn: a figure whose numbers did not change is not redrawn.
    cache_key = repr((name, spec, profile, panels, result.placeholder, result.missing))
    if cache_key in _DRAWN:
        _DRAWN.move_to_end(cache_key)
        result.files = dict(_DRAWN[cache_key])
        return result

    if result.placeholder:
        fig = Figure(figsize=(2 * PANEL_WIDTH, PANEL_HEIGHT))
        ax = fig.add_subplot()
        ax.set_axis_off()
        ax.text(0.5, 0.62, spec["title"], ha="center", va="center", fontsize=11, weight="bold", wrap=True)
        ax.text(0.5, 0.35, "MISSING DATA\n" + _wrap(result.placeholder, 90), ha="center", va="center",
                fontsize=8.5, color="#7a0000",
                bbox={"boxstyle": "round", "facecolor": "#fff3f3", "edgecolor": "#7a0000"})
    else:
        rows, cols = _layout(spec, len(panels), where)
        fig = Figure(figsize=(cols * PANEL_WIDTH, rows * PANEL_HEIGHT + 0.6), layout="constrained")
        fig.suptitle(spec["title"], fontsize=10, weight="bold")
        for i, data in enumerate(panels):
            _draw_panel(fig.add_subplot(rows, cols, i + 1), data, profile)
        caption = spec.get("caption")
        footer = [caption] if caption else []
        if result.missing:
            footer.append(f"{MISSING}: {len(result.missing)} number(s) no numbers file holds under profile {profile}")
        if footer:
            fig.supxlabel("\n".join(_wrap(line, 60 * cols) for line in footer), fontsize=7, color="#444444")

    for fmt in FIGURE_FORMATS:
        buf = io.BytesIO()
        # no creation date or software version in the file: the same numbers give the same bytes
        metadata = {"CreationDate": None, "Producer": None} if fmt == "pdf" else {"Software": None}
        fig.savefig(buf, format=fmt, dpi=DPI, metadata=metadata)
        result.files[fmt] = buf.getvalue()
    _DRAWN[cache_key] = dict(result.files)
    while len(_DRAWN) > _DRAWN_MAX:
        _DRAWN.popitem(last=False)
    return result


@dataclass
class _Panel:
    kind: str
    title: str
    xlabel: str
    ylabel: str
    labels: list[str]                                    # bar labels or x tick labels
    series: list[tuple[str, list[float | None]]]         # bars: one series; lines: one per line
    ranges: list[tuple[float | None, float | None]]      # bars: (lo, hi) per bar
    roles: list[str]                                     # bars: "value" or "floor" (a reference level, grey)
    references: list[tuple[str, float]]
    missing: list[str]
    missing_points: set[int]                             # lines: x positions where a registered number is missing


def _panel_data(lookup: _Lookup, panel: dict[str, Any], where: Path, i: int) -> _Panel:
    before = len(lookup.missing)
    refs = []
    for ref in panel.get("references") or []:
        value = lookup.value(ref["value"])
        if value is not None:
            refs.append((str(ref["label"]), value))
    if panel["kind"] == "bars":
        bars = panel.get("bars") or []
        if not bars:
            raise UserError(f"{where}: panel {i + 1}: bars panel without bars")
        labels = [str(b["label"]) for b in bars]
        values = [lookup.value(b["value"]) for b in bars]
        ranges = [(lookup.value(b["lo"]) if "lo" in b else None, lookup.value(b["hi"]) if "hi" in b else None)
                  for b in bars]
        roles = [str(b.get("role", "value")) for b in bars]
        bad = [r for r in roles if r not in BAR_ROLES]
        if bad:
            raise UserError(f"{where}: panel {i + 1}: bar role {bad[0]!r} is not one of {', '.join(BAR_ROLES)}")
        series = [("", values)]
        missing_points = set()
    else:
        roles = []
        series_specs = panel.get("series") or []
        if not series_specs:
            raise UserError(f"{where}: panel {i + 1}: lines panel without series")
        ranges = []
        if "x_list" in panel:
            labels, points = _whole_list_series(lookup, panel, series_specs, where, i)
        elif "x" in panel:
            labels = [str(x) for x in panel["x"]]
            points = []
            for s in series_specs:
                refs_s = s.get("values") or []
                if len(refs_s) != len(labels):
                    raise UserError(f"{where}: panel {i + 1}: series {s.get('label')!r} has {len(refs_s)} values "
                                    f"for {len(labels)} x ticks")
                points.append([(True, lookup.value(r)) for r in refs_s])
        else:
            ks = sorted({k for s in series_specs for k in lookup.expand(s["value"])})
            labels = [str(k) for k in ks]
            points = [[_value_if_registered(lookup, s["value"], k) for k in ks] for s in series_specs]
        series = [(str(s["label"]), [value for _, value in row]) for s, row in zip(series_specs, points)]
        missing_points = {x for row in points for x, (registered, value) in enumerate(row)
                          if registered and value is None}
    return _Panel(panel["kind"], str(panel.get("title", "")), str(panel.get("xlabel", "")),
                  str(panel.get("ylabel", "")), labels, series, ranges, roles, refs, lookup.missing[before:],
                  missing_points)


def _whole_list_series(lookup: _Lookup, panel: dict[str, Any], series_specs: list[dict], where: Path,
                       i: int) -> tuple[list[str], list[list[tuple[bool, float | None]]]]:
    """Ticks from a list value (`x_list`, `x_prefix`) and each series from a list value of the same length."""
    ticks = lookup.whole_list(str(panel["x_list"]))
    prefix = str(panel.get("x_prefix", ""))
    labels = [prefix + (f"{t:g}") for t in ticks] if ticks is not None else [MISSING]
    points = []
    for s in series_specs:
        if "list" not in s:
            raise UserError(f"{where}: panel {i + 1}: with x_list, series {s.get('label')!r} names a `list` value")
        values = lookup.whole_list(str(s["list"]))
        if values is None:
            points.append([(True, None)] * len(labels))
            continue
        if ticks is not None and len(values) != len(ticks):
            raise UserError(f"{where}: panel {i + 1}: {s['list']} has {len(values)} values for {len(ticks)} ticks "
                            f"of {panel['x_list']}")
        points.append([(True, v) for v in values] if ticks is not None else [(True, None)])
    return labels, points


def _value_if_registered(lookup: _Lookup, pattern: str, k: int) -> tuple[bool, float | None]:
    """(registered, value) of a series point at k: a series with no key at k has a gap, not a missing number."""
    rid, key, _ = lookup.parse(pattern)
    if key.replace("{k}", str(k)) not in lookup.registry.registered_keys(rid):
        return False, None
    return True, lookup.value(pattern, k)


def _draw_panel(ax, data: _Panel, profile: str) -> None:
    ax.set_title(data.title, fontsize=9)
    ax.set_xlabel(data.xlabel, fontsize=8)
    ax.set_ylabel(data.ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    values = [v for _, vs in data.series for v in vs if v is not None]
    if not values:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.5, 0.5, "MISSING DATA\n" + _wrap(f"not reproduced under profile {profile}: "
                                                    + ", ".join(data.missing), 44),
                ha="center", va="center", fontsize=6.5, color="#7a0000", transform=ax.transAxes)
        return
    positions = list(range(len(data.labels)))
    if data.kind == "bars":
        (_, heights), = data.series
        top = max([abs(v) for v in values] + [abs(r) for _, r in data.references]) or 1.0
        for x, height, (lo, hi), role in zip(positions, heights, data.ranges, data.roles):
            if height is None:
                ax.bar(x, 0.04 * top, color="none", edgecolor=MISSING_COLOUR, hatch="///")
                ax.text(x, 0.06 * top, MISSING, ha="center", va="bottom", fontsize=7, color="#7a0000")
                continue
            ax.bar(x, height, color=BAR_COLOURS[role])
            if lo is not None and hi is not None:
                ax.errorbar(x, height, yerr=[[max(height - lo, 0.0)], [max(hi - height, 0.0)]], color="black",
                            capsize=2, linewidth=0.8)
        ax.axhline(0.0, color="black", linewidth=0.5)
        ax.set_xticks(positions, data.labels, rotation=35, ha="right")
        highest = max(values + [r for _, r in data.references] + [hi for _, hi in data.ranges if hi is not None])
        if highest > 0 and data.references:
            ax.set_ylim(top=highest * 1.2)            # room for the legend above the bars
    else:
        for label, points in data.series:
            ys = [float("nan") if p is None else p for p in points]
            ax.plot(positions, ys, marker="o", markersize=3, linewidth=1, label=label)
        # a registered point no numbers file holds: ?? above the axis at its x
        for x in sorted(data.missing_points):
            ax.text(x, 0.02, MISSING, ha="center", va="bottom", fontsize=7, color="#7a0000",
                    transform=ax.get_xaxis_transform())
        ax.set_xticks(positions, data.labels)
        ax.set_xlim(-0.5, len(positions) - 0.5)
        ax.legend(fontsize=6, frameon=False)
    for i, (label, value) in enumerate(data.references):
        ax.axhline(value, color=f"C{i + 1}", linestyle="--", linewidth=0.8, label=label)
    if data.references:
        ax.legend(fontsize=6, loc="upper right", framealpha=0.9)


def _layout(spec: dict[str, Any], n: int, where: Path) -> tuple[int, int]:
    layout = spec.get("layout")
    if layout is None:
        return 1, n
    if (not isinstance(layout, list) or len(layout) != 2 or not all(isinstance(x, int) and x > 0 for x in layout)
            or layout[0] * layout[1] < n):
        raise UserError(f"{where}: layout must be [rows, columns] with room for {n} panels")
    return layout[0], layout[1]


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width=max(width, 20))) or text
