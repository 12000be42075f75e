"""A stand-in for vLLM's offline API (`LLM`, `SamplingParams`, request outputs) for CPU tests.

It accepts only the engine and sampling arguments vLLM has, keeps vLLM's rules that matter to the
backend (token-id prompts and no detokenizing when the tokenizer is skipped; one sampling setting
per prompt; outputs in prompt order) and records what it was asked, so a test can check the seed,
the stop rule, the length cap and the YaRN override the backend passed.

Its "model" is scripted: a request's seed alone decides its tokens (ids drawn below the config's
vocabulary size, never the end-of-turn id) and where the model would end its turn; the engine then
stops where vLLM would: at a stop token id, at the config's end token unless `ignore_eos`, or at
`max_tokens`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

ENGINES: list[LLM] = []  # every engine made since the test's fixture cleared it

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
            tokens, reason = self._sample(params)
            outputs.append(RequestOutput(str(i), ids, [CompletionOutput(0, "", tokens, reason)]))
        return outputs

    def _sample(self, params: SamplingParams) -> tuple[list[int], str]:
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
