"""The evidence-flip test, causal half (App. N.4-N.5, Table 55; R-D34): the nominated heads' direct reads of
the evidence cut while the model writes.

Under the HF generation path (`mistill.models.sampling.sample_rows`) the prompt is prefilled clean and, at
every decoding step, a key mask (`mistill.instrument.keymask.decode_key_mask`) removes the nominated heads'
access to

* target: the evidence tokens of the condition's note (A's words in the original, B's in the flip), or
* sham:   as many tokens of the same note where no evidence is, a contiguous run drawn per (case, condition),

with the same seeds as the behavioural half.  Evidence already propagated into other cached positions during
the prefill stays readable: the test covers the nominated heads' direct reading route only.  Per case,

    Delta D = D_clean - D_masked,     target minus sham = Delta D_target - Delta D_sham = D_sham - D_target,

and the training-benefit interaction on the students' own top-k is L = G_sham - G_target with
G = D_Mistill - D_Vanilla.  A mask that is empty on a side (no evidence token) equals the clean run there by
construction; such cases, and cases whose sham and target differ in length, make the sensitivity subset.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

MASKS = ("clean", "sham", "target")


@dataclass(frozen=True)
class RowKeys:
    """One prompt's key positions (token indices into its chat prompt) for the two masks."""

    target: tuple[int, ...]
    sham: tuple[int, ...]


def token_spans(offsets: Sequence[tuple[int, int]], spans: Sequence[Sequence[int]], at: int) -> list[int]:
    """Indices of the tokens overlapping any [start, end) character span (spans relative to `at`)."""
    shifted = [(at + s, at + e) for s, e in spans]
    return [i for i, (s, e) in enumerate(offsets) if e > s and any(s < b and a < e for a, b in shifted)]


def sham_tokens(offsets: Sequence[tuple[int, int]], note_span: tuple[int, int], target: Sequence[int],
                n: int, rng: random.Random) -> list[int]:
    """`n` tokens of the note outside the target: a contiguous run with a seeded start where one exists,
    else the first `n` such tokens."""
    if n == 0:
        return []
    start, end = note_span
    banned = set(target)
    free = [i for i, (s, e) in enumerate(offsets) if start <= s and e <= end and e > s and i not in banned]
    runs = [j for j in range(len(free) - n + 1) if free[j + n - 1] - free[j] == n - 1]
    if runs:
        j = rng.choice(runs)
        return free[j:j + n]
    return free[:n]


def row_keys(tokenizer, prompt: str, note_text: str, evidence: Sequence[Sequence[int]], seed_key: str) -> RowKeys:
    """Target and sham key positions of one (case, condition) prompt."""
    chat = tokenizer.chat_prompt(prompt)
    at = chat.find(note_text)
    if at < 0:
        raise ValueError("the note's text is not in its prompt")
    offsets = [tuple(o) for o in tokenizer.encode(chat).offsets]
    target = token_spans(offsets, evidence, at)
    sham = sham_tokens(offsets, (at, at + len(note_text)), target, len(target), random.Random(seed_key))
    return RowKeys(tuple(target), tuple(sham))


def nominated_heads(spec: dict, params: dict, n_layers: int, n_heads: int, where: str) -> tuple[tuple[int, int], ...]:
    """The set's heads: "named" (params readers.named_heads.contrastive_readers, the first two) or the top-k
    of a head_sets_contrast.json at params evidence_flip.causal.phase."""
    from mistill.errors import UserError
    from mistill.instrument.global_sets import load_head_sets
    from mistill.instrument.readout import head_index, reader_settings

    if spec["heads"] == "named":
        names = reader_settings(params).named_heads.contrastive_readers[:2]
        if len(names) < 2:
            raise UserError(f"{where}: heads 'named' needs two readers.named_heads.contrastive_readers")
        return tuple(divmod(head_index(name, n_layers, n_heads), n_heads) for name in names)
    body = load_head_sets(spec["heads"])
    phase = params["evidence_flip"]["causal"]["phase"]
    return tuple((int(r["layer"]), int(r["head"])) for r in body["phases"][phase][:int(spec["k"])])
