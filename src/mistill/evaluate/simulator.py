"""The learned answer simulator of LAS (App. K, "Fidelity").

One simulator (Qwen3-1.7B without thinking in the paper; params `simulator.model`) is
fine-tuned once on the teacher's training traces to predict the teacher's final answer a_T from
two inputs, mixed at equal weight:

    sim(note ⊕ r)   the discharge summary, then r = the text inside the teacher's reasoning block
    sim(note)       the discharge summary alone

and then answers both for every arm's test generation, r being that arm's reasoning block. Per note
App. K's LAS is the simulatability gain

    gain = F1(sim(note ⊕ r), a_T) - F1(sim(note), a_T)

(`mistill.evaluate.fidelity.simulatability_gain_per_note`). The simulator also answers from r alone,
sim(r), the input of Hase et al.'s leakage test (`mistill.evaluate.leakage_adjusted`): an input it
was not trained on. The simulator never sees the shortlist (App. K: it would add 30k tokens), so its
input is the note cut out of the App. B prompt, not the prompt.

* Input: one user turn of the simulator's chat template with thinking off; r sits in the turn
  between `<think>` tags, before the instruction. Target: a_T as a JSON list string, then the
  end-of-turn token. The loss is the mean cross-entropy over the target tokens of one example;
  each example weighs the same (the trainer averages examples), so the two inputs of a note weigh
  the same.
* Training: the shared trainer (`mistill.distill.trainer`: AdamW, warm-up then cosine, clipping,
  an epoch order fixed by (seed, epoch), resumable checkpoints) with this loss.
* Prediction: greedy decoding, capped (the answers are short lists). Greedy, not the arms'
  sampling: the simulator is a fixed function of its input, so the two terms of the gain differ by
  the rationale alone and not by sampling noise; thinking is off, so the looping that rules
  greedy decoding out for the reasoning models (App. J.1) has no block to loop in. The answer
  is App. K's parse (`mistill.world.answers.parse_answer`) of the output as the text after a
  reasoning block: the last JSON list, restricted to the inventory, de-duplicated.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mistill.distill.trainer import TrainConfig, Trainer
from mistill.errors import UserError
from mistill.evaluate.fidelity import reasoning_block
from mistill.world.prompt import ANSWER_SENTENCE, NOTE_HEADER, ROLE_SENTENCE, instruction

# App. B's instruction without the shortlist: the simulator has no list to point back to
SIM_TASK_SENTENCE = "Code the discharge summary above with the ICD-10-CM diagnosis codes it supports."
SIM_INSTRUCTION = " ".join([ROLE_SENTENCE, SIM_TASK_SENTENCE, ANSWER_SENTENCE])
WITH_RATIONALE, NOTE_ONLY = "with_rationale", "note_only"
INPUTS = (WITH_RATIONALE, NOTE_ONLY)      # what the simulator is trained on (App. K)
RATIONALE_ONLY = "rationale_only"         # answered at prediction only: Hase et al.'s leakage test


# ---- inputs and targets ----------------------------------------------------------------------------

def note_of_prompt(prompt: str) -> str:
    """The discharge summary of an App. B prompt: between the note header and the instruction."""
    head = f"\n\n{NOTE_HEADER}\n\n"
    start = prompt.find(head)
    if start == -1:
        raise UserError(f"a prompt without the {NOTE_HEADER!r} header: not an App. B prompt "
                        f"(starts {prompt[:60]!r})")
    body = prompt[start + len(head):]
    for narrow in (True, False):   # R-C14's control drops one sentence of the instruction
        tail = f"\n\n{instruction(narrow_instruction=narrow)}"
        if body.endswith(tail):
            return body[:-len(tail)].strip()
    return body.rsplit("\n\n", 1)[0].strip()   # another instruction: the last paragraph


def simulator_text(note: str | None, rationale: str | None = None) -> str:
    """The simulator's user text: the note, the rationale when given, the instruction. Without a note
    (the rationale-only input) the note's text is left out and the header stays, as Hase et al.'s input
    dropout blanks the input and keeps the template."""
    body = f"{note.strip()}\n\n" if note is not None else ""
    reasoning = f"<think>\n{rationale.strip()}\n</think>\n\n" if rationale is not None else ""
    return f"{NOTE_HEADER}\n\n{body}{reasoning}{SIM_INSTRUCTION}"


def answer_text(codes: Sequence[str]) -> str:
    """a_T as the simulator writes it: a JSON list of code strings."""
    return json.dumps(list(codes), ensure_ascii=False)


@dataclass
class SimulatorExample:
    """One training example: prompt tokens then target tokens (the answer and the end-of-turn token)."""

    note_id: str                 # example id, `<note_id>/<input>`: the trainer's example ids
    source: str                  # the trace's note id
    kind: str                    # with_rationale | note_only
    user_text: str
    target: str
    ids: torch.Tensor = field(repr=False)   # [T] prompt then target
    n_prompt: int                # target tokens start here

    @property
    def n_target(self) -> int:
        return len(self.ids) - self.n_prompt


def encode_prompt(tokenizer, user_text: str) -> list[int]:
    return tokenizer.encode(tokenizer.chat_prompt(user_text, thinking=False)).ids


def make_example(tokenizer, note_id: str, kind: str, user_text: str, target: str) -> SimulatorExample:
    # prompt and target are encoded apart, as generation sees them: the prompt's tokens, then new ones
    prompt = encode_prompt(tokenizer, user_text)
    answer = tokenizer.encode(target).ids + [tokenizer.eos_token_id]
    return SimulatorExample(f"{note_id}/{kind}", note_id, kind, user_text, target,
                            torch.tensor(prompt + answer, dtype=torch.long), len(prompt))


def build_examples(traces: Iterable[dict], tokenizer, note_ids: set[str] | None = None) -> list[SimulatorExample]:
    """Two examples per valid teacher trace (in file order), note ⊕ rationale then note alone, both
    with the teacher's answer as target. `note_ids` restricts to those notes (the training notes)."""
    examples = []
    for trace in traces:
        if not trace.get("valid") or (note_ids is not None and trace["note_id"] not in note_ids):
            continue
        note = note_of_prompt(trace["prompt"])
        target = answer_text(trace.get("answer") or [])
        rationale = reasoning_block(trace["completion"])
        examples.append(make_example(tokenizer, trace["note_id"], WITH_RATIONALE,
                                     simulator_text(note, rationale), target))
        examples.append(make_example(tokenizer, trace["note_id"], NOTE_ONLY, simulator_text(note), target))
    return examples


def examples_sha256(examples: Sequence[SimulatorExample]) -> str:
    """What the simulator was trained on, token for token (a resumed run must share it)."""
    digest = hashlib.sha256()
    for ex in examples:
        digest.update(f"{ex.note_id}:{ex.n_prompt}:".encode())
        digest.update(ex.ids.numpy().astype("<i8").tobytes())
    return digest.hexdigest()


# ---- training --------------------------------------------------------------------------------------

def target_loss(model, example: SimulatorExample) -> torch.Tensor:
    """Mean cross-entropy of the target tokens given everything before them.

    Only the logits that predict target tokens are computed (`logits_to_keep`): the rows from the
    last prompt position on, which matters when the vocabulary is 151k and the rationale long.
    """
    device = next(model.parameters()).device
    ids = example.ids.to(device)
    logits = model(input_ids=ids[None], logits_to_keep=example.n_target + 1).logits[0, :-1]
    return torch.nn.functional.cross_entropy(logits.float(), ids[example.n_prompt:])


@dataclass(frozen=True)
class SimulatorObjective:
    """The trainer's arm: target-token cross-entropy (what the run's config records)."""

    arm: str = "simulator"

    def as_dict(self) -> dict:
        return {"arm": self.arm, "loss": "target-token cross-entropy", "inputs": list(INPUTS)}


class SimulatorTrainer(Trainer):
    """The shared trainer with the simulator's loss; a checkpoint resumes only on the same examples
    and base weights."""

    RUN_IDENTITY = (*Trainer.RUN_IDENTITY, "examples_sha256", "base_sha256")

    def note_loss(self, example: SimulatorExample) -> tuple[torch.Tensor, dict]:
        loss = target_loss(self.model, example)
        return loss, {"loss": float(loss.detach()), f"loss_{example.kind}": float(loss.detach()),
                      "tokens": example.n_target}


def train_simulator(model, tokenizer, examples: list[SimulatorExample], config: TrainConfig, out_dir: str | Path, *,
                    run_config: dict | None = None, restart_if_different: bool = True,
                    max_steps: int | None = None) -> list[dict]:
    """Fine-tune `model` on `examples`; the model (and the tokenizer) go to `out_dir/model`, the settings
    to `out_dir/config.json`, one line per optimiser step to `out_dir/metrics.jsonl`. Returns those lines."""
    if not examples:
        raise UserError("no simulator training examples (no valid teacher trace on the training notes)")
    out_dir = Path(out_dir)
    run_config = {"examples_sha256": examples_sha256(examples), "n_examples": len(examples),
                  "instruction": SIM_INSTRUCTION, **(run_config or {})}
    trainer = SimulatorTrainer(model, examples, SimulatorObjective(), config, out_dir, run_config=run_config,
                               restart_if_different=restart_if_different)
    rows = trainer.run(max_steps=max_steps)
    if (out_dir / "model").exists():
        save_tokenizer(tokenizer, out_dir / "model")
    return rows


def save_tokenizer(tokenizer, directory: Path) -> None:
    """Beside the weights, so `load_model(directory)` finds it: the compact remap, or the HF files."""
    if hasattr(tokenizer, "save"):
        tokenizer.save(directory)
    elif hasattr(getattr(tokenizer, "_tok", None), "save_pretrained"):   # HFTextTokenizer
        tokenizer._tok.save_pretrained(str(directory))


@torch.no_grad()
def mean_target_loss(model, examples: Sequence[SimulatorExample]) -> float:
    """The mean over examples of `target_loss`, in eval mode (no dropout)."""
    was_training = model.training
    model.eval()
    try:
        return float(sum(float(target_loss(model, ex)) for ex in examples) / max(len(examples), 1))
    finally:
        model.train(was_training)


# ---- prediction ------------------------------------------------------------------------------------

@torch.no_grad()
def greedy_answers(model, tokenizer, user_texts: Sequence[str], *, max_new_tokens: int = 64,
                   batch_size: int = 16, progress: bool = False) -> list[str]:
    """The simulator's greedy output for each user text (thinking off), up to its end-of-turn token
    or `max_new_tokens`. Texts of similar length share a left-padded batch; padding is masked and
    positions count real tokens only, so a text's output depends on its batch only through float
    rounding (`batch_size=1` removes even that)."""
    from tqdm import tqdm
    from transformers import DynamicCache

    model = model.eval()
    device = next(model.parameters()).device
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    encoded = [encode_prompt(tokenizer, t) for t in user_texts]
    order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i]), i))
    outputs: list[str] = [""] * len(encoded)
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc="simulator", unit="batch", disable=not progress):
        rows = order[start:start + batch_size]
        width = max(len(encoded[i]) for i in rows)
        input_ids = torch.tensor([[pad] * (width - len(encoded[i])) + encoded[i] for i in rows], device=device)
        mask = torch.tensor([[0] * (width - len(encoded[i])) + [1] * len(encoded[i]) for i in rows], device=device)
        new: list[list[int]] = [[] for _ in rows]
        done = [False] * len(rows)
        cache, step_ids = DynamicCache(), input_ids
        for _ in range(max_new_tokens):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1]:]
            out = model(input_ids=step_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                        use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            nxt = out.logits[:, -1, :].argmax(-1).tolist()
            for k, token in enumerate(nxt):
                if done[k]:
                    nxt[k] = pad
                    continue
                done[k] = token == eos
                if not done[k]:
                    new[k].append(token)
            if all(done):
                break
            step_ids = torch.tensor(nxt, device=device)[:, None]
            # a finished row feeds padding that every later step masks out
            mask = torch.cat([mask, torch.tensor([[0 if d else 1] for d in done], device=device)], dim=1)
        for k, i in enumerate(rows):
            outputs[i] = tokenizer.decode(new[k])
    return outputs


def parse_codes(text: str, inventory=None) -> list[str]:
    """App. K's answer rule on the simulator's output (thinking off: all of it is after the reasoning
    block): the last JSON list, restricted to the inventory and de-duplicated. Without an inventory
    every string of the list is kept as written (de-duplicated)."""
    from mistill.world.answers import THINK_CLOSE, last_json_list, parse_answer

    if inventory is not None:
        return list(parse_answer(THINK_CLOSE + text, inventory, hit_cap=False).answer)
    final = last_json_list(text) or []
    return list(dict.fromkeys(item for item in final if isinstance(item, str)))


def predict(model, tokenizer, rows: Sequence[dict], inventory=None, *, max_new_tokens: int = 64,
            batch_size: int = 16, keep_text: bool = False, progress: bool = False) -> list[dict]:
    """For each generation row {note_id, prompt, completion}: the simulator's answer from the note with
    the row's rationale (its reasoning block), from the note alone and from the rationale alone, as
    {note_id, with_rationale, note_only, rationale_only}: what `mistill evaluate fidelity --simulator`
    reads. `keep_text` adds the raw outputs (`<input>_text`)."""
    notes = [note_of_prompt(r["prompt"]) for r in rows]
    rationales = [reasoning_block(r["completion"]) for r in rows]
    texts = [simulator_text(n, r) for n, r in zip(notes, rationales)] + [simulator_text(n) for n in notes]
    outputs = greedy_answers(model, tokenizer, texts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                             progress=progress)
    # a call of their own: App. K's two inputs share batches exactly as they did before this input was
    # added, so their answers, and App. K's LAS, do not move by batch rounding
    leak_outputs = greedy_answers(model, tokenizer, [simulator_text(None, r) for r in rationales],
                                  max_new_tokens=max_new_tokens, batch_size=batch_size, progress=progress)
    answers = {WITH_RATIONALE: outputs[:len(rows)], NOTE_ONLY: outputs[len(rows):], RATIONALE_ONLY: leak_outputs}
    result = []
    for i, row in enumerate(rows):
        record = {"note_id": row["note_id"], **{kind: parse_codes(out[i], inventory) for kind, out in answers.items()}}
        if keep_text:
            record.update({f"{kind}_text": out[i] for kind, out in answers.items()})
        result.append(record)
    return result
