"""A recipe variant's own-heads chain traces the edits only where a result reads them."""

from __future__ import annotations

import pytest
import yaml

from mistill.errors import UserError
from mistill.evaluate.own_heads import STAGES
from mistill.evaluate.own_heads_commands import variant_stages

PARAMS = {"variants": {"arms": {"nowindow": {}, "fp32pick": {}}, "own_traces": {"fp32pick": {}}}}


def test_a_variant_no_result_reads_skips_only_the_edits():
    assert variant_stages(list(STAGES), "nowindow", PARAMS) == ["attribute", "knockin", "readside"]


def test_a_variant_read_on_its_own_traces_keeps_every_stage():
    assert variant_stages(list(STAGES), "fp32pick", PARAMS) == list(STAGES)


def test_an_unknown_variant_is_refused():
    with pytest.raises(UserError, match="variants.arms"):
        variant_stages(list(STAGES), "nosuch", PARAMS)


@pytest.mark.parametrize("profile", ["demo", "paper", "rehearsal"])
def test_every_profile_reads_edits_of_the_variants_r_d30_reads(profile):
    """R-D30 reads the edits of exactly the variants it reads on their own traces."""
    section = yaml.safe_load(open("params.yaml"))[profile]
    own = set(section["variants"]["own_traces"])
    kept = {k for k in section["variants"]["arms"] if "edits" in variant_stages(list(STAGES), k, section)}
    assert kept == own and own
