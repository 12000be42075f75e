"""tools/rehash_lock_deps.py gives a code file's lock entries its md5 and size, and touches nothing else."""

import importlib.util

from tests.repro.repro_helpers import REPO

spec = importlib.util.spec_from_file_location("rehash_lock_deps", REPO / "tools" / "rehash_lock_deps.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)

LOCK = """schema: '2.0'
stages:
  a:
    cmd: mistill a
    deps:
    - path: src/x.py
      hash: md5
      md5: 11111111111111111111111111111111
      size: 10
    - path: src/xy.py
      hash: md5
      md5: 22222222222222222222222222222222
      size: 20
  b:
    cmd: mistill b
    deps:
    - path: src/x.py
      hash: md5
      md5: 33333333333333333333333333333333
      size: 30
"""


def test_every_entry_of_the_file_and_only_it_is_rehashed():
    text, count = tool.rehash(LOCK, "src/x.py", "a" * 32, 12)
    assert count == 2
    assert text == LOCK.replace("1" * 32, "a" * 32).replace("3" * 32, "a" * 32) \
        .replace("size: 10", "size: 12").replace("size: 30", "size: 12")
    assert tool.rehash(text, "src/x.py", "a" * 32, 12) == (text, 0)   # already current
