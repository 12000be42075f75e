"""`generate(model, prompts, seeds=..., decoding=..., backend=...)`: sampled generation, two backends.

App. B / J.1: temperature 0.6, top-p 0.95, top-k 20, a fixed per-note seed and a
cap on new tokens; greedy decoding is never used (it loops in thinking mode,
App. J.1).  Each prompt is one user turn of the model's chat template with
thinking on; the completion is the text after the assistant header, from the
model's own `<think>` to (excluding) its end-of-turn token.

* `transformers` (demo): prompts of similar length in left-padded batches of
  `batch_size`, each row sampled from its own generator seeded with its seed
  (`mistill.models.sampling`), so a note's trace depends on its seed only, not on
  the notes that share its batch; a lone row equals transformers' `generate` after
  `torch.manual_seed(seed)`, token for token.
* `vllm` (paper; App. J.5: every model that generates, in vLLM): one engine with the
  profile's arguments and the model's YaRN, one `SamplingParams(seed=...)` per
  request (`mistill.models.vllm_backend`); vLLM is imported only when it is used.

Both backends tokenize the templated prompt with the project's tokenizer, stop at
the model's end-of-turn token and decode with the same tokenizer (`completion_of`,
`mistill.models.decoding`), so a trace means the same whichever backend wrote it.
A generation that reaches the cap is marked `hit_cap`; validity and the answer are
App. K's, decided by `mistill.world.answers` (a capped or unclosed generation is
invalid and scores empty).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mistill.errors import UserError
from mistill.models.decoding import Decoding, Generation, completion_of
from mistill.models.vllm_backend import EngineSettings, VLLMGenerator

BACKENDS = ("transformers", "vllm")


def generate(model: Any, prompts: Sequence[str], *, seeds: Sequence[int], decoding: Decoding | None = None,
             backend: str = "transformers", engine: EngineSettings | None = None, device: str | None = None,
             progress: bool = False, batch_size: int = 16,
             **settings: Any) -> list[Generation]:
    """Sample one completion per prompt, prompt i with seed i.

    `model` is a `ModelSpec` (or a bare checkpoint directory), or for the transformers backend an
    already loaded (model, tokenizer) pair.  `decoding` holds the sampling settings and the cap
    (or give them one by one: temperature=, top_p=, top_k=, max_new_tokens=); `engine` is the vLLM
    backend's `EngineSettings` from params (`models.vllm`); `batch_size` is how many prompts the
    transformers backend samples together (it changes the time, never a completion).
    """
    if len(seeds) != len(prompts):
        raise UserError(f"generate: {len(prompts)} prompts but {len(seeds)} seeds")
    unknown = set(settings) - set(Decoding.__dataclass_fields__)
    if unknown:
        raise TypeError(f"generate: unknown arguments {', '.join(sorted(unknown))}")
    decoding = decoding or Decoding.from_params(settings)
    if batch_size < 1:
        raise UserError(f"generate: batch_size must be >= 1, got {batch_size}")
    if backend == "transformers":
        return _generate_transformers(model, prompts, seeds, decoding, device, progress, batch_size)
    if backend == "vllm":
        if isinstance(model, tuple):
            raise UserError("the vllm backend takes a model spec, not a loaded model")
        return VLLMGenerator(model, engine).generate(prompts, seeds, decoding, progress=progress)
    raise UserError(f"unknown generation backend {backend!r}; known: {', '.join(BACKENDS)}")


def _generate_transformers(model_spec, prompts, seeds, decoding: Decoding, device, progress,
                           batch_size: int) -> list[Generation]:
    from tqdm import tqdm

    from mistill.models.sampling import sample_rows

    if isinstance(model_spec, tuple):
        model, tokenizer = model_spec
    else:
        from mistill.models.loading import load_model

        model, tokenizer = load_model(model_spec, device=device)
    # prompts of similar length share a batch (less padding); inside a batch rows keep the caller's order
    lengths = [len(tokenizer.encode(tokenizer.chat_prompt(p)).ids) for p in prompts]
    by_length = sorted(range(len(prompts)), key=lambda i: (lengths[i], i))
    results: list[Generation | None] = [None] * len(prompts)
    with tqdm(total=len(prompts), desc="generate", unit="note", disable=not progress) as bar:
        for start in range(0, len(prompts), batch_size):
            rows = sorted(by_length[start:start + batch_size])
            sampled = sample_rows(model.eval(), tokenizer, [prompts[i] for i in rows], [seeds[i] for i in rows],
                                  decoding)
            for i, new_ids in zip(rows, sampled):
                results[i] = completion_of(prompts[i], new_ids, tokenizer, int(seeds[i]))
            bar.update(len(rows))
    return results
