"""DVC's run-cache entry from the hashes the stage has just saved: each dependency hashed once after a run.

After a stage's command, DVC saves the stage (`dvc.stage.Stage.save`): it hashes every dependency
(`save_deps`), then records the run in its run cache (`dvc.stage.cache.StageCache.save`), which asks every
dependency for its hash twice more (`_can_hash`, then `_get_stage_hash`, which calls `_can_hash` again), and
each ask hashes the files anew. A reader that depends on the own-heads chains' directories (artifacts/M6
and artifacts/HD-S, about 7,000 files) walks them three times in a row after a command of half a second.
Nothing changes a dependency between those calls (DVC holds the stage's read lock on them), so while
`StageCache.save` runs, each dependency that exists answers with the hash `save_deps` stored a moment
before. The run-cache entry, the lock and every decision DVC makes are unchanged.
`python -m mistill.repro.dvc_run` installs it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from dvc.stage.cache import StageCache

DVC_STAGE_CACHE_SAVE = StageCache.save


@contextmanager
def saved_hashes(deps: Iterable) -> Iterator[None]:
    """Within the block, `dep.get_hash()` of each existing dependency returns its saved `hash_info`."""
    answered = []
    for dep in deps:
        if dep.hash_info and dep.exists:   # a missing one keeps DVC's answer (nothing to hash)
            dep.get_hash = lambda info=dep.hash_info: info   # an instance attribute over the class's method
            answered.append(dep)
    try:
        yield
    finally:
        for dep in answered:
            del dep.get_hash


def save(stage_cache: StageCache, stage) -> None:
    """`StageCache.save`, the stage's dependencies answering with the hashes `Stage.save` has just computed."""
    with saved_hashes(stage.deps):
        return DVC_STAGE_CACHE_SAVE(stage_cache, stage)


def install() -> None:
    """Put `save` in place of the run cache's save for this process."""
    StageCache.save = save
