"""The LAS simulator (App. K): its examples, its training, its greedy answers and LAS (the simulatability
gain) from them.

A tiny Qwen3 on a compact tokenizer stands in for Qwen3-1.7B. A simulator that memorises hand-made
examples must give back what it memorised, so LAS on those notes has a hand-computed value."""

import json

import pytest
import torch

from mistill.distill.trainer import TrainConfig
from mistill.evaluate import fidelity
from mistill.evaluate import simulator as sim
from mistill.models.architectures import TinyArchitecture, build_model
from mistill.models.loading import load_model
from mistill.models.tokenizers import CompactTokenizer, build_remap, qwen3_tokenizer
from mistill.world.inventory import Inventory, format_line
from mistill.world.prompt import build_prompt
from mistill.world.types import Code

torch.set_num_threads(1)

CODES = [Code("N18.3", "chronic kidney disease stage 3"), Code("N18.9", "chronic kidney disease unspecified"),
         Code("E11.9", "type 2 diabetes mellitus without complications"), Code("I10.0", "essential hypertension")]
INVENTORY = Inventory(CODES)
LINES = [format_line(c) for c in CODES]
NOTES = {"n1": "patient with chronic kidney disease stage unknown creatinine stable",
         "n2": "known diabetes and hypertension blood pressure controlled",
         "n3": "admitted for kidney injury resolved"}
REASONING = {"n1": "the summary documents chronic kidney disease.\nN18.3 is not documented, rejected.\n"
                   "N18.9 is documented, accepted.",
             "n2": "the summary documents diabetes.\nE11.9 is documented, accepted.\n"
                   "I10.0 is documented, accepted.",
             "n3": "the summary documents kidney injury.\nN18.3 is ruled out, rejected."}
ANSWERS = {"n1": ["N18.9"], "n2": ["E11.9", "I10.0"], "n3": []}


def _trace(note_id, valid=True):
    answer = ANSWERS[note_id]
    return {"note_id": note_id, "prompt": build_prompt(NOTES[note_id], LINES),
            "completion": f"<think>\n{REASONING[note_id]}\n</think>\n\n{json.dumps(answer)}",
            "answer": answer if valid else [], "valid": valid}


TRACES = [_trace("n1"), _trace("n2"), _trace("n3", valid=False)]


@pytest.fixture(scope="module")
def tok():
    base = qwen3_tokenizer()
    texts = [base.chat_prompt(sim.simulator_text(NOTES[n], REASONING[n]), thinking=False) + sim.answer_text(c)
             for n in NOTES for c in ANSWERS.values()] + [sim.answer_text(["N18.3"]), "[]"]
    return CompactTokenizer(base, build_remap(base, texts))


def _model(tok, seed=0):
    arch = TinyArchitecture(family="qwen3", hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=12)
    return build_model(arch, vocab_size=tok.vocab_size, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id, seed=seed, attn_implementation="sdpa")


def _config(**kw):
    return TrainConfig(**{"epochs": 1, "batch": 4, "lr": 3e-3, "warmup_frac": 0.0, "precision": "fp32", "seed": 0,
                          "gradient_checkpointing": False, "save_every": 1000, **kw})


def test_note_of_prompt_drops_the_shortlist():
    prompt = build_prompt(NOTES["n1"], LINES)
    assert sim.note_of_prompt(prompt) == NOTES["n1"]
    assert sim.note_of_prompt(build_prompt(NOTES["n1"], LINES, narrow_instruction=False)) == NOTES["n1"]
    assert "N18.3" not in sim.simulator_text(sim.note_of_prompt(prompt))
    two_paragraphs = "history of kidney disease\n\nplan follow up"
    assert sim.note_of_prompt(build_prompt(two_paragraphs, LINES)) == two_paragraphs


def test_two_examples_per_valid_trace(tok):
    examples = sim.build_examples(TRACES, tok)
    assert [(e.source, e.kind) for e in examples] == [("n1", "with_rationale"), ("n1", "note_only"),
                                                      ("n2", "with_rationale"), ("n2", "note_only")]
    for ex in examples:
        assert json.loads(ex.target) == ANSWERS[ex.source]
        assert NOTES[ex.source] in ex.user_text
        assert (REASONING[ex.source] in ex.user_text) == (ex.kind == "with_rationale")
        assert "chronic kidney disease stage 3" not in ex.user_text   # no shortlist line
        # the target tokens are the answer and the end-of-turn token, after the thinking-off prompt
        assert tok.decode(ex.ids[ex.n_prompt:-1].tolist()) == ex.target
        assert int(ex.ids[-1]) == tok.eos_token_id
        assert tok.decode(ex.ids[:ex.n_prompt].tolist()) == tok.chat_prompt(ex.user_text, thinking=False)
    assert sim.build_examples(TRACES, tok, {"n2"})[0].source == "n2"


def test_training_lowers_the_loss_and_moves_the_weights(tok, tmp_path):
    examples = sim.build_examples(TRACES, tok)
    model = _model(tok)
    before = sim.mean_target_loss(model, examples)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rows = sim.train_simulator(model, tok, examples, _config(epochs=3), tmp_path / "run")
    assert len(rows) == 3 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert sim.mean_target_loss(model, examples) < before - 0.5
    assert any(not torch.equal(weights[k], v) for k, v in model.state_dict().items())
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["examples_sha256"] == sim.examples_sha256(examples) and config["n_examples"] == 4
    reloaded, reloaded_tok = load_model(tmp_path / "run" / "model")
    assert reloaded_tok.table == tok.table
    assert sim.mean_target_loss(reloaded, examples) == pytest.approx(sim.mean_target_loss(model, examples), abs=1e-5)


def test_an_interrupted_run_resumes_to_the_same_weights(tok, tmp_path):
    examples = sim.build_examples(TRACES, tok)
    whole = _model(tok)
    sim.train_simulator(whole, tok, examples, _config(epochs=4, batch=2, save_every=1), tmp_path / "whole")
    parted = _model(tok)
    assert len(sim.train_simulator(parted, tok, examples, _config(epochs=4, batch=2, save_every=1), tmp_path / "parted",
                                   max_steps=3)) == 3
    resumed = _model(tok)   # a new process: the base weights again, then the checkpoint
    assert len(sim.train_simulator(resumed, tok, examples, _config(epochs=4, batch=2, save_every=1),
                                   tmp_path / "parted")) == 5
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_greedy_answers_do_not_depend_on_the_batch(tok):
    model = _model(tok, seed=3)
    texts = [sim.simulator_text(NOTES[n], r) for n in NOTES for r in (REASONING[n], None)]
    alone = [sim.greedy_answers(model, tok, [t], max_new_tokens=8)[0] for t in texts]
    assert sim.greedy_answers(model, tok, texts, max_new_tokens=8, batch_size=4) == alone


def test_simulator_text_of_each_input():
    """App. K's two inputs as they always were; the rationale-only input keeps everything but the note."""
    from mistill.world.prompt import NOTE_HEADER

    note, rationale = NOTES["n1"], REASONING["n1"]
    assert sim.simulator_text(note, rationale) == (f"{NOTE_HEADER}\n\n{note}\n\n<think>\n{rationale}\n</think>\n\n"
                                                   f"{sim.SIM_INSTRUCTION}")
    assert sim.simulator_text(note) == f"{NOTE_HEADER}\n\n{note}\n\n{sim.SIM_INSTRUCTION}"
    alone = sim.simulator_text(None, rationale)
    assert alone == f"{NOTE_HEADER}\n\n<think>\n{rationale}\n</think>\n\n{sim.SIM_INSTRUCTION}"
    assert alone == sim.simulator_text(note, rationale).replace(f"{note}\n\n", "")


def test_the_rationale_only_input_leaves_app_k_answers_as_they_were(tok):
    """The rationale-only texts are answered in a call of their own: App. K's two inputs are batched as
    before, so their answers are those of the two-input call, and the third input is the rationale alone."""
    model = _model(tok, seed=1)
    rows = sim.predict(model, tok, TRACES, INVENTORY, max_new_tokens=6, batch_size=2, keep_text=True)
    texts = [sim.simulator_text(NOTES[n], REASONING[n]) for n in NOTES] + [sim.simulator_text(NOTES[n]) for n in NOTES]
    two_inputs = sim.greedy_answers(model, tok, texts, max_new_tokens=6, batch_size=2)
    assert [r["with_rationale_text"] for r in rows] + [r["note_only_text"] for r in rows] == two_inputs
    alone = sim.greedy_answers(model, tok, [sim.simulator_text(None, REASONING[n]) for n in NOTES],
                               max_new_tokens=6, batch_size=2)
    assert [r["rationale_only_text"] for r in rows] == alone


def test_parse_codes_is_app_k_rule():
    assert sim.parse_codes('["n18.9", "N189", "X99.9", 3, "E11.9"]', INVENTORY) == ["N18.9", "E11.9"]
    assert sim.parse_codes('["N18.9"] then ["I10.0"]', INVENTORY) == ["I10.0"]
    assert sim.parse_codes('["N18.9", "N18', INVENTORY) == []
    assert sim.parse_codes('["a", "a", "b"]') == ["a", "b"]


def test_predict_rows_feed_las(tok):
    rows = sim.predict(_model(tok, seed=1), tok, TRACES, INVENTORY, max_new_tokens=6, batch_size=2, keep_text=True)
    assert [r["note_id"] for r in rows] == ["n1", "n2", "n3"]
    for r in rows:
        assert set(r) == {"note_id", "with_rationale", "note_only", "rationale_only", "with_rationale_text",
                          "note_only_text", "rationale_only_text"}
        assert all(c in INVENTORY for c in r["with_rationale"] + r["note_only"] + r["rationale_only"])
    values = fidelity.simulatability_gain_per_note([r["with_rationale"] for r in rows], [r["note_only"] for r in rows],
                                   [ANSWERS[r["note_id"]] for r in rows])
    assert len(values) == 3 and all(-1.0 <= v <= 1.0 for v in values)


def test_memorised_simulator_gives_hand_computed_las(tok, tmp_path):
    """A simulator that reads the answer only from the rationale: trained on (note ⊕ r -> a_T) and
    (note -> a guess), it answers a_T with the rationale and the guess without, so per note
    LAS = F1(a_T, a_T) - F1(guess, a_T): n1 1 - 0 = 1, n2 1 - 2/3 = 1/3; the mean 2/3."""
    guesses = {"n1": ["N18.3"], "n2": ["E11.9"]}
    examples = []
    for n in ("n1", "n2"):
        examples.append(sim.make_example(tok, n, sim.WITH_RATIONALE, sim.simulator_text(NOTES[n], REASONING[n]),
                                         sim.answer_text(ANSWERS[n])))
        examples.append(sim.make_example(tok, n, sim.NOTE_ONLY, sim.simulator_text(NOTES[n]),
                                         sim.answer_text(guesses[n])))
    model = _model(tok, seed=0)
    rows = sim.train_simulator(model, tok, examples, _config(epochs=100, lr=2e-2), tmp_path / "run")
    assert rows[-1]["loss"] < 0.05
    preds = sim.predict(model, tok, TRACES[:2], INVENTORY, max_new_tokens=16)
    assert [p["with_rationale"] for p in preds] == [ANSWERS["n1"], ANSWERS["n2"]]
    assert [p["note_only"] for p in preds] == [guesses["n1"], guesses["n2"]]
    values = fidelity.simulatability_gain_per_note([p["with_rationale"] for p in preds], [p["note_only"] for p in preds],
                                   [ANSWERS["n1"], ANSWERS["n2"]])
    assert values == pytest.approx([1.0, 1 / 3])
    assert fidelity.simulatability_gain([p["with_rationale"] for p in preds], [p["note_only"] for p in preds],
                        [ANSWERS["n1"], ANSWERS["n2"]]) == pytest.approx(2 / 3)


def test_simulator_trained_on_traces_returns_the_teachers_answers(tok, tmp_path):
    """The protocol's own examples, memorised: both inputs give a_T back, so LAS is 0 on each note."""
    model = _model(tok, seed=0)
    rows = sim.train_simulator(model, tok, sim.build_examples(TRACES, tok), _config(epochs=60, lr=1e-2),
                               tmp_path / "run")
    assert rows[-1]["loss"] < 0.05
    preds = sim.predict(model, tok, TRACES[:2], INVENTORY, max_new_tokens=16)
    for p in preds:
        assert p["with_rationale"] == p["note_only"] == ANSWERS[p["note_id"]]
    assert fidelity.simulatability_gain_per_note([p["with_rationale"] for p in preds], [p["note_only"] for p in preds],
                                 [ANSWERS[p["note_id"]] for p in preds]) == [0.0, 0.0]


def test_cli_group_parses():
    from mistill.cli import build_parser

    args = build_parser("simulator").parse_args(["simulator", "predict", "--simulator", "s", "--generations", "g",
                                                  "--out", "o.jsonl"])
    assert args.func.__name__ == "cmd_predict" and args.max_new_tokens is None
