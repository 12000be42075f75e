"""Calibration by simulation (App. C "Statistics").

- Why t-tests, not bootstrap percentile p-values, feed Benjamini-Hochberg: the paper's
  synthetic check on pure noise gave 13 BH discoveries from bootstrap percentile
  p-values.  Reproduced here (fast): 100 notes x 1,600 heads of pure noise, 1,000
  resamples.  The bootstrap p-value is quantised at 1/1,000 and is exactly 0 for any
  head whose resampled means never cross zero, which happens for a few null heads
  every time (the percentile interval is narrower than the t interval: it uses the
  plug-in s.d. and normal rather than Student tails); BH must reject every p = 0, so
  noise yields discoveries.  The t-test p-values of the same data yield none.  The count
  depends on the noise and the number of notes (Gaussian noise over 100 notes gives 2-5 per
  world here); the paper's 13 is not a target.
- Slow: under a complete null BH over t-test p-values declares essentially nothing, and
  percentile bootstrap 95% intervals of a mean paired difference cover the truth ~95%.
"""

import numpy as np
import pytest

from mistill.stats.bootstrap import (
    NoteCounts,
    bootstrap_percentile_p_values,
    paired_bootstrap_mean_difference,
    paired_corpus_bootstrap_difference,
)
from mistill.stats.multiple import benjamini_hochberg, head_discoveries

N_NOTES, N_HEADS = 100, 1600  # the paper's characterization: 100 notes, 40 layers x 40 heads


def test_bootstrap_percentile_p_values_give_spurious_discoveries_t_tests_do_not():
    bootstrap_found, t_found, zero_p = [], [], []
    for world in range(5):
        noise = np.random.default_rng(100 + world).normal(size=(N_NOTES, N_HEADS))
        p_boot = bootstrap_percentile_p_values(noise, n_resamples=1000, seed=world)
        bootstrap_found.append(benjamini_hochberg(p_boot, 0.05).n_discoveries)
        t_found.append(head_discoveries(noise, 0.05).discoveries.n_discoveries)
        zero_p.append(int((p_boot == 0).sum()))
    # Pure noise: every discovery is false.
    assert sum(t_found) == 0, t_found
    assert sum(bootstrap_found) >= 10, bootstrap_found  # measured: [2, 4, 4, 5, 3] for these seeds
    assert sum(b > 0 for b in bootstrap_found) >= 4
    # The mechanism: p-values of exactly 0 from 1,000 resamples, which BH cannot refuse.
    assert all(b >= z > 0 for b, z in zip(bootstrap_found, zero_p)), (bootstrap_found, zero_p)


@pytest.mark.slow
def test_bh_declares_essentially_nothing_under_a_complete_null():
    n_worlds = 300
    found = np.array(
        [
            head_discoveries(
                np.random.default_rng(world).normal(size=(N_NOTES, N_HEADS)), 0.05
            ).discoveries.n_discoveries
            for world in range(n_worlds)
        ]
    )
    print(f"BH under a complete null: mean {found.mean():.3f} discoveries, P(any) {(found > 0).mean():.3f}")
    # Under a complete null BH's FDR is the family-wise error rate: P(any discovery) <= 0.05.
    assert found.mean() < 0.15, found.mean()
    assert (found > 0).mean() <= 0.08, (found > 0).mean()


@pytest.mark.slow
def test_bh_keeps_the_false_discovery_share_with_real_effects():
    shares = []
    for world in range(100):
        rng = np.random.default_rng(10_000 + world)
        per_note = rng.normal(size=(N_NOTES, N_HEADS))
        per_note[:, :80] += rng.choice([-0.5, 0.5], size=80)  # 80 real heads, both signs
        rejected = head_discoveries(per_note, 0.05).discoveries.rejected
        shares.append(rejected[80:].sum() / max(rejected.sum(), 1))
    assert np.mean(shares) <= 0.05 + 0.01  # BH: E[false share] <= (m0/m) * 0.05


@pytest.mark.slow
@pytest.mark.parametrize("noise", ["normal", "skewed"])
def test_paired_bootstrap_intervals_cover_the_true_difference(noise):
    n_replicates, n_notes, true_difference = 2000, 150, 0.03
    covered = 0
    for rep in range(n_replicates):
        rng = np.random.default_rng(rep)
        b = rng.uniform(0, 1, n_notes)
        if noise == "normal":
            error = rng.normal(0, 0.1, n_notes)
        else:  # centred exponential: skewed per-note differences
            error = rng.exponential(0.1, n_notes) - 0.1
        a = b + true_difference + error
        interval = paired_bootstrap_mean_difference(a, b, n_resamples=1000, seed=rep)
        covered += interval.low <= true_difference <= interval.high
    coverage = covered / n_replicates
    print(f"paired bootstrap coverage ({noise}): {coverage:.4f}")
    # Monte Carlo s.e. at 0.95 with 2,000 replicates is 0.005; the percentile interval runs
    # slightly short at finite n.
    assert 0.925 <= coverage <= 0.965, coverage


@pytest.mark.slow
def test_corpus_micro_f1_bootstrap_covers_the_population_difference():
    # Notes drawn from a population with known expected counts; the estimand is the
    # difference of 2 E[tp] / (2 E[tp] + E[fp] + E[fn]) between two arms on the same notes.
    n_replicates, n_notes = 600, 150
    gold_rate, hit_a, hit_b, fp_a, fp_b = 6.0, 0.30, 0.25, 2.0, 1.5
    f1 = lambda hit, fp: 2 * gold_rate * hit / (2 * gold_rate * hit + fp + gold_rate * (1 - hit))
    truth = f1(hit_a, fp_a) - f1(hit_b, fp_b)
    covered = 0
    for rep in range(n_replicates):
        rng = np.random.default_rng(rep)
        gold = 3 + rng.poisson(gold_rate - 3, n_notes)
        tp_a, tp_b = rng.binomial(gold, hit_a), rng.binomial(gold, hit_b)
        arm_a = NoteCounts(tp_a, rng.poisson(fp_a, n_notes), gold - tp_a)
        arm_b = NoteCounts(tp_b, rng.poisson(fp_b, n_notes), gold - tp_b)
        interval = paired_corpus_bootstrap_difference(arm_a, arm_b, n_resamples=2000, seed=rep)
        covered += interval.low <= truth <= interval.high
    print(f"corpus micro-F1 bootstrap coverage: {covered / n_replicates:.4f}")
    assert 0.92 <= covered / n_replicates <= 0.975, covered / n_replicates
