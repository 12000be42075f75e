"""The baseline arms' losses (App. J.3): DistiLLM-2's CALD and Feature-KD's two terms.

Hand-worked values, a direct float64 evaluation of each formula, and the properties the losses
must have (zero at the teacher, masking, gradients only into the student)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mistill.baselines import distillm2 as d2
from mistill.baselines import feature_kd as fkd
from mistill.distill import objective as obj
from mistill.distill import pooled_attention as pa
from mistill.errors import UserError

# ---------------------------------------------------------------------------------------------
# DistiLLM-2
# ---------------------------------------------------------------------------------------------


def _logits(seed, b=3, t=6, v=11, scale=3.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, t, v, generator=g, dtype=torch.float64) * scale).to(dtype)


def _mask(seed, b=3, t=6):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) > 0.4
    mask[:, 0] = True          # every sequence keeps at least one response token
    return mask


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def _slow(teacher, student, mask, alpha, kind):
    """Direct evaluation: loops over sequences, positions and the vocabulary in float64, the
    mixture formed in probability space; per-sequence token means, then the mean over sequences."""
    t, s, m = teacher.double().numpy(), student.double().numpy(), mask.numpy()
    per_seq = []
    for b in range(t.shape[0]):
        total, n = 0.0, 0
        for i in range(t.shape[1]):
            if not m[b, i]:
                continue
            p, q = _softmax(t[b, i]), _softmax(s[b, i])
            kl = 0.0
            for v in range(t.shape[2]):
                if kind == "skl":      # KL(p || a p + (1 - a) q)
                    kl += p[v] * math.log(p[v] / (alpha * p[v] + (1 - alpha) * q[v]))
                else:                  # KL(q || (1 - a) p + a q)
                    kl += q[v] * math.log(q[v] / ((1 - alpha) * p[v] + alpha * q[v]))
            total += kl
            n += 1
        per_seq.append(total / n)
    return sum(per_seq) / len(per_seq)


def test_hand_worked_one_token_three_words():
    # teacher logits (ln 2, 0, 0): p = (2, 1, 1) / 4 = (0.5, 0.25, 0.25)
    # student logits (ln 8, 0, 0): q = (8, 1, 1) / 10 = (0.8, 0.1, 0.1);  alpha = 0.1
    #
    # SKL:  m = 0.1 p + 0.9 q = (0.05 + 0.72, 0.025 + 0.09, 0.025 + 0.09) = (0.77, 0.115, 0.115)
    #       KL(p || m) = 0.5 ln(0.5 / 0.77) + 2 * 0.25 ln(0.25 / 0.115)
    #                  = 0.5 * (-0.4317824) + 0.5 * 0.7765288 = -0.2158912 + 0.3882644 = 0.1723732
    # SRKL: m' = 0.9 p + 0.1 q = (0.45 + 0.08, 0.225 + 0.01, 0.225 + 0.01) = (0.53, 0.235, 0.235)
    #       KL(q || m') = 0.8 ln(0.8 / 0.53) + 2 * 0.1 ln(0.1 / 0.235)
    #                   = 0.8 * 0.4117347 + 0.2 * (-0.8544153) = 0.3293878 - 0.1708831 = 0.1585047
    # CALD with the pair on both sides: beta = 1: 0.1723732 + 0.1585047 = 0.3308779
    #                                   beta = 0.5: 1.5 * 0.1723732 + 0.5 * 0.1585047 = 0.3378121
    teacher = torch.tensor([[[math.log(2.0), 0.0, 0.0]]])
    student = torch.tensor([[[math.log(8.0), 0.0, 0.0]]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    skl = d2.skew_forward_kl(teacher, student, mask, alpha=0.1)
    srkl = d2.skew_reverse_kl(teacher, student, mask, alpha=0.1)
    assert float(skl) == pytest.approx(0.1723732, abs=1e-6)
    assert float(skl) == pytest.approx(0.5 * math.log(0.5 / 0.77) + 0.5 * math.log(0.25 / 0.115), rel=1e-6)
    assert float(srkl) == pytest.approx(0.1585047, abs=1e-6)
    assert float(srkl) == pytest.approx(0.8 * math.log(0.8 / 0.53) + 0.2 * math.log(0.1 / 0.235), rel=1e-6)
    pair = d2.Response(teacher, student, mask)
    assert float(d2.distillm2_loss(pair, pair)) == pytest.approx(0.3308779, abs=1e-6)
    assert float(d2.distillm2_loss(pair, pair, beta=0.5)) == pytest.approx(0.3378121, abs=1e-6)


@pytest.mark.parametrize("alpha", [0.1, 0.37])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_matches_direct_evaluation_of_the_formula(alpha, dtype, tol):
    teacher, student, mask = _logits(0, dtype=dtype), _logits(1, dtype=dtype), _mask(2)
    assert abs(float(d2.skew_forward_kl(teacher, student, mask, alpha)) - _slow(teacher, student, mask, alpha, "skl")) < tol
    assert abs(float(d2.skew_reverse_kl(teacher, student, mask, alpha)) - _slow(teacher, student, mask, alpha, "srkl")) < tol
    # CALD with different responses (and batch sizes) on the two sides, beta = 1 and 1.25
    t_s, s_s, m_s = _logits(3, b=2, t=5, dtype=dtype), _logits(4, b=2, t=5, dtype=dtype), _mask(5, b=2, t=5)
    for beta in (1.0, 1.25):
        expected = (2 - beta) * _slow(teacher, student, mask, alpha, "skl") + beta * _slow(t_s, s_s, m_s, alpha, "srkl")
        got = d2.distillm2_loss(d2.Response(teacher, student, mask), d2.Response(t_s, s_s, m_s), alpha, beta)
        assert abs(float(got) - expected) < 2 * tol


def test_alpha_zero_is_plain_forward_and_reverse_kl():
    teacher, student, mask = _logits(6), _logits(7), _mask(8)
    log_p, log_q = torch.log_softmax(teacher, -1), torch.log_softmax(student, -1)
    forward = F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)   # KL(p || q)
    reverse = F.kl_div(log_p, log_q, log_target=True, reduction="none").sum(-1)   # KL(q || p)
    assert torch.allclose(d2.skew_forward_kl_per_token(teacher, student, 0.0), forward, atol=1e-6)
    assert torch.allclose(d2.skew_reverse_kl_per_token(teacher, student, 0.0), reverse, atol=1e-6)
    m = mask.float()
    assert float(d2.skew_forward_kl(teacher, student, mask, 0.0)) == pytest.approx(
        float(((forward * m).sum(-1) / m.sum(-1)).mean()), rel=1e-6)
    assert float(d2.skew_reverse_kl(teacher, student, mask, 0.0)) == pytest.approx(
        float(((reverse * m).sum(-1) / m.sum(-1)).mean()), rel=1e-6)


@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.9])
def test_zero_when_student_equals_teacher(alpha):
    logits, mask = _logits(9), _mask(10)
    pair = d2.Response(logits, logits.clone(), mask)
    assert abs(float(d2.skew_forward_kl(*pair, alpha=alpha))) < 1e-6
    assert abs(float(d2.skew_reverse_kl(*pair, alpha=alpha))) < 1e-6
    assert abs(float(d2.distillm2_loss(pair, pair, alpha))) < 1e-6


def test_non_negative():
    for seed in range(10):
        teacher, student = _logits(100 + seed, scale=6.0), _logits(200 + seed, scale=6.0)
        for alpha in (0.0, 0.1, 0.5, 0.99):
            assert float(d2.skew_forward_kl_per_token(teacher, student, alpha).min()) > -1e-6
            assert float(d2.skew_reverse_kl_per_token(teacher, student, alpha).min()) > -1e-6


def test_masked_positions_do_not_change_it():
    teacher, student, mask = _logits(11), _logits(12), _mask(13)
    noise_t, noise_s = _logits(14, scale=50.0), _logits(15, scale=50.0)
    off = ~mask[..., None]
    teacher2, student2 = torch.where(off, noise_t, teacher), torch.where(off, noise_s, student)
    assert not torch.equal(student2, student)
    for fn in (d2.skew_forward_kl, d2.skew_reverse_kl):
        assert float(fn(teacher2, student2, mask)) == pytest.approx(float(fn(teacher, student, mask)), abs=1e-7)


def test_gradients_are_finite_and_reach_only_the_student():
    for alpha in (0.0, 0.1):
        teacher = _logits(16).requires_grad_(True)
        student = _logits(17).requires_grad_(True)
        mask = _mask(18)
        loss = d2.distillm2_loss(d2.Response(teacher, student, mask), d2.Response(teacher, student, mask), alpha)
        loss.backward()
        assert teacher.grad is None or float(teacher.grad.abs().max()) == 0.0
        assert torch.isfinite(student.grad).all() and float(student.grad.abs().sum()) > 0
        # rows outside the response mask get no gradient
        assert float(student.grad[~mask].abs().max()) == 0.0


def _finite_difference(fn, x, h=1e-6):
    grad = np.zeros_like(x)
    for i in range(len(x)):
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (fn(up) - fn(down)) / (2 * h)
    return grad


def test_gradients_match_the_formula_and_the_official_stop_gradient():
    """SKL's gradient flows through the whole mixture; SRKL's (official code) holds the student's
    share of the mixture fixed. Both checked against float64 finite differences of the formula."""
    g = torch.Generator().manual_seed(19)
    t0 = torch.randn(7, generator=g, dtype=torch.float64)
    s0 = torch.randn(7, generator=g, dtype=torch.float64)
    p, q0, a = _softmax(t0.numpy()), _softmax(s0.numpy()), 0.1

    def skl(s):
        q = _softmax(s)
        return float(np.sum(p * np.log(p / (a * p + (1 - a) * q))))

    def srkl_full(s):
        q = _softmax(s)
        return float(np.sum(q * np.log(q / ((1 - a) * p + a * q))))

    def srkl_stopped(s):   # the mixture's student share frozen at q0
        q = _softmax(s)
        return float(np.sum(q * np.log(q / ((1 - a) * p + a * q0))))

    def grad(fn, **kw):
        s = s0.clone().requires_grad_(True)
        fn(t0, s, a, **kw).backward()
        return s.grad.numpy()

    x = s0.numpy()
    np.testing.assert_allclose(grad(d2.skew_forward_kl_per_token), _finite_difference(skl, x), atol=1e-7)
    np.testing.assert_allclose(grad(d2.skew_reverse_kl_per_token), _finite_difference(srkl_stopped, x), atol=1e-7)
    np.testing.assert_allclose(grad(d2.skew_reverse_kl_per_token, stop_mixture_grad=False),
                               _finite_difference(srkl_full, x), atol=1e-7)
    assert float(d2.skew_reverse_kl_per_token(t0, s0, a)) == pytest.approx(srkl_full(x), rel=1e-12)
    assert not np.allclose(_finite_difference(srkl_full, x), _finite_difference(srkl_stopped, x), atol=1e-4)


def test_teacher_mass_zero_and_low_precision_logits():
    # a vocabulary entry the teacher rules out (-inf logit) carries no mass: 0 log 0 = 0
    teacher = torch.tensor([[[1.0, 0.5, -math.inf, 0.0]]])
    student = torch.tensor([[[0.2, 0.1, 0.3, -0.4]]])
    mask = torch.ones(1, 1)
    p, q, a = torch.softmax(teacher[0, 0], -1), torch.softmax(student[0, 0], -1), 0.1
    live = p > 0
    skl = (p[live] * (p[live] / (a * p[live] + (1 - a) * q[live])).log()).sum()
    srkl = (q * (q / ((1 - a) * p + a * q)).log()).sum()
    assert float(d2.skew_forward_kl(teacher, student, mask, a)) == pytest.approx(float(skl), rel=1e-5)
    assert float(d2.skew_reverse_kl(teacher, student, mask, a)) == pytest.approx(float(srkl), rel=1e-5)
    # bf16 logits are scored in float32
    t16, s16, m = _logits(20).bfloat16(), _logits(21).bfloat16(), _mask(22)
    out = d2.skew_forward_kl(t16, s16, m)
    assert out.dtype == torch.float32
    assert float(out) == pytest.approx(float(d2.skew_forward_kl(t16.float(), s16.float(), m)), rel=1e-6)


def test_gradual_beta_is_the_disabled_official_schedule():
    assert [d2.gradual_beta(s, 100) for s in (0, 25, 50, 100)] == [1.0, 1.25, 1.5, 1.5]
    assert d2.DEFAULT_ALPHA == 0.1 and d2.DEFAULT_BETA == 1.0


@pytest.mark.parametrize("alpha", [1.0, -0.1, 1.5, float("nan")])
def test_bad_alpha_is_a_user_error(alpha):
    teacher, student, mask = _logits(23), _logits(24), _mask(25)
    with pytest.raises(UserError, match="alpha") as err:
        d2.skew_forward_kl(teacher, student, mask, alpha)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="alpha"):
        d2.skew_reverse_kl(teacher, student, mask, alpha)


def test_shape_mask_and_beta_errors():
    teacher, student, mask = _logits(26), _logits(27), _mask(28)
    cases = [
        lambda: d2.skew_forward_kl(teacher, student[:, :, :5], mask),          # vocabularies differ
        lambda: d2.skew_reverse_kl(teacher[0], student[0], mask[0]),           # not [batch, seq, vocab]
        lambda: d2.skew_forward_kl(teacher, student, mask[:, :4]),             # mask of another length
        lambda: d2.skew_forward_kl(teacher, student, torch.zeros_like(mask)),  # empty mask
        lambda: d2.skew_reverse_kl(teacher, student, torch.cat([mask[:2], torch.zeros_like(mask[:1])])),  # one empty
        lambda: d2.distillm2_loss(d2.Response(teacher, student, mask), d2.Response(teacher, student, mask), beta=2.5),
    ]
    for case in cases:
        with pytest.raises(UserError) as err:
            case()
        assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# Feature-KD
# ---------------------------------------------------------------------------------------------


def test_uniform_layer_pairs():
    # METHOD-GUIDE §14: student {9, 18, 27, 36} <-> teacher {10, 20, 30, 40}, 1-indexed
    assert fkd.uniform_layer_pairs(36, 40) == [(8, 9), (17, 19), (26, 29), (35, 39)]
    assert fkd.uniform_layer_pairs(36, 36) == [(8, 8), (17, 17), (26, 26), (35, 35)]
    with pytest.raises(UserError):
        fkd.uniform_layer_pairs(3, 40)


def test_attention_hand_worked_with_different_head_counts():
    # one row, keys 0..2 in buckets (0, 1, 1); the teacher has two heads, the student one
    #   teacher heads (0.5, 0.5, 0) and (1, 0, 0): head average (0.75, 0.25, 0) -> buckets (0.75, 0.25)
    #   student head  (0.5, 0.25, 0.25)                                          -> buckets (0.5, 0.5)
    #   KL(T || S) = 0.75 ln(0.75 / 0.5) + 0.25 ln(0.25 / 0.5)
    #              = 0.75 * 0.4054651 - 0.25 * 0.6931472 = 0.3040988 - 0.1732868 = 0.1308120
    # a second layer pair where the two agree adds 0, and the pairs are averaged: 0.0654060
    buckets = torch.tensor([0, 1, 1])
    t_rows = fkd.head_averaged_rows(torch.tensor([[[0.5, 0.5, 0.0]], [[1.0, 0.0, 0.0]]]), buckets, 2)
    s_rows = fkd.head_averaged_rows(torch.tensor([[[0.5, 0.25, 0.25]]]), buckets, 2)
    assert torch.allclose(t_rows, torch.tensor([[0.75, 0.25]]))
    assert torch.allclose(s_rows, torch.tensor([[0.5, 0.5]]))
    assert float(fkd.attention_map_loss([t_rows], [s_rows], eps=1e-12)) == pytest.approx(0.1308120, abs=1e-6)
    assert float(fkd.attention_map_loss([t_rows, t_rows], [s_rows, t_rows.clone()], eps=1e-12)) == pytest.approx(
        0.0654060, abs=1e-6)


def test_head_averaged_rows_equal_a_direct_one_hot_pooling():
    g = torch.Generator().manual_seed(30)
    attn = torch.softmax(torch.randn(5, 4, 9, generator=g), -1)
    buckets = torch.randint(0, 4, (9,), generator=g)
    direct = attn.mean(0) @ F.one_hot(buckets, 4).float()
    assert torch.allclose(fkd.head_averaged_rows(attn, buckets, 4), direct, atol=1e-6)
    pool = fkd.uniform_layer_pool(3, 5)
    assert pool.layer == 3 and torch.equal(pool.heads, torch.arange(5))
    assert torch.allclose(obj.pool_bucket_attention(attn, buckets, pool.weights, 4), direct, atol=1e-6)


def test_attention_requests_give_each_layers_head_averaged_rows():
    """Through SupervisedRows on a tiny model: one request per layer, each equal to the head average
    of the model's own eager attention at the sampled rows, pooled into buckets."""
    from mistill.models.architectures import TinyArchitecture, build_model

    arch = TinyArchitecture(family="qwen3", hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, no_rope_layer_interval=2)
    model = build_model(arch, vocab_size=50, eos_token_id=0, pad_token_id=1, seed=0)
    ids = torch.randint(2, 50, (1, 21), generator=torch.Generator().manual_seed(31))
    buckets = torch.randint(0, 6, (21,), generator=torch.Generator().manual_seed(32))
    rows = fkd.sample_positions(torch.arange(8, 21), k=5, generator=torch.Generator().manual_seed(33))
    hook = pa.SupervisedRows(model, [1, 3])
    hook.arm(fkd.attention_requests([1, 3], 4, rows, buckets), 6)
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
    hook.stop_recording()
    got = hook.collect()
    hook.remove()
    assert set(got) == {"fkd:1", "fkd:3"}
    for layer in (1, 3):
        direct = out.attentions[layer][0][:, rows].float().mean(0) @ F.one_hot(buckets, 6).float()
        assert torch.allclose(got[f"fkd:{layer}"][0], direct, atol=1e-5)


def test_sample_positions():
    trace = torch.arange(100, 400)
    a = fkd.sample_positions(trace, 64, torch.Generator().manual_seed(0))
    b = fkd.sample_positions(trace, 64, torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and len(a) == 64 and len(set(a.tolist())) == 64
    assert bool((a[1:] > a[:-1]).all()) and int(a.min()) >= 100 and int(a.max()) < 400
    assert torch.equal(fkd.sample_positions(torch.tensor([7, 3, 5]), 64), torch.tensor([3, 5, 7]))


def test_hidden_state_hand_worked_through_the_adapter():
    # student width 1, teacher width 2, adapter A = (2, 0)^T; three positions, the middle one masked
    #   t=0: A h_S = A (1) = (2, 0), rms = sqrt((4 + 0) / 2) = sqrt 2 -> (sqrt 2, 0)
    #        h_T = (1, 1), rms = 1                                    -> (1, 1)
    #        error = ((sqrt 2 - 1)^2 + (0 - 1)^2) / 2 = (3 - 2 sqrt 2 + 1) / 2 = 2 - sqrt 2 = 0.5857864
    #   t=1: masked out (arbitrary values)
    #   t=2: A h_S = A (-1) = (-2, 0) -> (-sqrt 2, 0); h_T = (-2, 0) -> (-sqrt 2, 0); error 0
    #   L_hid = (0.5857864 + 0) / 2 = 0.2928932 = 1 - sqrt(2) / 2
    adapter = fkd.LinearAdapter(1, 2, n_pairs=1)
    with torch.no_grad():
        adapter.maps[0].weight.copy_(torch.tensor([[2.0], [0.0]]))
    student = torch.tensor([[1.0], [5.0], [-1.0]])
    teacher = torch.tensor([[1.0, 1.0], [-3.0, 7.0], [-2.0, 0.0]])
    mask = torch.tensor([True, False, True])
    with torch.no_grad():
        loss = fkd.hidden_state_loss([teacher], [student], mask, adapter, eps=0.0)
    assert float(loss) == pytest.approx(1 - math.sqrt(2) / 2, abs=1e-6)
    assert float(loss) == pytest.approx(0.2928932, abs=1e-6)


def _features(seed, pairs=2, t=7, d_s=5, d_t=8, rows=4, buckets=6):
    g = torch.Generator().manual_seed(seed)
    student_hidden = [torch.randn(t, d_s, generator=g) for _ in range(pairs)]
    teacher_hidden = [torch.randn(t, d_t, generator=g) for _ in range(pairs)]
    t_rows = [torch.softmax(torch.randn(rows, buckets, generator=g), -1) for _ in range(pairs)]
    s_logits = [torch.randn(rows, buckets, generator=g) for _ in range(pairs)]
    mask = torch.rand(t, generator=g) > 0.3
    mask[0] = True
    return student_hidden, teacher_hidden, t_rows, s_logits, mask


def test_zero_when_student_features_equal_the_teachers_after_mapping():
    torch.manual_seed(0)   # App. J.3: seed before the adapters are built
    adapter = fkd.LinearAdapter(5, 8, n_pairs=2)
    student_hidden, _, t_rows, _, mask = _features(34)
    # the teacher's states are the mapped student's up to a positive scale per position, which the
    # per-position RMS normalisation removes
    scale = torch.rand(7, 1, generator=torch.Generator().manual_seed(35)) * 10 + 0.1
    with torch.no_grad():
        teacher_hidden = [h * scale for h in adapter(student_hidden)]
        terms = fkd.feature_kd_terms(teacher_rows=t_rows, student_rows=[r.clone() for r in t_rows],
                                     teacher_hidden=teacher_hidden, student_hidden=student_hidden, mask=mask,
                                     adapter=adapter)
    assert abs(float(terms["attn"])) < 1e-7
    assert abs(float(terms["hidden"])) < 1e-6
    assert float(fkd.feature_kd_loss(torch.tensor(0.5), terms)) == pytest.approx(0.5, abs=1e-6)


def test_hidden_state_masked_positions_ignored():
    student_hidden, teacher_hidden, _, _, mask = _features(36)
    adapter = fkd.LinearAdapter(5, 8, n_pairs=2).requires_grad_(False)
    base = fkd.hidden_state_loss(teacher_hidden, student_hidden, mask, adapter)
    g = torch.Generator().manual_seed(37)
    off = ~mask[:, None]
    s2 = [torch.where(off, torch.randn(h.shape, generator=g) * 100, h) for h in student_hidden]
    t2 = [torch.where(off, torch.randn(h.shape, generator=g) * 100, h) for h in teacher_hidden]
    assert float(fkd.hidden_state_loss(t2, s2, mask, adapter)) == pytest.approx(float(base), abs=1e-7)
    # a batch axis and a float mask give the same value
    batched = fkd.hidden_state_loss([h[None] for h in teacher_hidden], [h[None] for h in student_hidden],
                                    mask[None].float(), adapter)
    assert float(batched) == pytest.approx(float(base), rel=1e-6)


def test_feature_kd_gradients_reach_only_the_student_and_the_adapters():
    student_hidden, teacher_hidden, t_rows, s_logits, mask = _features(38)
    adapter = fkd.LinearAdapter(5, 8, n_pairs=2)
    student_hidden = [h.requires_grad_(True) for h in student_hidden]
    teacher_hidden = [h.requires_grad_(True) for h in teacher_hidden]
    t_rows = [r.requires_grad_(True) for r in t_rows]
    s_logits = [x.requires_grad_(True) for x in s_logits]
    terms = fkd.feature_kd_terms(teacher_rows=t_rows, student_rows=[torch.softmax(x, -1) for x in s_logits],
                                 teacher_hidden=teacher_hidden, student_hidden=student_hidden, mask=mask,
                                 adapter=adapter)
    assert float(terms["attn"].detach()) > 1e-3 and float(terms["hidden"].detach()) > 1e-3
    fkd.feature_kd_loss(torch.tensor(0.0), terms).backward()
    for x in teacher_hidden + t_rows:
        assert x.grad is None
    for x in student_hidden + s_logits:
        assert x.grad is not None and torch.isfinite(x.grad).all() and float(x.grad.abs().sum()) > 0
    for m in adapter.maps:
        assert m.weight.grad is not None and float(m.weight.grad.abs().sum()) > 0
    # masked positions of the student's states get no gradient
    assert float(student_hidden[0].grad[~mask].abs().max()) == 0.0


def test_feature_kd_loss_weights():
    terms = {"attn": torch.tensor(2.0), "hidden": torch.tensor(3.0)}
    assert float(fkd.feature_kd_loss(torch.tensor(1.0), terms)) == pytest.approx(6.0)   # weights 1 and 1
    assert float(fkd.feature_kd_loss(torch.tensor(1.0), terms, 0.5, 2.0)) == pytest.approx(8.0)


def test_feature_kd_errors():
    student_hidden, teacher_hidden, t_rows, s_logits, mask = _features(39)
    adapter = fkd.LinearAdapter(5, 8, n_pairs=2)
    cases = [
        lambda: fkd.attention_map_loss(t_rows, t_rows[:1]),                               # pair counts differ
        lambda: fkd.attention_map_loss([], []),                                           # no pairs
        lambda: fkd.attention_map_loss(t_rows, [r[:, :3] for r in t_rows]),               # bucket axes differ
        lambda: fkd.hidden_state_loss(teacher_hidden, student_hidden, torch.zeros_like(mask), adapter),  # empty
        lambda: fkd.hidden_state_loss(teacher_hidden, student_hidden, mask),              # no adapter: widths differ
        lambda: fkd.hidden_state_loss(teacher_hidden, student_hidden, mask[:5], adapter),  # mask length
        lambda: fkd.LinearAdapter(5, 8, n_pairs=3)(student_hidden),                       # adapter pairs
    ]
    for case in cases:
        with pytest.raises(UserError) as err:
            case()
        assert "\n" not in str(err.value)
