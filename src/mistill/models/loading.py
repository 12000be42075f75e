"""`load_model(spec) -> (model, tokenizer)`: every model is loaded as the profile runs it.

A `ModelSpec` is one model as params describe it: where its weights are (an HF id
or a local directory), the HF commit of an id, the dtype, the static YaRN factor
and the attention implementation.  `ModelSpec.from_params(models, name)` builds
it from the profile's `models` section, so a call site names a model and cannot
forget its positional scaling or its revision.

* A local directory (the demo models under `models/demo/`, a trained student's
  `model/`) must hold `config.json` and safetensors weights; its tokenizer is the
  compact remap (`tokenizer_remap.json`) or, failing that, the tokenizer files
  transformers reads.
* An HF id (`Qwen/Qwen3-14B`) is the snapshot of its pinned revision in the local
  Hugging Face cache, loaded as a directory: nothing is downloaded and a missing
  checkpoint fails instead of resolving to another revision (App. J.1).

Positional scaling is part of the characterized system (App. B): static YaRN from
params (`rope_scaling`), factor x original window becoming the model's maximum
position, in training, generation and every teacher-forced pass (App. J.1); the
vLLM backend hands the same parameters to its engine.  The dtype is given to
`from_pretrained(dtype=...)` only: casting a built model (`model.to(torch.bfloat16)`)
also rounds RoPE's `inv_freq` buffer to bf16, which puts angle errors of radians
on positions in the tens of thousands.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mistill.errors import UserError
from mistill.io import read_json
from mistill.models.architectures import DEFAULT_ATTN
from mistill.models.tokenizers import REMAP_FILE, CompactTokenizer, HFTextTokenizer

HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
WEIGHT_PATTERNS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
WEIGHTS_HINT = "the file looks truncated or corrupt: retrain or re-fetch it (or restore it: dvc checkout)"
DTYPES = ("float32", "bfloat16", "float16")
# RoPE buffers that transformers computes in fp32 and never stores in a checkpoint
ROPE_BUFFERS = ("inv_freq", "original_inv_freq")


def is_local_spec(spec: str) -> bool:
    """A spec names a local directory if it exists or cannot be an HF id (`owner/name`)."""
    return Path(spec).exists() or not HF_ID.match(spec) or spec.startswith((".", "/"))


@dataclass(frozen=True)
class ModelSpec:
    """One model as the profile runs it."""

    source: str                                 # an HF id or a local directory
    dtype: str | None = None                    # None: the checkpoint's own
    rope_scaling: dict[str, Any] | None = None  # static YaRN; None: the checkpoint's own positions
    revision: str | None = None                 # the HF commit of an id; None: the cache's `main`
    attn_implementation: str = DEFAULT_ATTN
    name: str | None = None                     # the params key it was resolved from (teacher, student_qwen, ...)

    def __post_init__(self):
        if self.dtype is not None and self.dtype not in DTYPES:
            raise UserError(f"unknown dtype {self.dtype!r}; use {', '.join(DTYPES)}")
        if self.rope_scaling:
            yarn_window(self.rope_scaling)  # a malformed scaling fails when the spec is made, not mid-run

    @property
    def is_local(self) -> bool:
        return is_local_spec(self.source)

    @classmethod
    def from_params(cls, models: Mapping[str, Any], model: str | Path, *, base: str | None = None,
                    **overrides: Any) -> ModelSpec:
        """The spec of `model` under the profile's `models` section.

        `model` is a params key (`teacher`, `student_qwen`, `student_smol`), the id or directory one of
        them names, or another checkpoint.  A trained checkpoint is its `base` model's: it takes that
        model's YaRN factor (its own config.json already carries the one it was trained under).
        `overrides` replace single settings (`attn_implementation="sdpa"` for training,
        `dtype="float32"` for an fp32 arm).
        """
        model = str(model)
        named = {key: str(value) for key, value in models.items() if isinstance(value, str | Path)}
        name = model if model in named else next((k for k, v in named.items() if v == model), base)
        source = named.get(model, model)
        scalings = models.get("rope_scaling") or {}
        # a profile says every model's positions, null included: a model it forgot is an error, not "no YaRN"
        if name is not None and "rope_scaling" in models and name not in scalings:
            raise UserError(f"params models.rope_scaling has no entry for {name!r} "
                            "(null: the model's native positions, no YaRN)")
        own_checkpoint = name is not None and named.get(name) == source
        revision = (models.get("revision") or {}).get(name) if own_checkpoint and not is_local_spec(source) else None
        settings = {"dtype": models.get("dtype"), "attn_implementation": models.get("attn_implementation")
                    or DEFAULT_ATTN, "rope_scaling": scalings.get(name) if name else None,
                    "revision": revision, **overrides}
        return cls(source=source, name=name, **settings)

    def replace(self, **changes: Any) -> ModelSpec:
        return replace(self, **changes)


def as_spec(spec: ModelSpec | str | Path) -> ModelSpec:
    """A bare directory or id is the checkpoint exactly as its files say (no YaRN, no revision pin)."""
    return spec if isinstance(spec, ModelSpec) else ModelSpec(source=str(spec))


def yarn_window(rope_scaling: Mapping[str, Any]) -> int:
    """Static YaRN's maximum position: factor x original window (App. B: 40,960 x 4 = 163,840)."""
    if "factor" not in rope_scaling or "original_max_position_embeddings" not in rope_scaling:
        raise UserError("rope_scaling needs 'factor' and 'original_max_position_embeddings'")
    return int(float(rope_scaling["factor"]) * int(rope_scaling["original_max_position_embeddings"]))


def apply_rope_scaling(config: Any, rope_scaling: dict[str, Any] | None) -> Any:
    """Static YaRN (App. B, J.1): merge the scaling into the config's rope parameters.

    The maximum position becomes factor x original_max_position_embeddings
    (40,960 x 4 = 163,840 for the teacher; x 2 = 81,920 for Qwen3-4B).
    """
    if not rope_scaling:
        return config
    window = yarn_window(rope_scaling)
    params = dict(getattr(config, "rope_parameters", None) or {})
    params.update(rope_scaling)
    params.setdefault("rope_type", "yarn")
    config.rope_parameters = params
    config.max_position_embeddings = window
    return config


def _torch_dtype(dtype: str | None):
    import torch

    return None if dtype is None else getattr(torch, dtype)


def checkpoint_directory(spec: ModelSpec | str | Path) -> Path:
    """The directory a model is read from: a local checkpoint, or an HF id's cached snapshot of its revision."""
    spec = as_spec(spec)
    if spec.is_local:
        return _local_dir(spec.source)
    from huggingface_hub import snapshot_download  # App. J.1: loaded offline from a local cache

    try:
        return Path(snapshot_download(spec.source, revision=spec.revision, local_files_only=True))
    except (OSError, ValueError) as err:  # not cached (LocalEntryNotFoundError), or not a valid id
        at = f" at revision {spec.revision}" if spec.revision else ""
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"unknown model id {spec.source!r}{at}, or it is not in the local Hugging Face cache "
                        f"(nothing is downloaded): {reason}") from None


def load_tokenizer(spec: ModelSpec | str | Path):
    """The `TextTokenizer` of a local model directory or an HF id's pinned snapshot."""
    spec = as_spec(spec)
    directory = checkpoint_directory(spec)
    if (directory / REMAP_FILE).exists():
        return CompactTokenizer.load(directory)
    if not any((directory / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise UserError(f"{directory}: no tokenizer files ({REMAP_FILE} or tokenizer.json)")
    return _auto_tokenizer(str(directory), spec.source)


def _auto_tokenizer(source: str, name: str) -> HFTextTokenizer:
    from transformers import AutoTokenizer

    try:
        return HFTextTokenizer(AutoTokenizer.from_pretrained(source, local_files_only=True), name)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load the tokenizer of {name!r} (offline): {str(err).splitlines()[0]}") from None


def _local_dir(spec: str) -> Path:
    directory = Path(spec)
    if not directory.is_dir():
        raise UserError(f"{spec}: no such model directory (expected config.json and safetensors weights)")
    if not (directory / "config.json").exists():
        raise UserError(f"{directory}: missing config.json")
    if not any((directory / f).exists() for f in WEIGHT_PATTERNS):
        raise UserError(f"{directory}: missing model weights (model.safetensors); train or fetch them first")
    return directory


def weight_shards(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint (one file, or the shards its index names); [] for a .bin."""
    index = directory / "model.safetensors.index.json"
    if (directory / "model.safetensors").exists():
        return [directory / "model.safetensors"]
    if not index.exists():
        return []
    weight_map = read_json(index, "weights index")
    weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserError(f"{index}: no 'weight_map'; re-fetch the checkpoint")
    return [directory / name for name in sorted(set(map(str, weight_map.values())))]


def check_local_files(directory: Path) -> None:
    """Read a local checkpoint's config.json and safetensors headers before transformers does, so a
    corrupt config or a truncated weights file is named instead of passing for an unknown model."""
    config_path = directory / "config.json"
    config = read_json(config_path, "model config")
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise UserError(f"{config_path}: no 'model_type' key; not a transformers model config "
                        "(re-save or re-fetch the checkpoint)")
    from safetensors import SafetensorError, safe_open

    for shard in weight_shards(directory):
        if not shard.is_file():
            raise UserError(f"{shard}: missing weights shard named in model.safetensors.index.json; "
                            "re-fetch the checkpoint")
        try:
            with safe_open(str(shard), framework="pt"):
                pass
        except SafetensorError as err:
            reason = str(err).splitlines()[0]
            raise UserError(f"{shard}: unreadable weights ({reason}); {WEIGHTS_HINT}") from None


def set_threads(models_section: dict, override: int | str | None = None) -> None:
    """Intra-op threads from the profile's `models.threads` (a flag overrides; null keeps torch's default).

    A fixed count makes a stage's float reductions split the same way on a 2-core laptop and a
    16-core host, so the demo's numbers do not depend on the machine's core count.
    """
    threads = override if override is not None else models_section.get("threads")
    if threads:
        import torch

        torch.set_num_threads(int(threads))


def resolve_device(name: str | None) -> str:
    """The profile's `models.device`: `auto` (or unset) is cuda when a GPU is visible, else cpu."""
    if name in (None, "auto"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(name)


def load_model(spec: ModelSpec | str | Path, *, device: str | None = None):
    """(model, tokenizer) as the spec says, in eval mode.

    A bare directory is loaded as its files say; a profile's model is loaded through
    `ModelSpec.from_params`, which carries its YaRN factor, revision and dtype.
    """
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = as_spec(spec)
    directory = checkpoint_directory(spec)
    check_local_files(directory)
    offline = {"local_files_only": True}  # never resolve to another revision (App. J.1)
    try:
        config = AutoConfig.from_pretrained(str(directory), **offline)
    except (OSError, ValueError) as err:  # its config.json parsed (check_local_files): transformers rejects it
        raise UserError(f"{directory}/config.json: transformers cannot build a config from it "
                        f"({str(err).splitlines()[0]}); re-save or re-fetch the checkpoint") from None
    apply_rope_scaling(config, spec.rope_scaling)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(directory), config=config, dtype=_torch_dtype(spec.dtype),
                                                     attn_implementation=spec.attn_implementation, **offline)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load the weights of {spec.source!r}: {str(err).splitlines()[0]}") from None
    except SafetensorError as err:
        raise UserError(f"cannot load the weights of {spec.source!r}: {str(err).splitlines()[0]}; "
                        f"{WEIGHTS_HINT}") from None
    if device:
        model = model.to(device)  # a device move keeps every dtype
    tokenizer = load_tokenizer(spec)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise UserError(f"{spec.source}: tokenizer has {tokenizer.vocab_size} ids but the model only "
                        f"{model.config.vocab_size}")
    return model.eval(), tokenizer


def rope_buffers(model) -> dict[str, Any]:
    """Every RoPE frequency buffer of a model by name (what must stay fp32)."""
    return {name: buf for name, buf in model.named_buffers() if name.rsplit(".", 1)[-1] in ROPE_BUFFERS}


def cast_weights(model, dtype):
    """A built model's weights in `dtype`, as `from_pretrained(dtype=...)` would have loaded them.

    Parameters and stored buffers change dtype; RoPE's `inv_freq` (computed in fp32, never stored)
    keeps its fp32 tensor, which `model.to(dtype)` alone would round.  For models built in memory
    (tests, benchmarks); a checkpoint is loaded in its dtype instead.
    """
    rope = rope_buffers(model)
    model.to(dtype)
    for name, fp32 in rope.items():  # `to` made new tensors; the fp32 originals go back in their place
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner)._buffers[leaf] = fp32
    return model
