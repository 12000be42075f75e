"""A model's fingerprint from its files, never from its loaded weights.

Teacher targets name the teacher they were computed from, and a training run refuses targets of
another teacher (App. I.5).  Hashing a loaded model's parameters would mean holding a 14B teacher
in memory in every training run only to name it; its files name it as well, at the cost of reading
a few kilobytes:

* a small file (config, tokenizer, the demo models' weights) by its full sha256;
* a large file in the Hugging Face cache by its blob's name, which is the sha256 the hub computed
  over its bytes (the cache stores each LFS file as `blobs/<sha256>`);
* any other large safetensors file by its size and header (every tensor's name, dtype, shape and
  byte range), which changes with any re-save, re-shard or truncation.

What a model computes also depends on how it is loaded: `model_fingerprint` adds the dtype and the
static YaRN scaling to the weights' fingerprint.  The attention implementation is left out: eager
and sdpa are the same function.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from pathlib import Path

from mistill.errors import UserError
from mistill.io import file_sha256
from mistill.models.loading import ModelSpec, as_spec, checkpoint_directory

FULL_HASH_BYTES = 64 << 20   # files up to 64 MiB are hashed in full (every demo checkpoint)
IDENTITY_SUFFIXES = (".json", ".safetensors", ".bin", ".txt", ".model", ".jinja", ".tiktoken")
SHA256_NAME = re.compile(r"^[0-9a-f]{64}$")


def identity_files(directory: Path) -> list[Path]:
    """The files that decide what a checkpoint computes: config, weights, tokenizer; not logs or cards."""
    return sorted(p for p in directory.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.name.endswith(IDENTITY_SUFFIXES)
                  and not p.name.endswith("_log.json"))


def safetensors_header(path: Path) -> bytes:
    """The header of a safetensors file: little-endian u64 length, then that many bytes of JSON."""
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise UserError(f"{path}: truncated safetensors file (no header); re-fetch the checkpoint")
        (length,) = struct.unpack("<Q", raw)
        header = fh.read(length)
    if len(header) < length:
        raise UserError(f"{path}: truncated safetensors header; re-fetch the checkpoint")
    return header


def file_fingerprint(path: Path) -> str:
    """One file's identity: its sha256, its cache blob's sha256, or (large safetensors) size and header."""
    size = path.stat().st_size
    if size <= FULL_HASH_BYTES:
        return f"sha256:{file_sha256(path)}"
    blob = path.resolve()
    if path.is_symlink() and blob.parent.name == "blobs" and SHA256_NAME.match(blob.name):
        return f"sha256:{blob.name}"
    if path.suffix == ".safetensors":
        return f"header:{size}:{hashlib.sha256(safetensors_header(path)).hexdigest()}"
    return f"sha256:{file_sha256(path)}"


def weights_fingerprint(spec: ModelSpec | str | Path) -> str:
    """sha256 over a checkpoint's identity files (name and fingerprint of each), read from disk only."""
    directory = checkpoint_directory(spec)
    files = identity_files(directory)
    if not files:
        raise UserError(f"{directory}: no config, weights or tokenizer files to fingerprint")
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}\0{file_fingerprint(path)}\0".encode())
    return digest.hexdigest()


def model_fingerprint(spec: ModelSpec | str | Path) -> str:
    """The weights' fingerprint and the load settings that change what they compute (dtype, YaRN)."""
    spec = as_spec(spec)
    loading = json.dumps({"dtype": spec.dtype, "rope_scaling": spec.rope_scaling}, sort_keys=True)
    return hashlib.sha256(f"{weights_fingerprint(spec)}\0{loading}".encode()).hexdigest()
