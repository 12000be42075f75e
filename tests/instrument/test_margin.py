"""The bf16 grid margins of a bfloat16 teacher sit on (R-C11's bf16_logit_grid)."""

import pytest
import torch

from mistill.instrument.margin import bf16_spacing


@pytest.mark.parametrize("x", [16.0, 16.3, 31.9, -20.5, 8.5, 0.7, 1000.0, 1e-3])
def test_bf16_spacing_is_the_gap_to_the_next_bfloat16(x):
    """Against torch's own bfloat16: the next representable number up from x rounded to bf16."""
    b = torch.tensor(abs(x), dtype=torch.bfloat16)
    gap = float(torch.nextafter(b, torch.tensor(float("inf"), dtype=torch.bfloat16)) - b)
    assert bf16_spacing(x) == gap


def test_bf16_spacing_at_the_papers_margins_is_an_eighth_of_a_nat():
    assert bf16_spacing(16.0) == bf16_spacing(31.99) == 0.125 and bf16_spacing(0.0) == 0.0
