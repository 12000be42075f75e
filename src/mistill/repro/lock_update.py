"""DVC's lock update, one stage's lines at a time.

After every stage it runs, DVC records the stage in its `dvc.lock` (`Lockfile.dump_stages`): it parses
the whole lock with ruamel's round-trip loader, replaces the stage's entry and dumps the whole file
again.  On two cores that is about 2 s a stage for this repository's 0.3-0.5 MB locks, most of the time
`dvc repro` spends between two stages (treeverse/dvc#10629; docs/speed.md "Where the time goes").

`dump_stages` here writes what that writes, without the round trip.  Every entry the round trip does
not touch comes back out as it went in, so its lines are kept as they are; the stage's entry is the
one `dvc.stage.serialize.to_lockfile` gives, dumped with DVC's own YAML settings at the column it sits
at (under `stages:`), and takes the place of the old entry's lines, or follows the last entry.  The
one difference: values an entry repeats (a params alias) are written out in full, where the round
trip would write YAML anchors numbered across the whole file.  A lock whose layout is not the one
DVC writes (no `stages:` section) goes to DVC's own method.

`python -m mistill.repro.dvc_run ARGS` is `dvc ARGS` with this update in place (`nox -s repro` runs its
`dvc repro` so); a plain `dvc` is unchanged.  `tests/repro/test_lock_update.py` checks the result against
DVC's own update on every committed lock.
"""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import Sequence

from dvc.dvcfile import Lockfile
from dvc.stage import serialize
from dvc.utils.serialize._yaml import _get_yaml

from mistill.io import atomic_open

DVC_DUMP_STAGES = Lockfile.dump_stages   # DVC's own, for a lock of another layout
logger = logging.getLogger("dvc.dvcfile")   # DVC's own logger: `dvc repro` prints the same lines

STAGES_KEY = "stages:\n"
# the first line after an entry: another entry's key (two spaces, then a name) or a top-level key
_NEXT_ENTRY = re.compile(r"^(?:  )?\S")


def unshared(value):
    """A copy in which no dict or list appears twice (`copy.deepcopy` keeps such sharing, which YAML writes as
    an anchor and its aliases)."""
    if isinstance(value, dict):
        return type(value)((k, unshared(v)) for k, v in value.items())
    if isinstance(value, list):
        return [unshared(v) for v in value]
    return value


def entry_lines(stage_data: dict) -> list[str]:
    """The lines of `{name: entry}` as DVC dumps them under `stages:` (two spaces in, DVC's YAML settings),
    repeated values written out in full."""
    out = io.StringIO()
    _get_yaml().dump({"stages": unshared(stage_data)}, out)
    lines = out.getvalue().splitlines(keepends=True)
    if lines[0] != STAGES_KEY:
        raise ValueError(f"unexpected dump of a lock entry: {lines[0]!r}")
    return lines[1:]


def entry_span(lines: Sequence[str], key_line: str) -> tuple[int, int] | None:
    """[start, end) of the entry whose key line is `key_line` in a lock's lines; None if it has none."""
    try:
        start = lines.index(key_line, lines.index(STAGES_KEY) + 1)
    except ValueError:
        return None
    end = start + 1
    while end < len(lines) and not _NEXT_ENTRY.match(lines[end]):
        end += 1
    return start, end


def stages_end(lines: Sequence[str]) -> int:
    """Where a new entry goes: after the last line of the `stages:` section."""
    end = lines.index(STAGES_KEY) + 1
    while end < len(lines) and not re.match(r"^\S", lines[end]):
        end += 1
    return end


def updated_lines(lines: list[str], stage_data: dict) -> tuple[list[str], bool]:
    """The lock's lines with each stage of `stage_data` ({name: entry}) recorded, and whether any changed."""
    changed = False
    for name, entry in stage_data.items():
        new = entry_lines({name: entry})
        span = entry_span(lines, new[0])
        if span is None:
            at = stages_end(lines)
            lines[at:at] = new
            changed = True
        elif lines[span[0]:span[1]] != new:
            lines[span[0]:span[1]] = new
            changed = True
    return lines, changed


def dump_stages(self, stages, **kwargs) -> None:
    """`dvc.dvcfile.Lockfile.dump_stages`, rewriting only the stages' own lines."""
    if not stages:
        return
    text = None
    if os.path.exists(self.path):
        with open(self.path, encoding="utf-8") as fh:
            text = fh.read()
    if not text or STAGES_KEY not in text.splitlines(keepends=True):
        return DVC_DUMP_STAGES(self, stages, **kwargs)
    lines = text.splitlines(keepends=True)
    if not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    changed = False
    for stage in stages:
        lines, stage_changed = updated_lines(lines, serialize.to_lockfile(stage, **kwargs))
        changed |= stage_changed
    if not changed:
        return
    logger.info("Updating lock file '%s'", self.relpath)
    with atomic_open(self.path, "w", encoding="utf-8") as fh:
        fh.write("".join(lines))
    self.repo.scm_context.track_file(self.relpath)


def install() -> None:
    """Put `dump_stages` in place of DVC's for this process."""
    Lockfile.dump_stages = dump_stages
