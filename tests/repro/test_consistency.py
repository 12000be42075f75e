"""dvc.yaml, registry.yaml and REGISTRY.md agree."""

import yaml

from mistill.repro.consistency import consistency_problems, dvc_stage_names
from mistill.repro.registry import load_registry
from mistill.repro.registry_md import write_registry_md
from tests.repro.repro_helpers import REPO

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def set_status(root, rid, status):
    path = root / "registry.yaml"
    data = yaml.load(path.read_text(), Loader=LOADER)
    data["results"][rid]["status"] = status
    path.write_text(yaml.dump(data, Dumper=DUMPER, sort_keys=False))


def no_demo_results(root):
    """The scratch registry as it was before any result ran on the demo."""
    path = root / "registry.yaml"
    data = yaml.load(path.read_text(), Loader=LOADER)
    for entry in data["results"].values():
        if entry["status"] == "demo":
            entry["status"] = "planned"
    path.write_text(yaml.dump(data, Dumper=DUMPER, sort_keys=False))


def test_the_repository_is_consistent(registry):
    assert consistency_problems(registry) == []
    # Whatever dvc.yaml holds, its R-* stages are exactly the demo results.
    stages = {s for s in dvc_stage_names(REPO / "dvc.yaml") if s.startswith("R-")}
    assert stages == {rid for rid, r in registry.results.items() if r.status == "demo"}


def test_stage_for_a_result_not_marked_demo_is_reported(scratch_root):
    no_demo_results(scratch_root)
    (scratch_root / "dvc.yaml").write_text(
        "stages:\n  corpus:\n    cmd: mistill world corpus\n  R-C1:\n    cmd: python readers/r_c1.py\n"
        "  R-C77:\n    cmd: x\n")
    registry = load_registry(scratch_root)
    write_registry_md(registry)
    problems = consistency_problems(registry)
    assert problems == ["dvc.yaml stage R-C1: registry status is planned, not demo",
                        "dvc.yaml stage R-C77: not a registered result id"]


def test_demo_result_without_stage_or_goldens_is_reported(scratch_root):
    no_demo_results(scratch_root)
    set_status(scratch_root, "R-C3", "demo")
    registry = load_registry(scratch_root)
    write_registry_md(registry)
    assert consistency_problems(registry) == [
        "R-C3: status demo but dvc.yaml has no stage named R-C3",
        "R-C3: status demo but results/expected/demo.yaml has no values for it"]


def test_stale_registry_md_is_reported(scratch_root):
    no_demo_results(scratch_root)
    registry = load_registry(scratch_root)
    assert any("REGISTRY.md: stale" in p for p in consistency_problems(registry))
    write_registry_md(registry)
    assert consistency_problems(registry) == []
