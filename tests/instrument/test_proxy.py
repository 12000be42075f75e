"""The contribution proxy c and region mass m per head (R-D20): against eager attention computed by hand,
against the pooled quantities the distillation code computes, and the readout against scipy."""

import numpy as np
import pytest
import torch
from scipy import stats

from mistill.distill import buckets as bk
from mistill.distill import pools as pl
from mistill.distill.mechanism import note_view, plan_rows, read_mechanism
from mistill.distill.objective import contribution, event_margins, margin_direction
from mistill.distill.pooled_attention import SupervisedRows
from mistill.distill.targets import competitor_strings
from mistill.errors import UserError
from mistill.instrument.proxy import head_contributions, note_proxy
from mistill.instrument.proxy_readout import DECISION_KINDS, dla_vs_first_order, proxy_faithfulness
from mistill.models.architectures import TinyArchitecture, build_model
from mistill.models.tokenizers import CompactTokenizer, build_remap, qwen3_tokenizer
from mistill.world.prompt import build_prompt
from tests.distill.conftest import COMPLETION, LINES, NOTE_TEXT, make_events

torch.set_num_threads(1)
N_LAYERS, N_HEADS = 3, 4


@pytest.fixture(scope="module")
def tiny():
    prompt = build_prompt(NOTE_TEXT, LINES)
    base = qwen3_tokenizer()
    tok = CompactTokenizer(base, build_remap(base, [base.chat_prompt(prompt) + COMPLETION]))
    arch = TinyArchitecture(family="qwen3", hidden_size=48, intermediate_size=64, num_hidden_layers=N_LAYERS,
                            num_attention_heads=N_HEADS, num_key_value_heads=2, head_dim=12)
    model = build_model(arch, vocab_size=tok.vocab_size, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id, seed=3)
    events = make_events()
    return model, tok, prompt, events, note_proxy(model, tok, prompt, COMPLETION, events, note_id="n1")


def test_head_contributions_weighted_by_a_pool_give_the_pool_contribution():
    g = torch.Generator().manual_seed(0)
    writes, direction = torch.randn(5, 6, 8, generator=g), torch.randn(5, 8, generator=g)
    margin = torch.tensor([2.0, -0.05, 0.3, -4.0, 0.0])
    weights = torch.softmax(torch.randn(6, generator=g), 0)
    per_head = head_contributions(writes, direction, margin)
    assert torch.allclose((per_head * weights).sum(-1), contribution(writes, weights, direction, margin), atol=1e-6)
    # by hand: event 1 has |margin| below the 0.1 floor, so its head 0 is <write, d> / 0.1
    assert per_head[1, 0].item() == pytest.approx(float(writes[1, 0] @ direction[1]) / 0.1, rel=1e-5)


def _by_hand(model, tok, prompt, events, ev):
    """Every head's c and m at one realised event, from HF's eager attention probabilities and the layer's
    own V and W_O: the write z_h W_O^h projected on the margin direction, over max(|margin|, 0.1); and the
    decided token's logit."""
    axis = bk.build_axis(prompt, COMPLETION)
    view = note_view(tok, axis, events, competitor_strings(tok, events))
    event = events[ev.index]
    final_in = {}
    handle = model.model.norm.register_forward_pre_hook(lambda m, a: final_in.setdefault("x", a[0]))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([view.ids]), output_attentions=True, output_hidden_states=True)
    handle.remove()
    h = final_in["x"][0, ev.row][None]
    logits = out.logits[0, ev.row][None].float()
    target, comps = torch.tensor([ev.target_id]), [list(ev.competitor_ids)]
    margin = event_margins(logits, target, comps)
    direction = margin_direction(h, model.model.norm.weight, model.model.norm.variance_epsilon,
                                 model.lm_head.weight, target, comps, logits)
    carved = view.tokens.carved_index(bk.carve_ranges(axis, event))
    region = bk.region_mask(axis, event, ev.kind != "P1")
    c, m = np.zeros((N_LAYERS, N_HEADS)), np.zeros((N_LAYERS, N_HEADS))
    with torch.no_grad():
        for layer_i, layer in enumerate(model.model.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(out.hidden_states[layer_i][0])
            v = attn.v_proj(x).view(x.shape[0], -1, attn.head_dim)
            w_o = attn.o_proj.weight
            for head in range(N_HEADS):
                probs = out.attentions[layer_i][0, head, ev.row]
                z = probs @ v[:, head // (N_HEADS // 2)]
                write = z @ w_o[:, head * attn.head_dim:(head + 1) * attn.head_dim].T
                c[layer_i, head] = float(write @ direction[0]) / max(abs(float(margin[0])), 0.1)
                m[layer_i, head] = float((bk.pool_rows_numpy(probs.numpy(), carved, axis.n_buckets) * region).sum())
    return c, m, float(logits[0, ev.target_id])


def test_per_head_c_and_m_equal_eager_attention_by_hand(tiny):
    model, tok, prompt, events, proxy = tiny
    view = note_view(tok, bk.build_axis(prompt, COMPLETION), events, competitor_strings(tok, events))
    p2c = [ev for ev in view.realized if ev.kind == "P2C"]
    assert len(p2c) == 1 and proxy["c"].shape == (1, N_LAYERS, N_HEADS)
    c, m, logit = _by_hand(model, tok, prompt, events, p2c[0])
    assert proxy["target_logit"][0] == pytest.approx(logit, abs=1e-5)
    np.testing.assert_allclose(proxy["c"][0], c, atol=2e-5)
    np.testing.assert_allclose(proxy["m"][0], m, atol=2e-6)
    assert proxy["positions"].tolist() == [p2c[0].row + 1] and proxy["occurrence"].tolist() == [0]
    assert proxy["kinds"].tolist() == ["P2C"]


def test_every_decision_phase_by_hand_and_its_p2c_rows_as_the_p2c_pass(tiny):
    """The full run's pass (P1, P2 and P2C): each event's c and m by hand, P1's region its chapter's lines;
    its P2C rows are the P2C-only pass's."""
    model, tok, prompt, events, p2c_only = tiny
    every = note_proxy(model, tok, prompt, COMPLETION, events, kinds=DECISION_KINDS, note_id="n1")
    view = note_view(tok, bk.build_axis(prompt, COMPLETION), events, competitor_strings(tok, events))
    assert sorted(set(every["kinds"].tolist())) == ["P1", "P2", "P2C"]
    assert every["kinds"].tolist() == [ev.kind for ev in view.realized if ev.kind in DECISION_KINDS]
    for i, ev in enumerate(ev for ev in view.realized if ev.kind in DECISION_KINDS):
        c, m, logit = _by_hand(model, tok, prompt, events, ev)
        assert every["target_logit"][i] == pytest.approx(logit, abs=1e-5)
        np.testing.assert_allclose(every["c"][i], c, atol=2e-5)
        np.testing.assert_allclose(every["m"][i], m, atol=2e-6)
    at = every["kinds"] == "P2C"
    np.testing.assert_allclose(every["c"][at], p2c_only["c"], atol=1e-6)
    assert every["positions"][at].tolist() == p2c_only["positions"].tolist()


def test_pooled_with_a_pool_weights_they_are_the_distillation_targets_m_and_c(tiny):
    """sum_h w_h m_h and sum_h w_h c_h are the m and c the teacher targets store for that pool."""
    model, tok, prompt, events, proxy = tiny
    rng = np.random.default_rng(1)
    heads = tuple((layer, head) for layer in range(N_LAYERS) for head in range(N_HEADS))
    weights = rng.dirichlet(np.ones(len(heads)))
    pools = {p: pl.Pool(p, heads, tuple(weights.tolist())) for p in ("P1", "P2", "P2C")}
    axis = bk.build_axis(prompt, COMPLETION)
    view = note_view(tok, axis, events, competitor_strings(tok, events))
    hook = SupervisedRows(model, list(range(N_LAYERS)))
    try:
        plan = plan_rows(view, events, pools, None, 0, torch.device("cpu"))
        hook.arm(plan.requests, plan.n_buckets)
        with torch.no_grad():
            model(input_ids=torch.tensor([view.ids]))
            hook.stop_recording()
            mech = read_mechanism(model, plan, hook)
    finally:
        hook.remove()
    w = weights.reshape(N_LAYERS, N_HEADS)
    assert float((proxy["m"][0] * w).sum()) == pytest.approx(float(mech["P2C"]["m"][0]), abs=1e-6)
    assert float((proxy["c"][0] * w).sum()) == pytest.approx(float(mech["P2C"]["c"][0]), abs=1e-5)
    assert proxy["margin"][0] == pytest.approx(float(mech["P2C"]["margin"][0]), abs=1e-5)


def _proxy(positions, occurrence, c, m, margin, kinds=None):
    return {"kinds": np.asarray(kinds or ["P2C"] * len(positions)),
            "positions": np.asarray(positions), "occurrence": np.asarray(occurrence),
            "c": np.asarray(c, dtype=float).reshape(len(positions), 2, 2),
            "m": np.asarray(m, dtype=float).reshape(len(positions), 2, 2), "margin": np.asarray(margin, dtype=float)}


def test_readout_by_hand_and_against_scipy():
    # note a: two events at one position (two siblings contrasted), note b: one event
    rows = {"a": [{"pos": 10, "occurrence": 0, "p2c_exact": {"heads": [0, 1, 2, 3], "exact": [1.0, 0.5, 0.2, 0.1],
                                                              "first_order": [0.8, 0.6, 0.1, 0.0]}},
                  {"pos": 10, "occurrence": 1, "p2c_exact": {"heads": [0, 3, 1], "exact": [0.4, -0.2, 0.3],
                                                              "first_order": [0.5, -0.1, 0.2]}}],
            "b": [{"pos": 7, "occurrence": 0, "p2c_exact": {"heads": [2, 3], "exact": [0.3, 0.1],
                                                             "first_order": [0.2, 0.1]}}]}
    c_a = [[0.3, 0.1, 0.2, 0.0], [0.1, 0.05, 0.0, -0.1]]
    m_a = [[0.5, 0.5, 0.5, 0.5], [0.2, 0.4, 0.6, 0.8]]
    proxies = {"a": _proxy([10, 10], [0, 1], c_a, m_a, [2.0, 0.05]),
               "b": _proxy([7], [0], [[0.0, 0.0, 0.4, 0.1]], [[0.1] * 4], [1.0])}
    got = proxy_faithfulness(rows, proxies)
    assert got["events"] == 3 and got["heads"] == 4 and got["events_without_correlation"] == 1   # b: 2 heads
    e1 = stats.spearmanr([0.3, 0.1, 0.2, 0.0], [1.0, 0.5, 0.2, 0.1]).statistic
    e2 = stats.spearmanr([0.1, -0.1, 0.05], [0.4, -0.2, 0.3]).statistic
    assert got["per_event_median"]["c_spearman"] == pytest.approx(np.median([e1, e2]))
    p1 = stats.pearsonr([0.3, 0.1, 0.2, 0.0], [1.0, 0.5, 0.2, 0.1]).statistic
    p2 = stats.pearsonr([0.1, -0.1, 0.05], [0.4, -0.2, 0.3]).statistic
    assert got["per_event_median"]["c_pearson"] == pytest.approx(np.median([p1, p2]))
    mc2 = np.multiply([0.2, 0.8, 0.4], [0.1, -0.1, 0.05])
    assert got["per_event_median"]["mc_spearman"] == pytest.approx(
        np.median([stats.spearmanr(np.multiply(0.5, [0.3, 0.1, 0.2, 0.0]), [1.0, 0.5, 0.2, 0.1]).statistic,
                   stats.spearmanr(mc2, [0.4, -0.2, 0.3]).statistic]))
    # pooled: each head's mean over the events where it was patched
    exact = [np.mean([1.0, 0.4]), np.mean([0.5, 0.3]), np.mean([0.2, 0.3]), np.mean([0.1, -0.2, 0.1])]
    c = [np.mean([0.3, 0.1]), np.mean([0.1, 0.05]), np.mean([0.2, 0.4]), np.mean([0.0, -0.1, 0.1])]
    assert got["pooled_spearman"]["c"] == pytest.approx(stats.spearmanr(c, exact).statistic)
    # magnitude: |c| times max(|margin|, 0.1) over |exact|
    dla = 2.0 * 0.6 + 0.1 * (0.1 + 0.1 + 0.05) + 1.0 * 0.5
    assert got["magnitude_ratio"] == pytest.approx(dla / (1.8 + 0.9 + 0.4))
    with pytest.raises(UserError, match="no proxy row"):
        proxy_faithfulness({"b": [{**rows["b"][0], "occurrence": 1}]}, proxies)


def test_dla_against_first_order_by_hand_and_against_scipy():
    """Events matched by (kind, position, occurrence within the kind); NULL rows ignored; a constant vector
    has no correlation; an event the proxy pass did not realise is counted, not guessed."""
    fo = np.array([[1.0, 0.5, -0.2, 0.1],     # NULL: ignored
                   [0.3, 0.2, 0.1, 0.0],      # P1 at 5
                   [0.4, -0.1, 0.2, 0.3],     # P2C at 9, first sibling
                   [0.2, 0.2, 0.2, 0.2],      # P2C at 9, second sibling: constant first-order
                   [0.1, 0.0, 0.3, -0.2]])    # P2 at 12: no proxy row
    attr = {"kinds": np.array(["NULL", "P1", "P2C", "P2C", "P2"]), "positions": np.array([3, 5, 9, 9, 12]),
            "first_order": fo.reshape(5, 2, 2)}
    c_p1, c_p2c = [0.0, 0.1, 0.3, 0.1], [0.2, 0.05, 0.1, 0.4]
    # the proxy rows in another order than the attribution rows: matching is by key, not by index
    proxies = {"a": _proxy([9, 5, 9], [1, 0, 0], [[1.0, 2.0, 3.0, 4.0], c_p1, c_p2c], [[0.0] * 4] * 3, [1.0] * 3,
                           kinds=["P2C", "P1", "P2C"])}
    got = dla_vs_first_order({"a": attr}, proxies)
    r_p1 = stats.pearsonr(c_p1, fo[1]).statistic
    r_p2c = stats.pearsonr(c_p2c, fo[2]).statistic
    assert got["events"] == 2 and got["without_correlation"] == 1 and got["unmatched"] == 1
    assert got["median"] == pytest.approx(np.median([r_p1, r_p2c]))
    assert got["median_by_kind"] == {"P1": pytest.approx(r_p1), "P2": None, "P2C": pytest.approx(r_p2c)}
    # scaling an event's c by a positive constant (its margin floor) leaves its Pearson unchanged
    scaled = {"a": {**proxies["a"], "c": proxies["a"]["c"] * np.array([3.0, 0.2, 7.0])[:, None, None]}}
    assert dla_vs_first_order({"a": attr}, scaled)["median"] == pytest.approx(got["median"])
    with pytest.raises(UserError, match="no proxy.npz"):
        dla_vs_first_order({"a": attr}, {})
    assert dla_vs_first_order({"a": attr, "nulls": {**attr, "kinds": np.array(["NULL"] * 5)}}, proxies) == got
