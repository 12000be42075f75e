"""The inventory: the assignable ICD-10-CM diagnosis codes in one shared order.

App. A ("The full inventory in context"): one line per code with its
description, in a single order shuffled once with a fixed seed and shared by
every note, so the block is a cacheable prefix and ICD order is no positional
cue.  A shortlist keeps that order, filtered (METHOD-GUIDE §2, recommended
reading: listing codes in retrieval-rank order would leak the ranking).

The line format is frozen: ``"<dotted code> <description>"`` with the
description lower-cased and unpunctuated like the notes, e.g.
``"N18.9 chronic kidney disease unspecified"``.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from mistill.errors import UserError
from mistill.io import iter_json_lines, write_jsonl
from mistill.world import icd
from mistill.world.text import clean_text
from mistill.world.types import Code

LINE_FORMAT = "{code} {description}"


def format_line(code: Code) -> str:
    return LINE_FORMAT.format(code=code.code, description=code.description)


class Inventory:
    """Codes in the shared order, with lookup by code, siblings and chapter letters."""

    def __init__(self, codes: Iterable[Code]):
        self._codes: tuple[Code, ...] = tuple(codes)
        self._by_code: dict[str, Code] = {}
        self._position: dict[str, int] = {}
        self._by_category: dict[str, list[str]] = {}
        for position, code in enumerate(self._codes):
            if code.code in self._by_code:
                raise UserError(f"inventory: duplicate code {code.code}")
            self._by_code[code.code] = code
            self._position[code.code] = position
            self._by_category.setdefault(code.category, []).append(code.code)

    # -- the sequence, in the shared order
    def __len__(self) -> int:
        return len(self._codes)

    def __iter__(self) -> Iterator[Code]:
        return iter(self._codes)

    def __contains__(self, code: object) -> bool:
        return isinstance(code, str) and code in self._by_code

    def __getitem__(self, code: str) -> Code:
        try:
            return self._by_code[code]
        except KeyError:
            raise KeyError(f"{code} is not in the inventory") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Inventory) and self._codes == other._codes

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(c.code for c in self._codes)

    def position(self, code: str) -> int:
        """The code's line index in the shared order."""
        return self._position[code]

    def lookup(self, code: str) -> Code | None:
        """The inventory entry for a code written in any case, with or without its dot."""
        return self._by_code.get(icd.normalise_code(code))

    # -- structure
    def categories(self) -> dict[str, tuple[str, ...]]:
        """Three-character category -> its codes in the shared order."""
        return {cat: tuple(codes) for cat, codes in self._by_category.items()}

    def siblings(self, code: str) -> tuple[str, ...]:
        """The other inventory codes of the code's three-character category, in the shared order."""
        category = self[code].category
        return tuple(c for c in self._by_category[category] if c != code)

    def chapter_letters(self) -> tuple[str, ...]:
        """App. A: a "chapter" is a code's first character; the letters the inventory uses, sorted."""
        return tuple(sorted({c.chapter for c in self._codes}))

    def region(self, letter: str) -> tuple[str, ...]:
        """App. A: the region of a chapter letter is the inventory lines sharing it, in the shared order."""
        return tuple(c.code for c in self._codes if c.chapter == letter)

    # -- prompt lines
    def lines(self) -> list[str]:
        """One frozen-format line per code, in the shared order."""
        return [format_line(c) for c in self._codes]

    def restrict(self, codes: Iterable[str]) -> Inventory:
        """The sub-inventory of `codes` in the shared order (a shortlist); unknown codes are an error."""
        wanted = set(codes)
        unknown = sorted(wanted - self._by_code.keys())
        if unknown:
            raise UserError(f"restrict: codes not in the inventory: {', '.join(unknown[:5])}")
        return Inventory(c for c in self._codes if c.code in wanted)

    def to_rows(self) -> list[dict[str, str]]:
        return [{"code": c.code, "description": c.description} for c in self._codes]


def shared_order(codes: Sequence[Code], seed: int) -> list[Code]:
    """App. A: the one fixed-seed shuffle; input order does not matter (codes are sorted first)."""
    ordered = sorted(codes, key=lambda c: c.code)
    random.Random(seed).shuffle(ordered)
    return ordered


def demo_inventory(
    target_codes: int,
    seed: int,
    *,
    min_leaves: int = 2,
    max_leaves: int = 8,
    max_description_words: int = 8,
) -> Inventory:
    """A few hundred real billable ICD-10-CM codes, whole categories, many chapters.

    Eligible categories have `min_leaves`..`max_leaves` billable codes whose
    descriptions have at most `max_description_words` words (short lines keep
    the demo prompt small).  Categories are drawn round-robin over ICD-10-CM
    chapters, preferring blocks not yet drawn, in a seeded order, until the
    inventory holds at least `target_codes` codes.  Whole categories are kept so
    every code has siblings (the near-misses of P2C events).
    """
    if target_codes < 1:
        raise UserError(f"demo inventory: target_codes must be positive, got {target_codes}")
    by_chapter: dict[str, list[tuple[str, list[str]]]] = {}
    for category in icd.categories():
        leaves = icd.billable_leaves(category)
        if not min_leaves <= len(leaves) <= max_leaves:
            continue
        if any(len(clean_text(icd.description(leaf)).split()) > max_description_words for leaf in leaves):
            continue
        by_chapter.setdefault(icd.chapter(category), []).append((category, leaves))
    rng = random.Random(seed)
    queues = []
    for chapter in sorted(by_chapter, key=lambda ch: (len(ch), ch)):
        candidates = by_chapter[chapter]
        rng.shuffle(candidates)
        queues.append(candidates)
    chosen: list[str] = []
    used_blocks: set[str] = set()
    while len(chosen) < target_codes and any(queues):
        for queue in queues:
            if not queue or len(chosen) >= target_codes:
                continue
            # prefer a category from a block not drawn yet, so blocks spread too
            pick = next((i for i, (cat, _) in enumerate(queue) if icd.block(cat) not in used_blocks), 0)
            category, leaves = queue.pop(pick)
            used_blocks.add(icd.block(category))
            chosen.extend(leaves)
    codes = [Code(code, clean_text(icd.description(code))) for code in chosen]
    return Inventory(shared_order(codes, seed))


def write_inventory(path: str | Path, inventory: Inventory) -> None:
    write_jsonl(path, inventory.to_rows())


def load_inventory(path: str | Path) -> Inventory:
    """Read `inventory.jsonl` (one {"code", "description"} per line, in the shared order).

    Raises UserError naming the file and line on a malformed line, a code not in
    dotted upper-case form, an empty description or a duplicate code.
    """
    codes: list[Code] = []
    seen: set[str] = set()
    for where, row in iter_json_lines(path, "inventory"):
        if not isinstance(row, dict) or not isinstance(row.get("code"), str) \
                or not isinstance(row.get("description"), str):
            raise UserError(f"{where}: expected {{\"code\": str, \"description\": str}}")
        code, description = row["code"], row["description"].strip()
        if not code or icd.normalise_code(code) != code:
            raise UserError(f"{where}: code {code!r} is not in dotted upper-case form")
        if not description:
            raise UserError(f"{where}: code {code} has an empty description")
        if code in seen:
            raise UserError(f"{where}: duplicate code {code}")
        seen.add(code)
        codes.append(Code(code, description))
    if not codes:
        raise UserError(f"{path}: empty inventory")
    return Inventory(codes)
