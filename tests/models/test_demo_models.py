"""The committed demo models: they load, share tables as designed, and cover the demo corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from mistill.models.loading import ModelSpec, load_model
from mistill.models.scripted_traces import script_trace
from mistill.models.tokenizers import UNK_ID
from mistill.params import load_params
from mistill.world.prompt import build_prompt

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
pytestmark = pytest.mark.skipif(not (DEMO / "teacher" / "model.safetensors").exists(), reason="no demo weights")


@pytest.fixture(scope="module")
def world():
    """The demo inventory and note pool, from `mistill world` artifacts or rebuilt from params."""
    from mistill.world.demo_notes import NoteGeneratorConfig, generate_notes
    from mistill.world.inventory import demo_inventory, load_inventory
    from mistill.world.notes import load_notes

    params = load_params(ROOT / "params.yaml", profile="demo")
    data = ROOT / params["paths"]["artifacts"] / "data"
    if (data / "notes.jsonl").exists():
        inventory = load_inventory(data / "inventory.jsonl")
        return inventory, load_notes(data / "notes.jsonl")
    cfg = params["world"]
    inv = cfg["inventory"]
    inventory = demo_inventory(int(inv["target_codes"]), int(params["seeds"]["inventory_shuffle"]),
                               min_leaves=inv["min_leaves"], max_leaves=inv["max_leaves"],
                               max_description_words=inv["max_description_words"])
    return inventory, generate_notes(inventory, NoteGeneratorConfig.from_params(cfg["notes"]), cfg["notes"]["seed"])


def test_demo_models_load():
    teacher, t_tok = load_model(DEMO / "teacher")
    student, s_tok = load_model(DEMO / "student-qwen")
    smol, m_tok = load_model(DEMO / "student-smol")
    assert type(teacher).__name__ == type(student).__name__ == "Qwen3ForCausalLM"
    assert type(smol).__name__ == "SmolLM3ForCausalLM"
    assert teacher.config.num_hidden_layers >= 4 and teacher.config.num_attention_heads == 8
    assert student.num_parameters() < teacher.num_parameters()
    # same family, same ids: teacher and same-family student pair token for token
    assert s_tok.table == t_tok.table
    assert m_tok.family == "smollm3" and m_tok.encode(" N18.9").ids != t_tok.encode(" N18.9").ids


def test_the_second_teacher_is_another_family_over_the_first_teachers_table():
    """R-C15: a Qwen2 (QwQ-32B's family) half again as deep as the Qwen3 teacher, over the same compact table,
    so its traces' tokens are the first teacher's."""
    teacher, t_tok = load_model(DEMO / "teacher")
    second, q_tok = load_model(DEMO / "teacher-qwq")
    assert type(second).__name__ == "Qwen2ForCausalLM"
    assert second.config.num_hidden_layers == 6 and teacher.config.num_hidden_layers == 4
    assert second.config.num_attention_heads == teacher.config.num_attention_heads
    assert q_tok.table == t_tok.table


def test_demo_corpus_never_hits_unk(world):
    """Every text the demo can show a model (inventory, notes cut or not, prompts, scripted traces)
    tokenizes without the unknown id, for each demo model's table."""
    from mistill.world.corpora import cut_discharge_diagnosis

    inventory, notes = world
    lines = inventory.lines()
    texts = ["\n".join(lines)]
    for note in notes:
        texts.append(note.text)
        texts.append(cut_discharge_diagnosis(note.text)[0])
        texts.append(script_trace(note, list(inventory)).completion)
    texts.append(build_prompt(notes[0], lines))
    texts.append(build_prompt(notes[0], lines, narrow_instruction=False))
    for name in ("teacher", "teacher-qwq", "student-qwen", "student-smol"):
        _, tok = load_model(DEMO / name)
        texts_here = texts + [tok.chat_prompt(texts[-1])]
        hits = [t[:60] for t in texts_here if UNK_ID in tok.encode(t).ids]
        assert not hits, f"{name}: unknown tokens in {hits[:3]}"


@pytest.mark.slow
def test_teacher_writes_a_valid_trace(world):
    from mistill.models.generation import generate
    from mistill.world.answers import parse_answer
    from mistill.world.corpora import cut_discharge_diagnosis

    inventory, notes = world
    note = next(n for n in notes if n.split == "test")
    text = cut_discharge_diagnosis(note.text)[0]
    spec = ModelSpec(source=str(DEMO / "teacher"), attn_implementation="sdpa")
    gen = generate(spec, [build_prompt(text, inventory.lines())], seeds=[0], max_new_tokens=1024)[0]
    parsed = parse_answer(gen.completion, inventory, hit_cap=gen.hit_cap)
    assert gen.completion.startswith("<think>\n") and parsed.valid
    assert set(parsed.answer) & set(note.gold_codes)
