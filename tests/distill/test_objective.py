"""Properties of the Mistill objective's terms (App. I.5 unit tests) and a hand-worked value."""

import math

import pytest
import torch

from mistill.distill import objective as obj


def _rows(seed, r=5, b=7):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(r, b, generator=g) * 2, dim=-1)


def _events(seed, e=4, b=7):
    g = torch.Generator().manual_seed(seed)
    rows = torch.softmax(torch.randn(e, b, generator=g), dim=-1)
    region = torch.rand(e, b, generator=g) > 0.5
    c = torch.randn(e, generator=g)
    return rows, region, c


@pytest.mark.parametrize("terms", [{"attn"}, {"inter"}, {"attn", "inter", "write"}])
@pytest.mark.parametrize("write_norm", [False, True])
def test_every_term_zero_when_student_equals_teacher(terms, write_norm):
    rows, region, c = _events(0)
    m = obj.region_mass(rows, region)
    out = obj.phase_loss(teacher_rows=rows, student_rows=rows.clone(), m_teacher=m, c_teacher=c,
                         m_student=m.clone(), c_student=c.clone(), terms=terms, write_norm=write_norm)
    assert set(out) == terms
    for value in out.values():
        assert abs(float(value)) < 1e-9


def test_terms_positive_when_student_differs():
    t_rows, region, c_t = _events(0)
    s_rows, _, c_s = _events(1)
    out = obj.phase_loss(teacher_rows=t_rows, student_rows=s_rows, m_teacher=obj.region_mass(t_rows, region),
                         c_teacher=c_t, m_student=obj.region_mass(s_rows, region), c_student=c_s,
                         terms=obj.ALL_TERMS)
    assert all(float(v) > 1e-4 for v in out.values())


def test_gradients_flow_only_through_student():
    t_rows, region, c_t = _events(0)
    s_logits = torch.randn(4, 7, requires_grad=True)
    t_rows = t_rows.clone().requires_grad_(True)
    c_t = c_t.clone().requires_grad_(True)
    c_s = torch.randn(4, requires_grad=True)
    s_rows = torch.softmax(s_logits, -1)
    out = obj.phase_loss(teacher_rows=t_rows, student_rows=s_rows, m_teacher=obj.region_mass(t_rows, region),
                         c_teacher=c_t, m_student=obj.region_mass(s_rows, region), c_student=c_s,
                         terms=obj.ALL_TERMS)
    total = obj.mistill_loss(torch.tensor(0.0), {"P1": out}, 0.1, 0.1)
    total.backward()
    assert t_rows.grad is None and c_t.grad is None
    assert s_logits.grad is not None and s_logits.grad.abs().sum() > 0
    assert c_s.grad is not None and c_s.grad.abs().sum() > 0


def test_invariant_to_bucket_order():
    t_rows, region, c_t = _events(0)
    s_rows, _, c_s = _events(1)
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(3))

    def loss(t, s, reg):
        return obj.phase_loss(teacher_rows=t, student_rows=s, m_teacher=obj.region_mass(t, reg), c_teacher=c_t,
                              m_student=obj.region_mass(s, reg), c_student=c_s)

    a, b = loss(t_rows, s_rows, region), loss(t_rows[:, perm], s_rows[:, perm], region[:, perm])
    for key in a:
        assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-6)


def test_pooling_invariant_to_bucket_labels():
    g = torch.Generator().manual_seed(0)
    attn = torch.softmax(torch.randn(3, 4, 10, generator=g), -1)
    buckets = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 4, 4])
    w = torch.tensor([0.5, 0.3, 0.2])
    relabel = torch.tensor([3, 0, 4, 1, 2])  # bucket b -> relabel[b]
    pooled = obj.pool_bucket_attention(attn, buckets, w, 5)
    pooled_relabelled = obj.pool_bucket_attention(attn, relabel[buckets], w, 5)
    assert torch.allclose(pooled_relabelled[:, relabel], pooled)
    assert torch.allclose(pooled.sum(-1), torch.ones(4))


def test_hand_worked_value():
    teacher = torch.tensor([[0.5, 0.5, 0.0]])
    student = torch.tensor([[0.25, 0.75, 0.0]])
    # KL = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln 2 + 0.5 ln(2/3)
    expected = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    assert float(obj.attention_term(teacher, student, eps=1e-12)) == pytest.approx(expected, rel=1e-6)
    # interaction: teacher m=0.5 c=0.8 (0.4), student m=0.25 c=0.4 (0.1) -> (0.1-0.4)^2 = 0.09
    region = torch.tensor([[True, False, False]])
    inter = obj.interaction_term(obj.region_mass(teacher, region), torch.tensor([0.8]),
                                 obj.region_mass(student, region), torch.tensor([0.4]))
    assert float(inter) == pytest.approx(0.09)
    # total at lambda 0.1 on P1 and 0.3 on P2C
    total = obj.mistill_loss(torch.tensor(1.0), {"P1": {"attn": torch.tensor(2.0)},
                                                 "P2C": {"attn": torch.tensor(1.0), "inter": torch.tensor(1.0)}},
                             0.1, 0.3)
    assert float(total) == pytest.approx(1.0 + 0.2 + 0.6)


def test_uniform_pool_over_one_layer_equals_feature_kd_kl():
    """App. I.5: with a uniform pool over one layer's heads the attention term is Feature-KD's
    head-averaged, bucket-pooled KL (computed here independently by one-hot matmul)."""
    g = torch.Generator().manual_seed(1)
    n_heads, rows, keys, n_buckets = 4, 6, 12, 5
    t_attn = torch.softmax(torch.randn(n_heads, rows, keys, generator=g), -1)
    s_attn = torch.softmax(torch.randn(n_heads, rows, keys, generator=g), -1)
    buckets = torch.randint(0, n_buckets, (keys,), generator=g)
    uniform = torch.full((n_heads,), 1 / n_heads)
    ours = obj.attention_term(obj.pool_bucket_attention(t_attn, buckets, uniform, n_buckets),
                              obj.pool_bucket_attention(s_attn, buckets, uniform, n_buckets), eps=1e-9)
    onehot = torch.nn.functional.one_hot(buckets, n_buckets).float()
    t = t_attn.mean(0) @ onehot
    s = s_attn.mean(0) @ onehot
    mask = t > 0
    fkd = (torch.where(mask, t * (t.log() - s.clamp_min(1e-30).log()), torch.zeros_like(t))).sum(-1).mean()
    assert float(ours) == pytest.approx(float(fkd), rel=1e-4)


def test_margin_direction_is_the_frozen_norm_gradient_of_the_margin():
    g = torch.Generator().manual_seed(2)
    d, v = 8, 11
    x = torch.randn(3, d, generator=g)
    gain = torch.rand(d, generator=g) + 0.5
    w_u = torch.randn(v, d, generator=g)
    targets = torch.tensor([1, 4, 7])
    comps = [[0, 2, 3], [5, 6], [8, 9, 10, 0]]
    rms = x.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt()
    xg = x.clone().requires_grad_(True)
    logits = (gain * xg * rms) @ w_u.T  # rms frozen: the norm treated as linear
    margins = obj.event_margins(logits, targets, comps)
    margins.sum().backward()
    direction = obj.margin_direction(x, gain, 1e-6, w_u, targets, comps, logits.detach())
    assert torch.allclose(direction, xg.grad, atol=1e-5)
    # contribution of a write equal to the whole residual is the first-order margin share
    writes = x[:, None, :]
    c = obj.contribution(writes, torch.tensor([1.0]), direction, margins.detach(), min_margin=1e-9)
    assert torch.allclose(c * margins.detach().abs(), (direction * x).sum(-1), atol=1e-5)


def test_write_term_standardised_ignores_constant_shift():
    c_t = torch.tensor([0.1, 0.5, 0.9])
    assert float(obj.write_term(c_t, c_t + 3.0, write_norm=True)) < 1e-9
    assert float(obj.write_term(c_t, c_t + 3.0, write_norm=False)) == pytest.approx(9.0)


def test_topk_kl_matches_direct_sum_and_masking():
    g = torch.Generator().manual_seed(4)
    s_logits = torch.randn(5, 20, generator=g)
    t_logits = torch.randn(5, 20, generator=g)
    t_logp = torch.log_softmax(t_logits, -1)
    top = t_logp.topk(4, dim=-1)
    kl = obj.topk_kl(s_logits, top.indices, top.values)
    for i in range(5):
        pt = torch.softmax(top.values[i], -1)
        ps = torch.log_softmax(s_logits[i], -1)[top.indices[i]]
        assert float(kl[i]) == pytest.approx(float((pt * (pt.log() - ps)).sum()), rel=1e-5)
    labels = torch.tensor([-100, 3, 4, -100, 7])
    ce, kls, n = obj.cot_loss_sums(s_logits, labels, top.indices, top.values)
    assert n == 3
    expected_ce = sum(float(-torch.log_softmax(s_logits[i], -1)[labels[i]]) for i in (1, 2, 4))
    assert float(ce) == pytest.approx(expected_ce, rel=1e-5)
    assert float(kls) == pytest.approx(float(kl[[1, 2, 4]].sum()), rel=1e-5)
