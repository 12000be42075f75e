"""The ICD-10-CM hierarchy the corpus rules and the inventory read.

`simple_icd_10_cm` ships the CMS tabular list offline.  Its ancestors of a code
run code -> ... -> category -> block(s) -> chapter; the *block* used by App. A's
coverage rule is the innermost block above the three-character category (e.g.
N18.9 -> N17-N19), the *ICD-10-CM chapter* is the numbered chapter ("14").
These differ from the paper's "chapter" (a code's first letter, `Code.chapter`).
"""

from __future__ import annotations

import functools
import importlib


@functools.cache
def _tabular():
    """The package, imported on first use: it parses its XML tabular list at import (about 2 s),
    which every command that only reads a built inventory would otherwise pay."""
    return importlib.import_module("simple_icd_10_cm")


def normalise_code(code: str) -> str:
    """Dotted upper-case form: "n189", "N18.9", " n18.9 " -> "N18.9"; "I10" stays "I10"."""
    bare = code.strip().upper().replace(".", "").replace(" ", "")
    return bare if len(bare) <= 3 else f"{bare[:3]}.{bare[3:]}"


def is_known(code: str) -> bool:
    return _tabular().is_valid_item(code)


def is_billable(code: str) -> bool:
    """A billable ICD-10-CM code is a leaf of the tabular list."""
    return _tabular().is_valid_item(code) and _tabular().is_leaf(code)


def description(code: str) -> str:
    return _tabular().get_description(code)


@functools.cache
def block(code: str) -> str:
    """The innermost ICD-10 block containing the code's category ("N17-N19").

    A code the package does not know (a newer or retired release) falls back to
    its three-character category, so it still counts as one coverage unit.
    """
    category = normalise_code(code)[:3]
    if not _tabular().is_valid_item(category):
        return category
    for ancestor in _tabular().get_ancestors(category):
        if _tabular().is_block(ancestor):
            return ancestor
    return category


@functools.cache
def chapter(code: str) -> str:
    """The numbered ICD-10-CM chapter ("14"), or "?" for a code the package does not know."""
    category = normalise_code(code)[:3]
    if not _tabular().is_valid_item(category):
        return "?"
    return _tabular().get_ancestors(category)[-1]


def categories() -> list[str]:
    """Every three-character category of the tabular list, in ICD order."""
    return [c for c in _tabular().get_all_codes(with_dots=True) if _tabular().is_category(c)]


def billable_leaves(category: str) -> list[str]:
    """The billable codes under a category, in ICD order (a billable category is its own leaf)."""
    if _tabular().is_leaf(category):
        return [category]
    return [d for d in _tabular().get_descendants(category) if _tabular().is_leaf(d)]
