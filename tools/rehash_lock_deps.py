"""Record today's md5 and size of edited code files in every stage's lock entry that names them.

    python tools/rehash_lock_deps.py src/mistill/distill/trainer.py [more files ...]

This is `dvc commit` for a code edit whose outputs are known to be unchanged, in a checkout that does
not hold the artifacts `dvc commit` would hash: use it only after showing, on the real chain, that the
edited code writes every stage's outputs byte for byte as before (the commit that uses it says how).
An edit that can change an output needs the stage rerun instead (`dvc repro`), which records the lock
entry itself. `tests/repro/test_pipeline.py` checks that no lock names an out-of-date code file.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from mistill.io import atomic_open  # noqa: E402
from mistill.repro.pipeline import lock_files  # noqa: E402


def rehash(lock_text: str, path: str, md5: str, size: int) -> tuple[str, int]:
    """The lock with every dependency entry on `path` given `md5` and `size`; how many entries changed."""
    entry = re.compile(rf"(- path: {re.escape(path)}\n(\s+)hash: md5\n\2md5: )([0-9a-f]{{32}})(\n\2size: )(\d+)")
    count = 0

    def replace(match: re.Match) -> str:
        nonlocal count
        if (match.group(3), match.group(5)) != (md5, str(size)):
            count += 1
        return f"{match.group(1)}{md5}{match.group(4)}{size}"

    return entry.sub(replace, lock_text), count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="code files, relative to the repository root")
    args = parser.parse_args(argv)
    for lock in lock_files(REPO):
        text = (REPO / lock).read_text(encoding="utf-8")
        total = 0
        for path in args.files:
            data = (REPO / path).read_bytes()
            text, count = rehash(text, path, hashlib.md5(data).hexdigest(), len(data))
            total += count
        if total:
            with atomic_open(REPO / lock, "w", encoding="utf-8") as fh:
                fh.write(text)
            print(f"{lock}: {total} entries")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
