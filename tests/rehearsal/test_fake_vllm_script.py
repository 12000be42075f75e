"""The fake vLLM's scripted mode (the rehearsal's teacher): plausible traces from App. B's prompt."""

from __future__ import annotations

import json
import sys

import pytest

from mistill.models.architectures import TinyArchitecture, build_model
from mistill.models.decoding import Decoding
from mistill.models.tokenizers import CompactTokenizer, base_tokenizer, build_remap
from mistill.models.vllm_backend import EngineSettings, VLLMGenerator
from mistill.rehearsal.build import ARCHITECTURES, SCRIPT_ENV, covered_texts
from mistill.world.inventory import Inventory, format_line
from mistill.world.prompt import build_prompt
from mistill.world.types import Code, Note
from tests.models.conftest import FAKES

CODES = [Code("N18.3", "chronic kidney disease stage 3"), Code("N18.4", "chronic kidney disease stage 4"),
         Code("E11.9", "type 2 diabetes mellitus without complications"), Code("I10", "essential hypertension")]
NOTES = [Note("a", "p1", "history of chronic kidney disease stage 3 and essential hypertension "
                        "no evidence of chronic kidney disease stage 4", ("N18.3", "I10")),
         Note("b", "p2", "type 2 diabetes mellitus without complications was managed medically", ("E11.9",))]
DECODING = Decoding(max_new_tokens=200)


@pytest.fixture
def scripted(tmp_path, monkeypatch):
    """A tiny Qwen3 checkpoint whose table covers the notes and their traces, the script, the fake on the path."""
    inventory = Inventory(CODES)
    base = base_tokenizer("qwen3")
    tokenizer = CompactTokenizer(base, build_remap(base, covered_texts(inventory, NOTES) + [base.chat_prompt("")]))
    arch = TinyArchitecture.from_params(ARCHITECTURES["student_qwen"])
    model = build_model(arch, vocab_size=tokenizer.vocab_size, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id, seed=0)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save(tmp_path / "model")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"keep": 1.0, "notes": [{"text": n.text, "gold": list(n.gold_codes)}
                                                          for n in NOTES]}))
    monkeypatch.setenv(SCRIPT_ENV, str(script))
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    yield tmp_path / "model", [build_prompt(n, [format_line(c) for c in CODES]) for n in NOTES]
    sys.modules.pop("vllm", None)


def test_a_scripted_trace_names_the_notes_codes_and_the_rejected_sibling(scripted):
    model, prompts = scripted
    first, second = VLLMGenerator(str(model), EngineSettings()).generate(prompts, [0, 0], DECODING)
    assert not first.hit_cap and first.completion.endswith('["N18.3", "I10"]')
    assert "N18.4 chronic kidney disease stage 4 is ruled out in the summary, rejected." in first.completion
    assert first.completion.index("N18.4") < first.completion.index("N18.3")   # the near-miss is named first
    assert second.completion.endswith('["E11.9"]')


def test_the_cap_and_the_seed_apply_to_scripted_traces(scripted, monkeypatch, tmp_path):
    model, prompts = scripted
    capped, = VLLMGenerator(str(model), EngineSettings()).generate(prompts[:1], [0], Decoding(max_new_tokens=5))
    assert capped.hit_cap and capped.n_new_tokens == 5
    script = json.loads((tmp_path / "script.json").read_text())
    (tmp_path / "script.json").write_text(json.dumps({**script, "keep": 0.5}))
    answers = {g.completion.rsplit("\n", 1)[-1]
               for g in VLLMGenerator(str(model), EngineSettings()).generate(prompts * 8, list(range(16)), DECODING)}
    assert len(answers) > 1   # each gold code kept with probability 0.5 under the request's seed
