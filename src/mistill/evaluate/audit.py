"""The blinded audit of contrastive events (Sec. 2.2, App. C Table 5; App. E Table 24; R-C9).

A P2C event is defined by mention order alone: the emitted code diverges from a sibling the trace
named earlier, for whatever reason.  The audit says what those earlier mentions are, on a sample a
second team can redo:

1. **Frame.**  Every P2C event of the teacher's traces on the test notes falls in one of eight strata,
   (realised in every student's tokenizer, App. I.1) x (the emitted code is gold) x (the emitted code
   reaches the final answer).  A seeded stratified draw of `n_events`: equal allocation over the
   strata, a stratum smaller than its share giving all it has and the rest spread over the others
   in stratum order.  The weight of an audited event is N_h / n_h (population over sample size of
   its stratum), so weighted shares estimate the population of contrastive events.
2. **Sheet and key.**  The labeller sees, per item, the trace's lines around the earlier mention and
   around the decision, the emitted code and the sibling, and nothing else: no note id, arm, score
   or stratum.  Items are numbered in a seeded shuffle; the key (item -> note, event, stratum) is a
   separate file the labeller never opens.
3. **Labels.**  One class per item, by the written rule

       rejection      the sibling was considered for the same condition and set aside for the code
       enumeration    the sibling is a neighbouring line of a scan of the candidate block
       both_endorsed  the trace endorses both codes
       other          anything else (the sibling endorsed and the code only enumerated, hedged pairs)

   and whether the contrast is clinically meaningful (no: BMI bands, place-of-occurrence codes,
   "other" against "unspecified" residuals).  An import checks the labels against the key (every
   item once, no unknown item, a known class) and fails on the first problem with one line.
   Under the demo the labeller is the note generator itself (`generator_labels`): it knows which
   siblings it wrote into the note as ruled-out alternatives, so it knows whether the trace's earlier
   mention was a considered alternative or a line of the candidate block, which is the ground truth
   the readout has to agree with.
4. **Readout.**  Raw class shares with Clopper-Pearson 95% intervals, strata-weighted shares, the
   clinically meaningful share, the rejection share among events whose code reaches the final answer
   and among those whose code does not; Table 24's restricted student reads live in the reader.
"""

from __future__ import annotations

import csv
import io
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from statsmodels.stats.proportion import proportion_confint

from mistill.errors import UserError
from mistill.io import atomic_open, read_json, read_jsonl, write_json
from mistill.world.answers import last_json_list
from mistill.world.inventory import Inventory
from mistill.world.types import Note

LABELS = ("rejection", "enumeration", "both_endorsed", "other")
MEANINGFUL = ("yes", "no")
SHEET_COLUMNS = ("item", "emitted_code", "sibling_code", "earlier_mention_context", "decision_context",
                 "label", "clinically_meaningful")
LABEL_COLUMNS = ("item", "label", "clinically_meaningful")


@dataclass(frozen=True)
class AuditConfig:
    """The profile's `audit` section."""

    out_dir: str             # frame.json, sheet.csv, key.json, labels.csv
    traces: str              # the teacher's traces (TR-008)
    events_dir: str          # their events (<note>/events.jsonl)
    test_notes: str          # the audited notes (the test notes)
    n_events: int            # the sample (paper 181)
    seed: int
    labels: str              # "generator" (the demo's ground truth) or a labels CSV the labeller filled in
    context_lines: int = 2   # trace lines shown before each of the two mentions, the mention's own included

    @classmethod
    def from_params(cls, params: dict) -> AuditConfig:
        section = params.get("audit")
        where = f"params.yaml {params.get('name', '<profile>')}.audit"
        if not isinstance(section, dict):
            raise UserError(f"{where}: missing; it names the audited traces, the sample size and the labels")
        known = {k: section[k] for k in cls.__dataclass_fields__ if k in section}
        missing = sorted(set(cls.__dataclass_fields__) - set(known) - {"context_lines"})
        if missing:
            raise UserError(f"{where}: missing {', '.join(missing)}")
        config = cls(**known)
        if not isinstance(config.n_events, int) or config.n_events < 1:
            raise UserError(f"{where}.n_events: must be a positive count, got {config.n_events!r}")
        if not isinstance(config.context_lines, int) or config.context_lines < 1:
            raise UserError(f"{where}.context_lines: must be at least 1, got {config.context_lines!r}")
        return config

    def path(self, name: str) -> Path:
        return Path(self.out_dir) / name


# ---- 1. the frame -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stratum:
    aligned: bool   # realised in every student's tokenizer (App. I.1 anchor rule)
    gold: bool      # the emitted code is one of the note's gold codes
    final: bool     # the emitted code reaches the trace's final answer

    @property
    def name(self) -> str:
        return "/".join((("aligned" if self.aligned else "unaligned"), ("gold" if self.gold else "non-gold"),
                         ("final" if self.final else "not-final")))

    @classmethod
    def every(cls) -> list[Stratum]:
        return [cls(a, g, f) for a in (True, False) for g in (True, False) for f in (True, False)]


@dataclass(frozen=True)
class ContrastiveEvent:
    note_id: str
    event_index: int         # the row in <events_dir>/<note>/events.jsonl
    anchor: int              # character offset of the decision in the completion
    code: str
    near_miss: str
    mention_at: int          # character offset of the latest earlier mention of the near-miss
    stratum: Stratum

    def to_json(self) -> dict:
        return {**asdict(self), "stratum": self.stratum.name}

    @classmethod
    def from_json(cls, row: dict) -> ContrastiveEvent:
        aligned, gold, final = row["stratum"].split("/")
        return cls(row["note_id"], int(row["event_index"]), int(row["anchor"]), row["code"], row["near_miss"],
                   int(row["mention_at"]), Stratum(aligned == "aligned", gold == "gold", final == "final"))


def contrastive_events(traces: Sequence, notes: Mapping[str, Note], events_dir: str | Path,
                       realised_anchors: Mapping[str, set[int]]) -> list[ContrastiveEvent]:
    """Every P2C event with an earlier mention of its near-miss, in trace order, with its stratum.

    `realised_anchors[note]`: the P2C anchors every student's tokenizer realises on that note.
    """
    out = []
    for trace in traces:
        path = Path(events_dir) / trace.note_id / "events.jsonl"
        if trace.note_id not in notes or not path.exists():
            continue
        answer = set(last_json_list(trace.completion) or [])
        gold = set(notes[trace.note_id].gold_codes)
        for index, event in enumerate(read_jsonl(path)):
            if event.get("kind") != "P2C" or not event.get("near_miss"):
                continue
            anchor = int(event["anchor"])
            mention_at = trace.completion.rfind(event["near_miss"], 0, anchor)
            if mention_at < 0:
                continue
            stratum = Stratum(anchor in realised_anchors.get(trace.note_id, set()), event["code"] in gold,
                              event["code"] in answer)
            out.append(ContrastiveEvent(trace.note_id, index, anchor, event["code"], event["near_miss"],
                                        mention_at, stratum))
    return out


def allocate(sizes: Mapping[Stratum, int], n: int) -> dict[Stratum, int]:
    """Equal allocation of `n` over the strata, capped by each stratum's size; what a small stratum
    cannot take goes to the others, one at a time in stratum order."""
    take = {s: 0 for s in sizes}
    left = min(n, sum(sizes.values()))
    while left:
        open_strata = [s for s in sizes if take[s] < sizes[s]]
        for s in open_strata:
            if left == 0:
                break
            take[s] += 1
            left -= 1
    return take


def draw_frame(events: Sequence[ContrastiveEvent], n: int, seed: int) -> dict:
    """The seeded stratified draw: {"events": [...], "population": {stratum: N_h}, "sample": {stratum: n_h}}."""
    by_stratum: dict[Stratum, list[ContrastiveEvent]] = {s: [] for s in Stratum.every()}
    for event in events:
        by_stratum[event.stratum].append(event)
    sizes = {s: len(v) for s, v in by_stratum.items()}
    take = allocate(sizes, n)
    rng = random.Random(seed)
    drawn = [e for s, pool in by_stratum.items() for e in (rng.sample(pool, take[s]) if take[s] else [])]
    drawn.sort(key=lambda e: (e.note_id, e.event_index))
    return {"events": [e.to_json() for e in drawn], "population": {s.name: sizes[s] for s in sizes},
            "sample": {s.name: take[s] for s in take}, "seed": seed}


# ---- 2. the blinded sheet and its key -----------------------------------------------------------------


def _context(completion: str, at: int, lines: int) -> str:
    """The `lines` trace lines ending with the one holding character `at`, the code at `at` in [[ ]]."""
    start = completion.rfind("\n", 0, at) + 1
    for _ in range(lines - 1):
        start = completion.rfind("\n", 0, start - 1) + 1 if start > 0 else 0
    end = completion.find("\n", at)
    end = len(completion) if end < 0 else end
    token_end = at
    while token_end < len(completion) and not completion[token_end].isspace():
        token_end += 1
    return (completion[start:at] + "[[" + completion[at:token_end] + "]]" + completion[token_end:end]).strip()


def sheet_rows(frame: dict, completions: Mapping[str, str], seed: int, context_lines: int
               ) -> tuple[list[dict], dict[str, dict]]:
    """(sheet rows, key): items numbered in a seeded shuffle; the key maps item -> event of the frame."""
    events = [ContrastiveEvent.from_json(row) for row in frame["events"]]
    order = list(range(len(events)))
    random.Random(seed + 1).shuffle(order)
    width = len(str(len(events)))
    rows, key = [], {}
    for number, i in enumerate(order, start=1):
        event = events[i]
        item = f"A{number:0{width}d}"
        completion = completions[event.note_id]
        decision_at = completion.rfind(event.code, 0, event.anchor + len(event.code))
        rows.append({"item": item, "emitted_code": event.code, "sibling_code": event.near_miss,
                     "earlier_mention_context": _context(completion, event.mention_at, context_lines),
                     "decision_context": _context(completion, decision_at, context_lines),
                     "label": "", "clinically_meaningful": ""})
        key[item] = event.to_json()
    rows.sort(key=lambda r: r["item"])
    return rows, key


def write_csv(path: str | Path, rows: Iterable[Mapping[str, str]], columns: Sequence[str]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    with atomic_open(path) as f:
        f.write(buffer.getvalue())


# ---- 3. labels ------------------------------------------------------------------------------------------


def read_labels(path: str | Path, key: Mapping[str, dict]) -> dict[str, tuple[str, bool]]:
    """item -> (class, clinically meaningful) from a filled-in sheet or labels CSV, checked against the key."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no labels file; fill in the sheet's label columns (or set audit.labels)")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing_columns = [c for c in LABEL_COLUMNS if c not in (reader.fieldnames or [])]
        if missing_columns:
            raise UserError(f"{path}: missing column(s) {', '.join(missing_columns)}")
        labels: dict[str, tuple[str, bool]] = {}
        for line, row in enumerate(reader, start=2):
            item = (row["item"] or "").strip()
            label = (row["label"] or "").strip().lower()
            meaningful = (row["clinically_meaningful"] or "").strip().lower()
            if item not in key:
                raise UserError(f"{path}:{line}: item {item!r} is not in the audit key")
            if item in labels:
                raise UserError(f"{path}:{line}: item {item} labelled twice")
            if label not in LABELS:
                raise UserError(f"{path}:{line}: label {label!r} of {item} is not one of {', '.join(LABELS)}")
            if meaningful not in MEANINGFUL:
                raise UserError(f"{path}:{line}: clinically_meaningful {meaningful!r} of {item} is not yes or no")
            labels[item] = (label, meaningful == "yes")
    unlabelled = sorted(set(key) - set(labels))
    if unlabelled:
        raise UserError(f"{path}: {len(unlabelled)} item(s) of the key unlabelled, first {unlabelled[0]}")
    return labels


_RESIDUAL_WORDS = {"other", "unspecified", "specified", "nos", "nec"}
_NOT_MEANINGFUL_PHRASES = ("body mass index", "place of occurrence")


def clinically_meaningful(code_description: str, sibling_description: str) -> bool:
    """The written rule's exceptions: BMI bands, place-of-occurrence codes, and a pair that differs only
    in the residual words ("other" against "unspecified")."""
    pair = (code_description.lower(), sibling_description.lower())
    if any(phrase in d for d in pair for phrase in _NOT_MEANINGFUL_PHRASES):
        return False
    core = [[w for w in d.split() if w not in _RESIDUAL_WORDS] for d in pair]
    return core[0] != core[1]


def generator_label(event: ContrastiveEvent, note: Note, completion: str, inventory: Inventory
                    ) -> tuple[str, bool]:
    """The demo's ground truth for one audited event, from what the note generator wrote.

    The generator puts a code's sibling into a note in two ways only: as a gold finding or as a
    ruled-out alternative (`mistill.world.demo_truth.rules_out`).  A sibling the note names is a
    candidate for the same condition, so setting it aside is a rejection (verified against the note,
    right or wrong); a sibling the note never names can only come from scanning the candidate
    block's lines, an enumeration, whatever words the trace dresses it in.  For events whose emitted
    code the trace's answer keeps; a sibling the answer keeps as well is both_endorsed, and an emitted
    code the answer drops (the code only enumerated) is other.
    """
    from mistill.world.demo_truth import rules_out

    sibling = inventory[event.near_miss].description
    meaningful = clinically_meaningful(inventory[event.code].description, sibling)
    answer = set(last_json_list(completion) or [])
    if event.near_miss in answer and event.code in answer:
        return "both_endorsed", meaningful
    if event.code not in answer:
        return "other", meaningful
    named = event.near_miss in note.gold_codes or rules_out(note.text, sibling)
    return ("rejection" if named else "enumeration"), meaningful


def generator_labels(key: Mapping[str, dict], notes: Mapping[str, Note], traces: Mapping[str, object],
                     inventory: Inventory) -> list[dict]:
    """Label rows (item, label, clinically_meaningful) for every item of the key, in item order."""
    rows = []
    for item, row in sorted(key.items()):
        event = ContrastiveEvent.from_json(row)
        trace = traces[event.note_id]
        label, meaningful = generator_label(event, notes[event.note_id], trace.completion, inventory)
        rows.append({"item": item, "label": label, "clinically_meaningful": "yes" if meaningful else "no"})
    return rows


# ---- 4. the readout -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Share:
    count: int
    n: int
    low: float        # Clopper-Pearson 95% interval, percent
    high: float

    @property
    def percent(self) -> float:
        return 100.0 * self.count / self.n if self.n else float("nan")


def share(count: int, n: int, alpha: float = 0.05) -> Share:
    if n == 0:
        return Share(0, 0, float("nan"), float("nan"))
    low, high = proportion_confint(count, n, alpha=alpha, method="beta")
    return Share(count, n, 100.0 * float(low), 100.0 * float(high))


def weighted_share(items: Sequence[tuple[str, bool]], population: Mapping[str, int], sample: Mapping[str, int],
                   predicate) -> float:
    """Percent of the population estimated from the stratified sample: sum_h N_h * p_h / N over the
    strata with audited events (items: (stratum name, labelled row's predicate input))."""
    hits: dict[str, int] = Counter(s for s, x in items if predicate(x))
    covered = [s for s, n in sample.items() if n]
    total = sum(population[s] for s in covered)
    return 100.0 * sum(population[s] * hits.get(s, 0) / sample[s] for s in covered) / total if total else float("nan")


def audit_readout(key: Mapping[str, dict], labels: Mapping[str, tuple[str, bool]], frame: dict) -> dict:
    """Table 5's numbers: per class the raw share with its interval and the weighted share, the clinically
    meaningful share, and the rejection share split by whether the code reaches the final answer."""
    events = {item: ContrastiveEvent.from_json(row) for item, row in key.items()}
    n = len(events)
    counts = Counter(labels[i][0] for i in events)
    by_stratum = [(events[i].stratum.name, labels[i][0]) for i in events]
    out: dict = {"n": n, "classes": {}, "population": frame["population"], "sample": frame["sample"]}
    for label in LABELS:
        raw = share(counts[label], n)
        out["classes"][label] = {**asdict(raw), "percent": raw.percent,
                                 "weighted_percent": weighted_share(by_stratum, frame["population"], frame["sample"],
                                                                    lambda x, label=label: x == label)}
    meaningful = sum(labels[i][1] for i in events)
    out["clinically_meaningful"] = {**asdict(share(meaningful, n)), "percent": share(meaningful, n).percent}
    split: dict[bool, list[str]] = defaultdict(list)
    for i, event in events.items():
        split[event.stratum.final].append(labels[i][0])
    for final, name in ((True, "final_answer"), (False, "not_final_answer")):
        got = share(sum(x == "rejection" for x in split[final]), len(split[final]))
        out[f"rejection_{name}"] = {**asdict(got), "percent": got.percent}
    return out


def load_audit(cfg: AuditConfig) -> tuple[dict, dict, dict[str, tuple[str, bool]]]:
    """(frame, key, labels) of a completed audit; the labels re-checked against the key."""
    frame = read_json(cfg.path("frame.json"), "audit frame")
    key = read_json(cfg.path("key.json"), "audit key")
    return frame, key, read_labels(cfg.path("labels.csv"), key)


def write_frame_outputs(cfg: AuditConfig, frame: dict, sheet: list[dict], key: dict, provenance: dict) -> None:
    write_json(cfg.path("frame.json"), {**frame, "provenance": provenance})
    write_csv(cfg.path("sheet.csv"), sheet, SHEET_COLUMNS)
    write_json(cfg.path("key.json"), key)
