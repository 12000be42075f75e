"""`generate(model_spec, prompts, ...)`: sampled generation with two backends.

App. B / J.1: temperature 0.6, top-p 0.95, top-k 20, a fixed per-note seed and a
cap on new tokens; greedy decoding is never used (it loops in thinking mode,
App. J.1).  Each prompt is one user turn of the model's chat template with
thinking on; the completion is the text after the assistant header, from the
model's own `<think>` to (excluding) its end-of-turn token.

* `transformers` (demo): one prompt at a time, `torch.manual_seed(seed)` before
  each, so a note's trace depends on its seed only, not on batch composition.
* `vllm` (paper): one `SamplingParams(seed=...)` per request; vLLM is imported
  only when this backend is used.

A generation that reaches the cap is marked `hit_cap`; validity and the answer
are App. K's, decided by `mistill.world.answers` (a capped or unclosed
generation is invalid and scores empty).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mistill.errors import UserError

BACKENDS = ("transformers", "vllm")


@dataclass(frozen=True)
class Generation:
    prompt: str            # untemplated user text
    completion: str        # text after the assistant header, without the end-of-turn token
    n_new_tokens: int      # tokens generated, end-of-turn token included when emitted
    hit_cap: bool          # stopped by max_new_tokens, not by end of turn
    seed: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Decoding:
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    max_new_tokens: int = 1024

    @classmethod
    def from_params(cls, section: dict[str, Any]) -> Decoding:
        known = {k: section[k] for k in cls.__dataclass_fields__ if k in section}
        decoding = cls(**known)
        if decoding.temperature <= 0:
            raise UserError("decoding.temperature must be positive: greedy decoding loops in thinking mode (App. J.1)")
        if not 0 < decoding.top_p <= 1 or decoding.top_k < 1 or decoding.max_new_tokens < 1:
            raise UserError(f"decoding: invalid settings {decoding}")
        return decoding

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def generate(model_spec: Any, prompts: Sequence[str], *, seeds: Sequence[int], temperature: float = 0.6,
             top_p: float = 0.95, top_k: int = 20, max_new_tokens: int = 1024, backend: str = "transformers",
             load_kwargs: dict[str, Any] | None = None, progress: bool = False) -> list[Generation]:
    """Sample one completion per prompt, prompt i with seed i.

    `model_spec` is an HF id or local directory, or an already loaded (model, tokenizer) pair
    (transformers backend).
    """
    if len(seeds) != len(prompts):
        raise UserError(f"generate: {len(prompts)} prompts but {len(seeds)} seeds")
    decoding = Decoding.from_params({"temperature": temperature, "top_p": top_p, "top_k": top_k,
                                         "max_new_tokens": max_new_tokens})
    if backend == "transformers":
        return _generate_transformers(model_spec, prompts, seeds, decoding, load_kwargs or {}, progress)
    if backend == "vllm":
        return _generate_vllm(model_spec, prompts, seeds, decoding, load_kwargs or {})
    raise UserError(f"unknown generation backend {backend!r}; known: {', '.join(BACKENDS)}")


def _generate_transformers(model_spec, prompts, seeds, decoding: Decoding, load_kwargs, progress) -> list[Generation]:
    import torch
    from tqdm import tqdm

    if isinstance(model_spec, tuple):
        model, tokenizer = model_spec
    else:
        from mistill.models.loading import load_model

        model, tokenizer = load_model(model_spec, **load_kwargs)
    device = next(model.parameters()).device
    results = []
    for prompt, seed in tqdm(list(zip(prompts, seeds)), desc="generate", unit="note", disable=not progress):
        ids = tokenizer.encode(tokenizer.chat_prompt(prompt)).ids
        input_ids = torch.tensor([ids], device=device)
        torch.manual_seed(int(seed))
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                                 temperature=decoding.temperature, top_p=decoding.top_p, top_k=decoding.top_k,
                                 max_new_tokens=decoding.max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        new = out[0, len(ids):].tolist()
        closed = bool(new) and new[-1] == tokenizer.eos_token_id
        text_ids = new[:-1] if closed else new
        results.append(Generation(prompt, tokenizer.decode(text_ids), len(new), not closed, int(seed)))
    return results


def _generate_vllm(model_spec, prompts, seeds, decoding: Decoding, load_kwargs) -> list[Generation]:
    if isinstance(model_spec, tuple):
        raise UserError("the vllm backend takes a model id or directory, not a loaded model")
    try:
        from vllm import LLM, SamplingParams
    except ImportError:
        raise UserError("the vllm backend needs vLLM (pip install -e '.[paper]')") from None
    from mistill.models.loading import load_tokenizer

    tokenizer = load_tokenizer(str(model_spec))
    engine_kwargs = {"model": str(model_spec), "seed": 0}
    rope = load_kwargs.get("rope_scaling")
    if rope:  # the same static YaRN as the HF path (loading.apply_rope_scaling)
        params = {"rope_type": "yarn", **rope}
        engine_kwargs["hf_overrides"] = {"rope_parameters": params, "rope_scaling": params,
                                         "max_position_embeddings": int(rope["factor"] * rope["original_max_position_embeddings"])}
    if load_kwargs.get("dtype"):
        engine_kwargs["dtype"] = load_kwargs["dtype"]
    engine_kwargs.update(load_kwargs.get("vllm", {}))
    llm = LLM(**engine_kwargs)
    texts = [tokenizer.chat_prompt(p) for p in prompts]
    sampling = [SamplingParams(temperature=decoding.temperature, top_p=decoding.top_p, top_k=decoding.top_k,
                               max_tokens=decoding.max_new_tokens, seed=int(s), skip_special_tokens=False)
                for s in seeds]
    outputs = llm.generate(texts, sampling)
    results = []
    for prompt, seed, out in zip(prompts, seeds, outputs):
        choice = out.outputs[0]
        results.append(Generation(prompt, choice.text, len(choice.token_ids), choice.finish_reason == "length",
                                  int(seed)))
    return results
