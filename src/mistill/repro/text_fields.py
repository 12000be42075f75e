"""The whitelist grammar of a numbers file's two text fields, `statistic` and `artifact`.

Numbers files go to the shareable remote and into the paper, so their text may say what a
number is and where it came from, never quote data (docs/design.md "Privacy").

* statistic: at most 320 characters of ASCII letters, digits, spaces and the punctuation in
  `STATISTIC_PUNCTUATION`, at most 60 words, and every word (a maximal run of letters,
  case ignored) from the statistic vocabulary, `statistic_words.txt`; numbers are free.
* artifact: one to 16 paths joined by ", " or " vs "; a path is segments joined by "/"
  (an optional leading "/"), each segment letters, digits and `._*@+=~-`, or a placeholder
  such as `<note>`.  No spaces inside a path, at most 400 characters in all.

A problem is described by position, never by quoting the text: the text may be a note's.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

VOCABULARY_FILE = Path(__file__).with_name("statistic_words.txt")
STATISTIC_MAX_CHARS = 320
STATISTIC_MAX_WORDS = 60
STATISTIC_PUNCTUATION = "()[]{},;:.+-/*=<>'\"%_|@~^&"
ARTIFACT_MAX_CHARS = 400
ARTIFACT_MAX_PATHS = 16

_STATISTIC_CHARS = re.compile(r"[A-Za-z0-9 " + re.escape(STATISTIC_PUNCTUATION) + r"]*")
_WORD = re.compile(r"[A-Za-z]+")
_PATH_SEPARATOR = re.compile(r", | vs ")
_SEGMENT = r"(?:<[a-z_]+>|[A-Za-z0-9._*@+=~-])+"
_PATH = re.compile(rf"/?{_SEGMENT}(?:/{_SEGMENT})*/?")


@cache
def statistic_vocabulary() -> frozenset[str]:
    """The words a statistic may use (lower-case), from `statistic_words.txt`."""
    lines = VOCABULARY_FILE.read_text(encoding="utf-8").splitlines()
    return frozenset(w for line in lines if not line.startswith("#") for w in line.split())


def statistic_words(text: str) -> list[str]:
    """The words of a statistic as the vocabulary counts them: maximal runs of letters, lower-cased."""
    return [w.lower() for w in _WORD.findall(text)]


def statistic_problem(text: object) -> str | None:
    """Why `text` is not a statistic of the grammar, or None when it is."""
    if not isinstance(text, str) or not text.strip():
        return "must be non-empty text"
    if len(text) > STATISTIC_MAX_CHARS:
        return f"is {len(text)} characters (at most {STATISTIC_MAX_CHARS})"
    if not _STATISTIC_CHARS.fullmatch(text):
        bad = next(i for i, c in enumerate(text) if not _STATISTIC_CHARS.fullmatch(c))
        return f"has a character outside the grammar at position {bad + 1}"
    words = statistic_words(text)
    if len(words) > STATISTIC_MAX_WORDS:
        return f"has {len(words)} words (at most {STATISTIC_MAX_WORDS})"
    vocabulary = statistic_vocabulary()
    unknown = [i for i, w in enumerate(words, start=1) if w not in vocabulary]
    if unknown:
        return (f"has {len(unknown)} of {len(words)} words outside the statistic vocabulary (first: word "
                f"{unknown[0]}; {VOCABULARY_FILE.name} lists the words)")
    return None


def artifact_problem(text: object) -> str | None:
    """Why `text` is not an artifact field of the grammar (paths joined by ", " or " vs "), or None."""
    if not isinstance(text, str) or not text:
        return "must be a non-empty path"
    if len(text) > ARTIFACT_MAX_CHARS:
        return f"is {len(text)} characters (at most {ARTIFACT_MAX_CHARS})"
    paths = _PATH_SEPARATOR.split(text)
    if len(paths) > ARTIFACT_MAX_PATHS:
        return f"names {len(paths)} paths (at most {ARTIFACT_MAX_PATHS})"
    for n, path in enumerate(paths, start=1):
        if not _PATH.fullmatch(path):
            return f"path {n} of {len(paths)} is not a path of artifact names (no spaces; letters, digits, ._*@+=~-)"
    return None
