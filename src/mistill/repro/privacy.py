"""The privacy guard: no note text, trace text or note identifier in what is shared.

docs/design.md "Privacy": under the paper profile nothing of MIMIC-IV may reach results/, paper/,
logs meant for release or the shareable DVC remote.  `mistill repro privacy [PATHS...]`
scans every file under results/ and paper/build/, and every file or directory given
(`--shareable`: every output the profile sends to its shareable DVC remote, file names included;
`mistill.repro.remotes`), for

* note and trace text: any 8-token run of a note of the profile's corpora (`privacy.notes`)
  or of a trace completion of its trace sets (`privacy.traces`); tokens are the whitespace
  tokens of the text after the notes' normalisation (`mistill.world.text.clean_text`).  Every
  run of every source is hashed into a set once, so a scanned file costs one pass;
* identifiers: a note id or patient id of those files standing as a whole token, or as whole
  "-"/"_"-joined parts of one (`<id>-kept`); tokens are runs of letters, digits, "_" and "-",
  and decimal numbers are not tokens;
* numbers files' `statistic` and `artifact` fields outside their grammar
  (`mistill.repro.text_fields`).

Each finding is one line naming the file, where in it (a line, or a field of a JSON file)
and the kind of leak, never the leaked text; any finding exits non-zero.

The active profile's `privacy` section of params.yaml says what is checked:

    privacy:
      notes: [artifacts/data/corpus_char.jsonl, ...]   # {"note_id", "patient_id", "text"} a line
      traces: [artifacts/TR-006/traces.jsonl, ...]     # {"note_id", "completion"} a line
      require_sources: true   # a missing note or trace file is an error (false: said, skipped)
      hash_note_ids: true     # numbers files name per-note inputs by a keyed hash of the id

With `hash_note_ids: false` (the demo: synthetic notes) numbers files keep note ids in their
per-note input paths and the identifier check leaves the keys of their `inputs` alone.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mistill.errors import UserError
from mistill.io import iter_json_lines
from mistill.repro.text_fields import artifact_problem, statistic_problem
from mistill.world.text import clean_text

SHINGLE_TOKENS = 8
MIN_IDENTIFIER_CHARS = 5        # shorter ids ("1", "p12") would match ordinary tokens
SETTINGS = ("notes", "traces", "require_sources", "hash_note_ids")

NOTE_TEXT = "note text"
TRACE_TEXT = "trace text"
IDENTIFIER = "note or patient identifier"
GRAMMAR = "text field outside the numbers-file grammar"

_DECIMAL = re.compile(r"(?<![A-Za-z0-9_.])[-+]?\d+\.\d+(?:[eE][-+]?\d+)?")
_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
_TOKEN_PART = re.compile(r"[A-Za-z0-9]+")
_ARTIFACT_SEPARATOR = re.compile(r"(, | vs )")


# ---- settings and sources -------------------------------------------------------------------------


@dataclass(frozen=True)
class PrivacySettings:
    """The active profile's `privacy` section."""

    notes: tuple[Path, ...] = ()
    traces: tuple[Path, ...] = ()
    require_sources: bool = False
    hash_note_ids: bool = False

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> PrivacySettings:
        where = f"params.yaml: {params.get('profile', '?')}.privacy"
        section = params.get("privacy") or {}
        if not isinstance(section, Mapping):
            raise UserError(f"{where} must be a mapping ({', '.join(SETTINGS)})")
        unknown = sorted(set(section) - set(SETTINGS))
        if unknown:
            raise UserError(f"{where}: unknown setting {unknown[0]!r} (known: {', '.join(SETTINGS)})")

        def paths(key: str) -> tuple[Path, ...]:
            value = section.get(key) or []
            if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
                raise UserError(f"{where}.{key} must be a list of paths")
            return tuple(Path(p) for p in value)

        def flag(key: str) -> bool:
            value = section.get(key, False)
            if not isinstance(value, bool):
                raise UserError(f"{where}.{key} must be true or false, got {value!r}")
            return value

        return cls(paths("notes"), paths("traces"), flag("require_sources"), flag("hash_note_ids"))


@dataclass
class TextSource:
    """The hashed 8-token runs of one note or trace file."""

    kind: str                       # NOTE_TEXT or TRACE_TEXT
    path: Path
    shingles: set[int]


@dataclass
class PrivateSources:
    """What may not leak: the runs of every note and trace text, and every note and patient id."""

    texts: list[TextSource] = field(default_factory=list)
    identifiers: frozenset[str] = frozenset()      # lower-cased, at least MIN_IDENTIFIER_CHARS long
    short_identifiers: int = 0
    missing: list[Path] = field(default_factory=list)

    @property
    def n_shingles(self) -> int:
        return sum(len(t.shingles) for t in self.texts)


def shingle_hashes(text: str) -> Iterator[int]:
    """Hashes of every run of SHINGLE_TOKENS whitespace tokens of the normalised text."""
    tokens = clean_text(text).split()
    return map(hash, zip(*(tokens[i:] for i in range(SHINGLE_TOKENS))))


def load_sources(settings: PrivacySettings, root: str | Path = ".") -> PrivateSources:
    """Hash every note and trace text the settings list; a missing file is skipped unless required."""
    root = Path(root)
    sources = PrivateSources()
    ids: set[str] = set()
    for kind, paths, text_key in ((NOTE_TEXT, settings.notes, "text"), (TRACE_TEXT, settings.traces, "completion")):
        for listed in paths:
            path = root / listed
            if not path.is_file():
                sources.missing.append(listed)
                continue
            hashes: set[int] = set()
            for where, row in iter_json_lines(path, kind.replace(" text", "s")):
                text = _field(row, text_key, where)
                hashes.update(shingle_hashes(text))
                ids.update(_identifiers(row, where))
            sources.texts.append(TextSource(kind, listed, hashes))
    if sources.missing and settings.require_sources:
        raise UserError(f"privacy: {sources.missing[0]}: no such file, and privacy.require_sources is true "
                        f"(build it, or list the profile's files under privacy.notes / privacy.traces)")
    lowered = {i.lower() for i in ids}
    sources.identifiers = frozenset(i for i in lowered if len(i) >= MIN_IDENTIFIER_CHARS)
    sources.short_identifiers = len(lowered) - len(sources.identifiers)
    return sources


def _field(row: Any, key: str, where: str) -> str:
    if not isinstance(row, dict) or not isinstance(row.get(key), str):
        raise UserError(f"{where}: expected a JSON object with a text field {key!r}")
    return row[key]


def _identifiers(row: dict, where: str) -> Iterator[str]:
    for key in ("note_id", "patient_id"):
        value = row.get(key)
        if value is None and key == "patient_id":
            continue
        if not isinstance(value, (str, int)) or isinstance(value, bool) or str(value) == "":
            raise UserError(f"{where}: missing or malformed {key!r}")
        yield str(value)


# ---- per-note paths in numbers files ----------------------------------------------------------------


@dataclass(frozen=True)
class NotePseudonyms:
    """A keyed hash for every note and patient id, to name per-note paths in shared files.

    The key is a digest of the profile's sorted note ids, so the pseudonyms are stable across
    machines and runs, and only someone holding the notes can tell which note one names.
    """

    key: bytes
    identifiers: frozenset[str]

    def of(self, identifier: str) -> str:
        return "note-" + hashlib.blake2b(identifier.encode(), key=self.key, digest_size=6).hexdigest()

    def path(self, path: str) -> str:
        """`path` with every segment that is an id (or an id plus extension) replaced by its pseudonym."""
        parts = []
        for part in path.split("/"):
            stem, dot, rest = part.partition(".")
            if part in self.identifiers:
                part = self.of(part)
            elif dot and stem in self.identifiers:
                part = f"{self.of(stem)}.{rest}"
            parts.append(part)
        return "/".join(parts)

    def artifact(self, text: str) -> str:
        """An artifact field (paths joined by ", " or " vs ") with every path's ids replaced."""
        return "".join(p if _ARTIFACT_SEPARATOR.fullmatch(p) else self.path(p) for p in _ARTIFACT_SEPARATOR.split(text))


def note_pseudonyms(settings: PrivacySettings, root: str | Path = ".") -> NotePseudonyms:
    """The pseudonyms of the ids in the profile's note files (every listed file must exist)."""
    root = Path(root)
    if not settings.notes:
        raise UserError("privacy.hash_note_ids needs the profile's note files: privacy.notes lists none")
    note_ids: set[str] = set()
    identifiers: set[str] = set()
    for listed in settings.notes:
        path = root / listed
        if not path.is_file():
            raise UserError(f"{listed}: no such file; privacy.hash_note_ids needs the note ids it holds")
        for where, row in iter_json_lines(path, "notes"):
            found = list(_identifiers(row if isinstance(row, dict) else {}, where))
            note_ids.add(found[0])
            identifiers.update(found)
    key = hashlib.blake2b("\n".join(sorted(note_ids)).encode(), digest_size=32).digest()
    return NotePseudonyms(key, frozenset(identifiers))


# ---- the scan ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    path: Path
    where: str          # "line 12", or a JSON field such as "values.k.statistic"
    kind: str
    detail: str = ""

    def format(self) -> str:
        return f"{self.path}: {self.where}: {self.kind}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class PrivacyReport:
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    shingles: int = 0
    identifiers: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        verdict = (f"{len(self.findings)} findings in {len({f.path for f in self.findings})} files"
                   if self.findings else "clean")
        return (f"privacy: {self.files} files ({self.bytes / 1e3:.0f} kB) against {self.shingles} note/trace "
                f"runs and {self.identifiers} identifiers in {self.seconds:.2f}s: {verdict}")


def run_privacy(params: Mapping[str, Any], scan: Iterable[str | Path], *, required: Iterable[str | Path] = (),
                root: str | Path = ".", names: bool = False) -> PrivacyReport:
    """Scan every file under `scan` (absent entries are noted; absent `required` ones are errors).

    With `names`, a file's path below a scanned directory is checked for identifiers too: a DVC
    remote stores a directory output's manifest, which lists those paths.
    """
    start = time.perf_counter()
    settings = PrivacySettings.from_params(params)
    sources = load_sources(settings, root)
    report = PrivacyReport(shingles=sources.n_shingles, identifiers=len(sources.identifiers))
    if sources.missing:
        report.notes.append(f"no note or trace text at {', '.join(map(str, sources.missing))} "
                            "(privacy.require_sources is false): not checked against those")
    if sources.short_identifiers:
        report.notes.append(f"{sources.short_identifiers} ids shorter than {MIN_IDENTIFIER_CHARS} characters "
                            "are not checked as tokens")
    required = {Path(p) for p in required}
    for top in map(Path, scan):
        if not top.exists():
            if top in required:
                raise UserError(f"{top}: no such file or directory to scan")
            report.notes.append(f"{top}: absent, not scanned")
            continue
        for path in sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else [top]:
            raw = path.read_bytes()
            report.files += 1
            report.bytes += len(raw)
            if names and top.is_dir() and _has_identifier(path.relative_to(top).as_posix(), sources.identifiers):
                report.findings.append(Finding(path, "file name", IDENTIFIER,
                                               "a whole token of the path a remote's directory manifest lists"))
            report.findings += scan_text(path, raw.decode("utf-8", errors="replace"), sources, settings)
    report.seconds = time.perf_counter() - start
    return report


def scan_text(path: Path, text: str, sources: PrivateSources, settings: PrivacySettings) -> list[Finding]:
    """Every finding in one file's text: runs of private text, identifiers, text-field grammar."""
    findings = _shingle_findings(path, text, sources)
    data = _json_document(path, text)
    if data is None:
        for number, line in enumerate(text.splitlines(), start=1):
            if _has_identifier(line, sources.identifiers):
                findings.append(Finding(path, f"line {number}", IDENTIFIER, "a whole token"))
        return findings
    numbers_file = isinstance(data, dict) and isinstance(data.get("values"), dict) and "inputs" in data
    skip_input_keys = numbers_file and not settings.hash_note_ids
    for where, string, is_key in _json_strings(data, sources.identifiers):
        if skip_input_keys and is_key and where.startswith("key ") and where.endswith(" of inputs"):
            continue
        if _has_identifier(string, sources.identifiers):
            findings.append(Finding(path, where, IDENTIFIER, "a whole token"))
    if numbers_file:
        findings += _grammar_findings(path, data["values"], sources.identifiers)
    return findings


def _shingle_findings(path: Path, text: str, sources: PrivateSources) -> list[Finding]:
    if not sources.texts:
        return []
    tokens: list[str] = []
    line_of: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = clean_text(line).split()
        tokens += words
        line_of += [number] * len(words)
    findings: dict[int, Finding] = {}
    for start, h in enumerate(map(hash, zip(*(tokens[i:] for i in range(SHINGLE_TOKENS))))):
        line = line_of[start]
        if line in findings:
            continue
        source = next((s for s in sources.texts if h in s.shingles), None)
        if source is not None:
            findings[line] = Finding(path, f"line {line}", source.kind,
                                     f"a run of {SHINGLE_TOKENS} tokens from {source.path}")
    return list(findings.values())


def _has_identifier(text: str, identifiers: frozenset[str]) -> bool:
    """Whether an id stands in `text` as a token or as "-"/"_"-joined parts of one (`<id>-kept`)."""
    if not identifiers:
        return False
    for token in _TOKEN.findall(_DECIMAL.sub(" ", text.lower())):
        parts = [m.span() for m in _TOKEN_PART.finditer(token)]
        if any(token[start:end] in identifiers for i, (start, _) in enumerate(parts) for _, end in parts[i:]):
            return True
    return False


def _json_document(path: Path, text: str) -> Any:
    if path.suffix != ".json":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _json_strings(data: Any, identifiers: frozenset[str], where: str = "") -> Iterator[tuple[str, str, bool]]:
    """(location, string, is a key) for every key and string value of a JSON document.

    A value's location is its field path (`values.k.statistic`), a key's its position (`key 3
    of inputs`); a key holding an identifier appears in paths by position (`#3`), never itself.
    """
    if isinstance(data, dict):
        for n, (key, value) in enumerate(data.items(), start=1):
            key = str(key)
            yield f"key {n} of {where or 'the document'}", key, True
            label = f"#{n}" if _has_identifier(key, identifiers) else key
            yield from _json_strings(value, identifiers, f"{where}.{label}" if where else label)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _json_strings(value, identifiers, f"{where}[{i}]")
    elif isinstance(data, str):
        yield where, data, False


def _grammar_findings(path: Path, values: dict, identifiers: frozenset[str]) -> list[Finding]:
    findings = []
    for n, (key, record) in enumerate(values.items(), start=1):
        if not isinstance(record, dict):
            continue
        label = f"#{n}" if _has_identifier(str(key), identifiers) else key
        for name, problem in (("statistic", statistic_problem), ("artifact", artifact_problem)):
            why = problem(record.get(name))
            if why:
                findings.append(Finding(path, f"values.{label}.{name}", GRAMMAR, f"{name} {why}"))
    return findings
