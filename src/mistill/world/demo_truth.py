"""What the demo note generator wrote, read back: the ground truth its human-in-the-loop stand-ins use.

The demo's audit labels (App. C) and authored evidence flips (App. N) come from the generator instead of a
person.  These functions answer, from a note's text, what the generator knows it put there
(`mistill.world.demo_notes`): which descriptions it wrote as ruled-out alternatives, and every wording its
paraphrase table can give a description.  They live apart from the generator so that reading its output
never changes the generator's own file (and with it every stage that depends on it).
"""

from __future__ import annotations

import itertools

from mistill.world.demo_notes import _SYNONYM_RE, COURSE_RULED_OUT, SYNONYMS


def rules_out(text: str, description: str) -> bool:
    """Whether the generator wrote `description` into the note as a ruled-out alternative."""
    return any(template.format(d=description) in text for template in COURSE_RULED_OUT)


def description_variants(description: str, limit: int = 512) -> list[str]:
    """Every way `demo_notes.paraphrase` can write `description` (the description itself first), up to `limit`."""
    parts, last = [], 0
    for match in _SYNONYM_RE.finditer(description):
        parts += [(description[last:match.start()],), (match.group(0), *SYNONYMS[match.group(0)])]
        last = match.end()
    parts.append((description[last:],))
    return ["".join(choice) for choice in itertools.islice(itertools.product(*parts), limit)]
