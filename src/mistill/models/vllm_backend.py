"""Generation in vLLM, as the paper ran every model that generates (App. B, J.1, J.5).

One engine per model, with the profile's arguments (`models.vllm`: tensor parallel
size, GPU memory share, context length per model) and the model's static YaRN
handed to vLLM's config (`hf_overrides`), so the engine runs the positions the
transformers path runs (`mistill.models.loading.apply_rope_scaling`).  A hub id is
read from the cached snapshot of its pinned revision, never resolved online.

Data parallel (`models.vllm.data_parallel_size`: N): the generation commands run as N processes
under torchrun (`mistill.shard`), each with an engine of its own on its own
`tensor_parallel_size` GPUs, and note n on process n mod N. The models are dense, so the
engines need nothing from each other (vLLM leaves the balancing of an external launcher's
replicas to that launcher); a note's completion depends on its seed, not on which engine drew
it. While an engine starts, its process sees only its GPUs and none of torchrun's variables,
so vLLM sets up its own workers as in a single process.

Each request samples with its own seed (`SamplingParams(seed=...)`), the decoding
settings and the cap on new tokens.  The engine gets token ids, not text: prompts
are templated and tokenized by the project's tokenizer, as in the transformers
path, and the new ids are decoded by it too (`mistill.models.decoding.completion_of`), so the
two backends agree on what a prompt and a completion are.  The stop rule is the
transformers path's: the model's end-of-turn token and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from mistill.errors import UserError
from mistill.io import read_json
from mistill.models.decoding import Decoding, Generation, completion_of
from mistill.models.loading import ModelSpec, as_spec, checkpoint_directory, load_tokenizer, yarn_window
from mistill.shard import Shard

ENGINE_SEED = 0  # the engine's own seed; every request carries its note's seed
# What torchrun tells its processes; vLLM would read it as its own world while it starts its workers.
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                      "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                      "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING")


@dataclass(frozen=True)
class EngineSettings:
    """The profile's vLLM engine arguments for one model."""

    tensor_parallel_size: int = 1     # GPUs of one engine
    data_parallel_size: int = 1       # engines, one process each, each on its own tensor_parallel_size GPUs
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None  # None: the model's window (its YaRN window when scaled)

    @classmethod
    def from_params(cls, models: Mapping[str, Any], name: str | None) -> EngineSettings:
        """`models.vllm` of the profile; `max_model_len` is one number or one per model key."""
        section = dict(models.get("vllm") or {})
        unknown = set(section) - set(cls.__dataclass_fields__)
        if unknown:
            raise UserError(f"params models.vllm: unknown keys {', '.join(sorted(unknown))}")
        length = section.pop("max_model_len", None)
        if isinstance(length, Mapping):
            length = length.get(name) if name else None
        settings = cls(**section, max_model_len=None if length is None else int(length))
        if (settings.tensor_parallel_size < 1 or settings.data_parallel_size < 1
                or not 0 < settings.gpu_memory_utilization <= 1):
            raise UserError(f"params models.vllm: invalid settings {settings}")
        return settings

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def generation_processes(params: Mapping[str, Any]) -> int:
    """How many processes a generation command runs as: one per vLLM engine under the vllm backend
    (`models.vllm.data_parallel_size`), one under transformers."""
    models = params.get("models") or {}
    if models.get("generation_backend", "transformers") != "vllm":
        return 1
    return EngineSettings.from_params(models, None).data_parallel_size


def visible_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (indices or UUIDs)."""
    env = os.environ if env is None else env
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu.strip() for gpu in listed.split(",") if gpu.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def replica_gpus(shard: Shard, tensor_parallel_size: int, gpus: Sequence[str]) -> list[str]:
    """The GPUs of engine `shard.rank`: the rank's block of `tensor_parallel_size` among `gpus`."""
    needed = shard.world * tensor_parallel_size
    if len(gpus) < needed:
        raise UserError(f"params models.vllm: data_parallel_size {shard.world} x tensor_parallel_size "
                        f"{tensor_parallel_size} needs {needed} GPUs; {len(gpus)} visible")
    start = shard.rank * tensor_parallel_size
    return list(gpus[start:start + tensor_parallel_size])


@contextmanager
def replica_environment(shard: Shard, tensor_parallel_size: int) -> Iterator[None]:
    """While an engine starts under torchrun, this process sees its own GPUs only and none of torchrun's
    variables; both come back afterwards (the processes' barrier needs the variables, and a second engine
    of the same process its block of the same GPUs; the engine's workers keep what they saw at their
    start). One process: no change."""
    if shard.world == 1:
        yield
        return
    gpus = replica_gpus(shard, tensor_parallel_size, visible_gpus())
    saved = {name: os.environ.pop(name) for name in (*TORCHRUN_VARIABLES, "CUDA_VISIBLE_DEVICES")
             if name in os.environ}
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    try:
        yield
    finally:
        os.environ.pop("CUDA_VISIBLE_DEVICES")
        os.environ.update(saved)


def checkpoint_scaling(directory) -> dict[str, Any] | None:
    """The static scaling a checkpoint's own config.json carries (a student trained under YaRN saves it)."""
    config = read_json(directory / "config.json", "model config")
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, Mapping) or params.get("rope_type", params.get("type", "default")) == "default":
        return None
    return {k: v for k, v in params.items() if k not in ("rope_theta", "type")}


def yarn_overrides(directory, rope_scaling: Mapping[str, Any]) -> dict[str, Any]:
    """The config entries that give vLLM the model's static YaRN.

    Both spellings are set, `rope_scaling` (transformers 4) and `rope_parameters` (transformers 5,
    which also holds `rope_theta`), each complete: an override replaces a config entry whole, so
    the base frequency is carried over from the checkpoint, never dropped.
    """
    config = read_json(directory / "config.json", "model config")
    scaling = {"rope_type": "yarn", **rope_scaling}
    theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta")
    parameters = {**({"rope_theta": theta} if theta is not None else {}), **scaling}
    return {"rope_scaling": scaling, "rope_parameters": parameters, "max_position_embeddings": yarn_window(scaling)}


def engine_arguments(spec: ModelSpec, settings: EngineSettings) -> dict[str, Any]:
    """`vllm.LLM(**...)` for one model as the profile runs it."""
    directory = checkpoint_directory(spec)  # an HF id: its pinned snapshot, offline
    arguments: dict[str, Any] = {
        "model": str(directory),
        "skip_tokenizer_init": True,  # token ids in, token ids out: the project's tokenizer does both ends
        "dtype": spec.dtype or "auto",
        "seed": ENGINE_SEED,
        "tensor_parallel_size": settings.tensor_parallel_size,   # data parallel: one engine per process
        "gpu_memory_utilization": settings.gpu_memory_utilization,
    }
    if settings.max_model_len is not None:
        arguments["max_model_len"] = settings.max_model_len
    scaling = spec.rope_scaling or checkpoint_scaling(directory)
    if scaling:
        arguments["hf_overrides"] = yarn_overrides(directory, scaling)
    return arguments


class VLLMGenerator:
    """One vLLM engine for one model; `generate` samples a list of prompts with per-request seeds."""

    def __init__(self, spec: ModelSpec | str, settings: EngineSettings | None = None, tokenizer=None):
        self.spec = as_spec(spec)
        self.tokenizer = tokenizer or load_tokenizer(self.spec)
        settings = settings or EngineSettings()
        self.engine_arguments = engine_arguments(self.spec, settings)
        os.environ["HF_HUB_OFFLINE"] = "1"  # before vLLM imports huggingface_hub: nothing is downloaded
        try:
            from vllm import LLM, SamplingParams
        except ImportError:
            raise UserError("the vllm backend needs vLLM (pip install -e '.[paper]')") from None
        self._sampling_params = SamplingParams
        with replica_environment(Shard.from_env(), settings.tensor_parallel_size):
            self.llm = LLM(**self.engine_arguments)

    @classmethod
    def from_params(cls, models: Mapping[str, Any], spec: ModelSpec) -> VLLMGenerator:
        """The engine of one model with the profile's arguments (`models.vllm`)."""
        return cls(spec, EngineSettings.from_params(models, spec.name))

    def sampling_params(self, seed: int, decoding: Decoding):
        """One request's sampling: the decoding settings, the cap, its own seed, the end-of-turn stop."""
        return self._sampling_params(
            n=1, temperature=decoding.temperature, top_p=decoding.top_p, top_k=decoding.top_k,
            max_tokens=decoding.max_new_tokens, seed=int(seed),
            # stop at the end-of-turn token only, as the transformers path does; `ignore_eos` keeps vLLM
            # from adding the generation config's other end tokens to the stop set
            stop_token_ids=[self.tokenizer.eos_token_id], ignore_eos=True,
            detokenize=False, skip_special_tokens=False)

    def generate(self, prompts: Sequence[str], seeds: Sequence[int], decoding: Decoding, *,
                 progress: bool = False) -> list[Generation]:
        if len(seeds) != len(prompts):
            raise UserError(f"generate: {len(prompts)} prompts but {len(seeds)} seeds")
        requests = [{"prompt_token_ids": self.tokenizer.encode(self.tokenizer.chat_prompt(p)).ids} for p in prompts]
        sampling = [self.sampling_params(seed, decoding) for seed in seeds]
        outputs = self.llm.generate(requests, sampling, use_tqdm=progress)
        if len(outputs) != len(prompts):
            raise UserError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        results = []
        for prompt, seed, output in zip(prompts, seeds, outputs):
            choice = output.outputs[0]
            generation = completion_of(prompt, choice.token_ids, self.tokenizer, int(seed))
            if choice.finish_reason == "stop" and generation.hit_cap:
                raise UserError(f"vLLM stopped a generation at token {list(choice.token_ids)[-1:]}, not at the "
                                f"end-of-turn token {self.tokenizer.eos_token_id}: the stop rule was not applied")
            results.append(generation)
        return results
