"""The check catches Mistill with its attention term off (the λ = 0 mutant, `mistill.repro.mutants`).

The mutant reruns the Mistill arms (DT-001, EV-mistill, M6-mistill) and the readers of R-D5, R-D6, R-D18
and R-D19 in a scratch workspace with no mechanism term in the loss, the Vanilla and untrained arms
linked from this checkout; at least one key of R-D5 or R-D6 must then fail the demo's check.

It needs the demo's artifacts of this checkout (`nox -s repro`, or `dvc pull` from a remote that holds
them): about ten minutes on two cores once they are there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mistill.params import load_params
from mistill.repro.mutants import MutantsConfig, run_mutants
from mistill.repro.pipeline import stage_addresses
from tests.repro.repro_helpers import REPO

pytestmark = pytest.mark.slow


def _inputs_current(config: MutantsConfig) -> bool:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "DVC_NO_ANALYTICS": "1"}
    dvc = shutil.which("dvc", path=env["PATH"])
    if dvc is None or not all((REPO / path).exists() for path in config.inputs):
        return False
    status = subprocess.run([dvc, "status", *stage_addresses(REPO, config.kept).values()], cwd=REPO, env=env,
                            capture_output=True, text=True)
    return status.returncode == 0 and "up to date" in status.stdout


def test_the_lambda0_mutant_fails_a_headline_key():
    params = load_params(REPO / "params.yaml")
    config = MutantsConfig.from_params(params)
    if not _inputs_current(config):
        pytest.skip("the demo's artifacts are not built here (nox -s repro, or dvc pull)")
    (outcome,) = run_mutants(REPO, params, ["lambda0"], log=lambda line: None)
    assert outcome.caught, f"no key of {', '.join(config.headline)} fails with the attention term off"
    assert all(key.split()[0] in config.headline for key in outcome.headline_failing)
