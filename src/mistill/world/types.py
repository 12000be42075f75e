"""The records every layer passes around: inventory codes and notes.

Codes are always written in the dotted form the teacher emits (`N18.9`); the
MIMIC-IV loader normalises undotted codes on the way in.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Code:
    code: str  # dotted, e.g. "N18.9"
    description: str

    @property
    def chapter(self) -> str:
        """App. B: "chapter" means the code's first character."""
        return self.code[0]

    @property
    def category(self) -> str:
        """The three-character category; codes sharing it are siblings."""
        return self.code[:3]


@dataclass(frozen=True)
class Note:
    note_id: str
    patient_id: str
    text: str  # lower-cased, unpunctuated, as the paper's preprocessed text
    gold_codes: tuple[str, ...]
    split: str = "test"
    meta: dict = field(default_factory=dict, compare=False, hash=False)
