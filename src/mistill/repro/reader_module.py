"""A result's reader as a module.

`readers/` is a folder of scripts that DVC runs, not a package, so code that calls a reader's functions
(another reader, the tests) loads it from its file. The module is not entered in `sys.modules`: two
copies of one reader (the repository's and the rehearsal's) load side by side without replacing each
other.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from mistill.errors import UserError


def load_reader(path: Path | str) -> ModuleType:
    """The reader at `path`, executed once as a fresh module."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no reader at {path}")
    spec = importlib.util.spec_from_file_location(f"mistill_reader_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
