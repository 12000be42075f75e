"""`load_model(spec) -> (model, tokenizer)`: one loader for HF ids and local directories.

* A local directory (the demo models under `models/demo/`, or a downloaded
  checkpoint) must hold `config.json` and safetensors weights; its tokenizer is
  the compact remap (`tokenizer_remap.json`) or, failing that, the tokenizer
  files transformers reads.
* An HF id (`Qwen/Qwen3-14B`) is resolved from the local Hugging Face cache only:
  `HF_HUB_OFFLINE` is set so a missing checkpoint fails instead of resolving to
  another revision (App. J.1), and the failure is a one-line `UserError`.

Positional scaling is part of the characterized system (App. B): static YaRN is
applied from params (`rope_scaling`), factor x original window becoming the
model's maximum position, and the same dict is handed to vLLM.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from mistill.errors import UserError
from mistill.io import read_json
from mistill.models.architectures import DEFAULT_ATTN
from mistill.models.tokenizers import REMAP_FILE, CompactTokenizer, HFTextTokenizer

HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
WEIGHT_PATTERNS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
WEIGHTS_HINT = "the file looks truncated or corrupt: retrain or re-fetch it (or restore it: dvc checkout)"


def is_local_spec(spec: str) -> bool:
    """A spec names a local directory if it exists or cannot be an HF id (`owner/name`)."""
    return Path(spec).exists() or not HF_ID.match(spec) or spec.startswith((".", "/"))


def apply_rope_scaling(config: Any, rope_scaling: dict[str, Any] | None) -> Any:
    """Static YaRN (App. B, J.1): merge the scaling into the config's rope parameters.

    The maximum position becomes factor x original_max_position_embeddings
    (40,960 x 4 = 163,840 for the teacher; x 2 = 81,920 for Qwen3-4B).
    """
    if not rope_scaling:
        return config
    scaling = dict(rope_scaling)
    if "factor" not in scaling or "original_max_position_embeddings" not in scaling:
        raise UserError("rope_scaling needs 'factor' and 'original_max_position_embeddings'")
    params = dict(getattr(config, "rope_parameters", None) or {})
    params.update(scaling)
    params.setdefault("rope_type", "yarn")
    config.rope_parameters = params
    config.max_position_embeddings = int(scaling["factor"] * scaling["original_max_position_embeddings"])
    return config


def _torch_dtype(dtype: str | None):
    import torch

    if dtype is None:
        return None
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise UserError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16") from None


def load_tokenizer(spec: str):
    """The `TextTokenizer` of a local model directory or an HF id."""
    if is_local_spec(spec):
        directory = _local_dir(spec)
        if (directory / REMAP_FILE).exists():
            return CompactTokenizer.load(directory)
        if not any((directory / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
            raise UserError(f"{directory}: no tokenizer files ({REMAP_FILE} or tokenizer.json)")
        return _auto_tokenizer(str(directory), spec)
    os.environ["HF_HUB_OFFLINE"] = "1"
    return _auto_tokenizer(spec, spec)


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


def check_local_files(directory: Path) -> None:
    """Read a local checkpoint's config.json and safetensors headers before transformers does, so a
    corrupt config or a truncated weights file is named instead of passing for an unknown model."""
    config_path = directory / "config.json"
    config = read_json(config_path, "model config")
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise UserError(f"{config_path}: no 'model_type' key; not a transformers model config "
                        "(re-save or re-fetch the checkpoint)")
    index = directory / "model.safetensors.index.json"
    if (directory / "model.safetensors").exists():
        shards = [directory / "model.safetensors"]
    elif index.exists():
        weight_map = read_json(index, "weights index")
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserError(f"{index}: no 'weight_map'; re-fetch the checkpoint")
        shards = [directory / name for name in sorted(set(map(str, weight_map.values())))]
    else:
        return  # pytorch_model.bin: transformers reads it
    from safetensors import SafetensorError, safe_open

    for shard in shards:
        if not shard.is_file():
            raise UserError(f"{shard}: missing weights shard named in {index.name}; re-fetch the checkpoint")
        try:
            with safe_open(str(shard), framework="pt"):
                pass
        except SafetensorError as err:
            reason = str(err).splitlines()[0]
            raise UserError(f"{shard}: unreadable weights ({reason}); {WEIGHTS_HINT}") from None


def load_model(spec: str | Path, *, dtype: str | None = None, rope_scaling: dict[str, Any] | None = None,
               attn_implementation: str = DEFAULT_ATTN, device: str | None = None):
    """(model, tokenizer) for a local directory or an HF id, in eval mode."""
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = str(spec)
    local = is_local_spec(spec)
    if local:
        source = str(_local_dir(spec))
        check_local_files(Path(source))
    else:
        os.environ["HF_HUB_OFFLINE"] = "1"  # App. J.1: loaded offline from a local cache
        source = spec
    offline = {"local_files_only": True}  # never resolve to another revision (App. J.1)
    try:
        config = AutoConfig.from_pretrained(source, **offline)
    except (OSError, ValueError) as err:
        if local:  # its config.json parsed (check_local_files): transformers rejects what it says
            raise UserError(f"{source}/config.json: transformers cannot build a config from it "
                            f"({str(err).splitlines()[0]}); re-save or re-fetch the checkpoint") from None
        raise UserError(f"unknown model id {spec!r}, or it is not in the local Hugging Face cache "
                        f"(nothing is downloaded): {str(err).splitlines()[0]}") from None
    apply_rope_scaling(config, rope_scaling)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, config=config, dtype=_torch_dtype(dtype),
                                                     attn_implementation=attn_implementation, **offline)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load the weights of {spec!r}: {str(err).splitlines()[0]}") from None
    except SafetensorError as err:  # an HF id's cached weights (local ones are checked above)
        raise UserError(f"cannot load the weights of {spec!r}: {str(err).splitlines()[0]}; "
                        f"{WEIGHTS_HINT}") from None
    if device:
        model = model.to(device)
    tokenizer = load_tokenizer(spec)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise UserError(f"{spec}: tokenizer has {tokenizer.vocab_size} ids but the model only "
                        f"{model.config.vocab_size}")
    return model.eval(), tokenizer
