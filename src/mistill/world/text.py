"""Text normalisation shared by descriptions, notes and answers.

App. A: the MIMIC-IV release of Edin et al. (2023) is lower-cased and stripped
of punctuation; inventory descriptions and synthetic notes are normalised the
same way so that a note's words and a code's line use one vocabulary.
"""

from __future__ import annotations

import re

_NON_WORD = re.compile(r"[^a-z0-9]+")


def clean_text(text: str) -> str:
    """Lower-case, replace every run of non-alphanumeric characters by one space, strip."""
    return _NON_WORD.sub(" ", text.lower()).strip()


def word_count(text: str) -> int:
    """App. A [recommended reading]: words are whitespace tokens of the preprocessed text."""
    return len(text.split())
