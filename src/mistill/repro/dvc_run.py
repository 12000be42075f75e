"""`python -m mistill.repro.dvc_run ARGS`: `dvc ARGS` without four of its per-stage costs.

Between two stages of a `dvc repro`, DVC rewrites the whole `dvc.lock` of the stage it ran, re-reads the
whole params.yaml for every params check, hashes each dependency of the stage it ran three times and walks
a directory dependency again for every stage that reads it; here the lock update rewrites only the stage's own
lines (`mistill.repro.lock_update`), each version of a params file is parsed once (`mistill.repro.params_reads`),
the run cache takes the hashes the stage has just saved (`mistill.repro.run_cache_hashes`) and a dependency's
build is kept until a stage writes under it (`mistill.repro.dependency_hashes`).
What DVC runs, records and decides is unchanged. `nox -s repro`, the calibration's replicates and the rehearsal
run their `dvc` so (docs/speed.md "Where the time goes"); a plain `dvc` is DVC as shipped.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dvc.cli import main as dvc_main

from mistill.repro import dependency_hashes, lock_update, params_reads, run_cache_hashes


def main(argv: Sequence[str] | None = None) -> int:
    lock_update.install()
    params_reads.install()
    run_cache_hashes.install()
    dependency_hashes.install()
    return dvc_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
