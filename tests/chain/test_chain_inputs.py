"""The reduced chain of the thread-agreement test builds every input the calibration's workspaces link.

That slow test clones the repository and runs `dvc repro` on its UPSTREAM stages before laying out
two replicate workspaces, which refuse a missing input; this check reads the stage graph instead, so
a calibration input added without its stage fails here in seconds, not after the chain has run.
"""

from __future__ import annotations

import networkx as nx
import pytest
from dvc.repo import Repo

from mistill.params import load_params
from mistill.repro.replicates import CalibrationConfig
from tests.chain.test_thread_agreement import UPSTREAM
from tests.repro.repro_helpers import REPO


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_upstream_stages_write_every_calibration_input():
    with Repo(str(REPO)) as repo:
        graph = repo.index.graph                      # edges point from a stage to what it depends on
        # a name is one item (LAS@<arm>) or a whole stage (every matrix item of it)
        built = [s for s in graph if s.name in UPSTREAM or s.name.split("@")[0] in UPSTREAM]
        assert {s.name if s.name in UPSTREAM else s.name.split("@")[0] for s in built} == set(UPSTREAM)
        ancestors = set(built).union(*(nx.descendants(graph, s) for s in built))
        outs = [out.fs_path for stage in ancestors for out in stage.outs]
    config = CalibrationConfig.from_params(load_params(REPO / "params.yaml"))
    missing = [inp for inp in config.inputs
               if not any(o == str(REPO / inp) or o.startswith(f"{REPO / inp}/") for o in outs)]
    assert missing == [], f"calibration inputs no UPSTREAM stage writes: {missing}"
