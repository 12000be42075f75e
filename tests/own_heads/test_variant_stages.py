"""A recipe variant's own-heads chain traces the edits only where a result reads them."""

from __future__ import annotations

import pytest
import yaml

from mistill.errors import UserError
from mistill.evaluate.own_heads import STAGES
from mistill.evaluate.own_heads_commands import variant_stages

PARAMS = {"variants": {"arms": {"nowindow": {}, "fp32pick": {}}, "edited": {"fp32pick": {}}}}


def test_a_variant_no_result_reads_skips_only_the_edits():
    assert variant_stages(list(STAGES), "nowindow", PARAMS) == ["attribute", "knockin", "readside"]


def test_a_variant_whose_edits_a_result_reads_keeps_every_stage():
    assert variant_stages(list(STAGES), "fp32pick", PARAMS) == list(STAGES)


def test_an_unknown_variant_is_refused():
    with pytest.raises(UserError, match="variants.arms"):
        variant_stages(list(STAGES), "nosuch", PARAMS)


@pytest.mark.parametrize("profile", ["demo", "paper", "rehearsal"])
def test_every_profile_edits_the_variants_r_d28_and_r_d30_read(profile):
    """The edits are kept for exactly params variants.edited: R-D30's own-trace variants (their edits beside their
    own traces) and R-D28's fp32 Mistill arms at both λs."""
    from mistill.distill.runs import FP32_MISTILL_VARIANTS
    from mistill.evaluate.matched import FAMILIES

    section = yaml.safe_load(open("params.yaml"))[profile]
    edited = set(section["variants"]["edited"])
    kept = {k for k in section["variants"]["arms"] if "edits" in variant_stages(list(STAGES), k, section)}
    assert kept == edited
    assert edited == {*section["variants"]["own_traces"], *FP32_MISTILL_VARIANTS, *FAMILIES["fp32"]}
