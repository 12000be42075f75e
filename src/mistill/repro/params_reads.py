"""DVC's params reads, one parse per file version: a stage's params checks without re-reading params.yaml.

For every stage it checks or records, DVC reads each params dependency's file whole
(`dvc.dependency.param.read_param_file` -> `load_path`): this repository's params.yaml holds every profile
(about 1,700 lines), so each stage parses it two or three times, about 0.1 s each on two cores. `cached_load`
keeps one parse per (path, size, modification time, inode) for the life of the `dvc` process and hands each
caller a deep copy, so nothing a caller does to its copy reaches another's; an edit of the file during the run
gives it a new key and a fresh parse. `python -m mistill.repro.dvc_run` installs it.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from dvc.dependency import param

DVC_LOAD_PATH = param.load_path
_parsed: dict[tuple, Any] = {}


def _version(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino)


def cached_load(path, fs, **kwargs) -> Any:
    """`dvc.utils.serialize.load_path`, parsed once per version of a local file."""
    version = _version(os.fspath(path)) if getattr(fs, "protocol", None) == "local" and not kwargs else None
    if version is None:
        return DVC_LOAD_PATH(path, fs, **kwargs)
    if version not in _parsed:
        _parsed[version] = DVC_LOAD_PATH(path, fs)
    return copy.deepcopy(_parsed[version])


def install() -> None:
    """Put `cached_load` in place of the params reads' `load_path` for this process."""
    param.load_path = cached_load
