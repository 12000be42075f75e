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
from mistill.instrument.proxy import head_contributions, note_proxy, proxy_faithfulness
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


def test_per_head_c_and_m_equal_eager_attention_by_hand(tiny):
    """Each head's write rebuilt from HF's eager attention probabilities and the layer's own V and W_O."""
    model, tok, prompt, events, proxy = tiny
    axis = bk.build_axis(prompt, COMPLETION)
    view = note_view(tok, axis, events, competitor_strings(tok, events))
    p2c = [ev for ev in view.realized if ev.kind == "P2C"]
    assert len(p2c) == 1 and proxy["c"].shape == (1, N_LAYERS, N_HEADS)
    ev, event = p2c[0], events[p2c[0].index]
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
    region = bk.region_mask(axis, event, True)
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
                c = float(write @ direction[0]) / max(abs(float(margin[0])), 0.1)
                m = float((bk.pool_rows_numpy(probs.numpy(), carved, axis.n_buckets) * region).sum())
                assert proxy["c"][0, layer_i, head] == pytest.approx(c, abs=2e-5)
                assert proxy["m"][0, layer_i, head] == pytest.approx(m, abs=2e-6)
    assert proxy["positions"].tolist() == [ev.row + 1] and proxy["occurrence"].tolist() == [0]


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


def _proxy(positions, occurrence, c, m, margin):
    return {"positions": np.asarray(positions), "occurrence": np.asarray(occurrence),
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
