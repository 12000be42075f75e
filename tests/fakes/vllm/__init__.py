"""A stand-in for vLLM's offline API (`LLM`, `SamplingParams`, request outputs) for CPU tests.

It accepts only the engine and sampling arguments vLLM has, keeps vLLM's rules that matter to the
backend (token-id prompts and no detokenizing when the tokenizer is skipped; one sampling setting
per prompt; outputs in prompt order) and records what it was asked, so a test can check the seed,
the stop rule, the length cap and the YaRN override the backend passed.

Its "model" is scripted: a request's seed alone decides its tokens (ids drawn below the config's
vocabulary size, never the end-of-turn id) and where the model would end its turn; the engine then
stops where vLLM would: at a stop token id, at the config's end token unless `ignore_eos`, or at
`max_tokens`.

Scripted mode (`MISTILL_FAKE_VLLM_SCRIPT=<json>`, set by the paper profile's rehearsal,
`mistill rehearsal build`): a request is answered with plausible reasoning instead of random ids.
The fake decodes the prompt with the model's own tokenizer, reads the candidate lines and the note
from App. B's prompt, looks the note up in the script (`{"keep": share, "keep_by_model": {path fragment: share},
"notes": [{"text", "gold"}]}`, the admission whose text shares the longest prefix with the prompt's
note) and writes the demo's scripted trace (`mistill.models.scripted_traces`) for a subset of its gold
codes: each kept with probability `keep` (or the share of the first `keep_by_model` fragment in the
model's path; the first one when none is kept) under a generator seeded by the request's seed, the
model (its path relative to the working directory: the same draws wherever the copy lies) and the
note, so the teacher and the arms, seeds and notes differ.  The trace is encoded by the model's tokenizer and closed with its end-of-turn
id; the stop rules above apply to it unchanged.  A trace token outside the model's table is an error.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

ENGINES: list[LLM] = []  # every engine made since the test's fixture cleared it
SCRIPT_ENV = "MISTILL_FAKE_VLLM_SCRIPT"

ENVIRONMENT = ("CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
ENGINE_ARGUMENTS = {"model", "tokenizer", "skip_tokenizer_init", "dtype", "seed", "tensor_parallel_size",
                    "gpu_memory_utilization", "max_model_len", "hf_overrides", "revision", "tokenizer_revision",
                    "enforce_eager", "trust_remote_code"}


class SamplingParams:
    def __init__(self, n: int = 1, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 max_tokens: int | None = 16, seed: int | None = None, stop_token_ids: list[int] | None = None,
                 ignore_eos: bool = False, detokenize: bool = True, skip_special_tokens: bool = True):
        self.n, self.temperature, self.top_p, self.top_k = n, temperature, top_p, top_k
        self.max_tokens, self.seed, self.stop_token_ids = max_tokens, seed, list(stop_token_ids or [])
        self.ignore_eos, self.detokenize, self.skip_special_tokens = ignore_eos, detokenize, skip_special_tokens


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


class LLM:
    def __init__(self, model: str, **kwargs):
        unknown = set(kwargs) - ENGINE_ARGUMENTS
        if unknown:
            raise TypeError(f"LLM got unexpected engine arguments {sorted(unknown)}")
        self.model = model
        self.kwargs = kwargs
        config = json.loads((Path(model) / "config.json").read_text())
        config.update(kwargs.get("hf_overrides") or {})
        self.config = config
        self.end_token = int(config["eos_token_id"])
        self.vocab_size = int(config["vocab_size"])
        self.requests: list[tuple[list[int], SamplingParams]] = []
        self.script = Script(os.environ[SCRIPT_ENV], model) if os.environ.get(SCRIPT_ENV) else None
        # what the engine's workers would see of the process: its GPUs and any torchrun variable
        self.environment = {name: os.environ.get(name) for name in ENVIRONMENT}
        ENGINES.append(self)

    def generate(self, prompts, sampling_params, use_tqdm: bool = True) -> list[RequestOutput]:
        if not isinstance(sampling_params, list) or len(sampling_params) != len(prompts):
            raise ValueError("one SamplingParams per prompt")
        outputs = []
        for i, (prompt, params) in enumerate(zip(prompts, sampling_params)):
            if self.kwargs.get("skip_tokenizer_init"):
                if not isinstance(prompt, dict) or "prompt_token_ids" not in prompt:
                    raise ValueError("skip_tokenizer_init needs token-id prompts")
                if params.detokenize:
                    raise ValueError("skip_tokenizer_init needs detokenize=False")
            ids = list(prompt["prompt_token_ids"])
            self.requests.append((ids, params))
            tokens, reason = self._sample(params, ids)
            outputs.append(RequestOutput(str(i), ids, [CompletionOutput(0, "", tokens, reason)]))
        return outputs

    def _sample(self, params: SamplingParams, prompt_ids: list[int] | None = None) -> tuple[list[int], str]:
        if self.script is not None:
            return self._stop(self.script.completion_ids(prompt_ids or [], params.seed), params)
        rng = random.Random(params.seed)
        turn_length = rng.randint(1, 12)  # where the scripted model emits its end-of-turn token
        body = [t for t in range(self.vocab_size) if t != self.end_token]
        tokens = []
        while True:
            token = self.end_token if len(tokens) + 1 == turn_length else rng.choice(body)
            tokens.append(token)
            if token in params.stop_token_ids or (token == self.end_token and not params.ignore_eos):
                return tokens, "stop"
            if len(tokens) == params.max_tokens:
                return tokens, "length"

    def _stop(self, script: list[int], params: SamplingParams) -> tuple[list[int], str]:
        """The engine's stop rules over a scripted token sequence."""
        tokens = []
        for token in script:
            tokens.append(token)
            if token in params.stop_token_ids or (token == self.end_token and not params.ignore_eos):
                return tokens, "stop"
            if len(tokens) == params.max_tokens:
                return tokens, "length"
        return tokens, "stop"


def stable_name(model: str) -> str:
    """The model's path relative to the working directory (DVC runs every stage from the rehearsal's
    root), so the draws are the same wherever the rehearsal's copy lies; an id or a path outside
    stays as given."""
    path = Path(model)
    if not path.is_absolute():
        return model
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return model


class Script:
    """Scripted traces for one model (see the module docstring)."""

    def __init__(self, path: str, model: str):
        from mistill.models.loading import load_tokenizer

        data = json.loads(Path(path).read_text(encoding="utf-8"))
        self.model = str(model)
        self.key = stable_name(self.model)
        by_model = data.get("keep_by_model") or {}   # path fragment -> share, e.g. the teacher's cache entry
        self.keep = float(next((v for k, v in by_model.items() if k in self.model), data.get("keep", 1.0)))
        self.notes = [(row["text"].strip(), tuple(row["gold"])) for row in data["notes"]]
        self.tokenizer = load_tokenizer(model)

    def gold(self, note: str) -> tuple[str, ...]:
        text, gold = max(self.notes, key=lambda row: len(os.path.commonprefix([row[0], note])))
        return gold if os.path.commonprefix([text, note]) else ()

    def completion_ids(self, prompt_ids: list[int], seed: int | None) -> list[int]:
        from mistill.models.scripted_traces import script_trace
        from mistill.world.prompt import LIST_HEADER, NOTE_HEADER, ROLE_SENTENCE
        from mistill.world.types import Code, Note

        prompt = self.tokenizer.decode(prompt_ids)
        start = prompt.index(LIST_HEADER) + len(LIST_HEADER)
        note_at = prompt.index(f"\n\n{NOTE_HEADER}\n\n", start)
        end = prompt.index(f"\n\n{ROLE_SENTENCE}", note_at)
        lines = [line.split(" ", 1) for line in prompt[start:note_at].strip("\n").split("\n")]
        note = prompt[note_at + len(NOTE_HEADER) + 4:end]
        rng = random.Random(f"{seed}:{self.key}:{note[:200]}")
        gold = self.gold(note)
        gold = tuple(code for code in gold if rng.random() < self.keep) or gold[:1]   # a coder names one at least
        trace = script_trace(Note("scripted", "scripted", note, gold), [Code(c, d) for c, d in lines], seed=seed or 0)
        ids = self.tokenizer.encode(trace.completion).ids
        if getattr(self.tokenizer, "unk_token_id", None) in ids:
            raise ValueError(f"fake vllm: the scripted trace has tokens outside {self.model}'s table: "
                             f"{trace.completion[:200]!r}")
        return ids + [self.tokenizer.eos_token_id]
