"""RT-003 gives the same bytes on every CPU: ties are broken by rule, never by the SIMD path."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mistill.world.shortlist import SCORE_DECIMALS, TfidfEncoder, _ranks


def test_vocabulary_cap_breaks_count_ties_by_term():
    # one word per text (no bigrams): bb 3, then aa, cc and dd tie at 2, ee 1
    texts = ["bb", "dd", "bb", "cc", "aa", "dd", "bb", "cc", "aa", "ee"]
    encoder = TfidfEncoder(max_features=3)
    encoder.fit(texts)
    assert sorted(encoder.vectorizer.vocabulary_) == ["aa", "bb", "cc"]   # cc before dd: tie by term


def test_ranks_treat_last_bit_differences_as_ties():
    base = 0.123456789
    scores = np.array([base + 1e-15, 0.9, base, base - 1e-15])
    # the three near-equal scores tie once rounded: the shared order breaks the tie
    assert _ranks(scores).tolist() == [2, 1, 3, 4]
    assert _ranks(scores[::-1]).tolist() == [2, 3, 1, 4]
    assert 10.0 ** -SCORE_DECIMALS > 1e3 * np.finfo(np.float64).eps


_RUN = """
import json, sys
from mistill.world.demo_notes import NoteGeneratorConfig, generate_notes
from mistill.world.inventory import demo_inventory
from mistill.world.shortlist import Retriever, RetrieverConfig
inv = demo_inventory(200, 0)
notes = generate_notes(inv, NoteGeneratorConfig(n_patients=60), seed=1)
train, held = notes[:40], notes[40:]
retriever = Retriever(inv, RetrieverConfig(tfidf_max_features=400)).fit(train)
json.dump([retriever.ranking(n) for n in held], sys.stdout)
"""


def _avx512_features() -> list[str]:
    from numpy._core._multiarray_umath import __cpu_features__

    return [name for name, present in __cpu_features__.items()
            if present and (name.startswith("AVX512") or name == "X86_V4")]


@pytest.mark.skipif(not _avx512_features(), reason="needs a CPU whose numpy dispatches to AVX-512")
def test_rankings_equal_with_and_without_avx512_dispatch():
    """numpy's AVX-512 argsort orders ties differently from its AVX2 one: the rankings must not care."""
    def rankings(extra_env: dict[str, str]) -> list[list[str]]:
        env = {**os.environ, **extra_env}
        out = subprocess.run([sys.executable, "-c", _RUN], env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    plain = rankings({})
    without = rankings({"NPY_DISABLE_CPU_FEATURES": ",".join(_avx512_features()),
                        "OPENBLAS_CORETYPE": "Haswell"})
    assert plain == without
