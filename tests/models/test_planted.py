"""The planted mechanism: decision rows as the instrument extracts them, the routing term against a
brute-force forward per example, its scale invariance, that training lowers it, and the recall score."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mistill.errors import UserError
from mistill.instrument.events import DECISION_KINDS, extract_events
from mistill.instrument.margin import margin
from mistill.models.architectures import TinyArchitecture, build_model
from mistill.models.planted import (
    PlantedHeads,
    PlantedRouting,
    decision_rows,
    planted_ranks,
    planted_recall,
)
from mistill.models.tokenizers import CompactTokenizer, build_remap, qwen3_tokenizer
from mistill.models.train_teacher import (
    batch_forward,
    batch_loss,
    make_example,
    planted_step,
    shared_prefix,
    train,
)

ARCH = {"family": "qwen3", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8}
CODES = [f"N18.{i}" for i in range(1, 7)] + [f"I21.{i}" for i in range(1, 4)]
INVENTORY_LINES = "\n".join(f"{c} condition {c[-1]}" for c in CODES)
NOTES = ["stage 3 kidney disease and an infarct", "stage 5 kidney disease noted", "stage 1 only, infarct"]
COMPLETIONS = ["<think>\nthe findings point to chapter N.\nN18.4 rejected.\nN18.3 accepted.\nI21.2 accepted.\n</think>"
               "\n\n[\"N18.3\", \"I21.2\"]",
               "<think>\nN18.5 accepted.\n</think>\n\n[\"N18.5\"]",
               "<think>\nI21.3 rejected.\nI21.1 accepted.\nN18.2 rejected.\nN18.1 accepted.\n</think>\n\n"
               "[\"I21.1\", \"N18.1\"]"]
PLANTED = {"P1": ["l1h0"], "P2": ["l1h1", "l0h2"], "P2C": ["l1h3"], "weight": 2.0}


@pytest.fixture(scope="module")
def tokenizer():
    base = qwen3_tokenizer()
    texts = [base.chat_prompt(f"{INVENTORY_LINES}\n\n{n}") for n in NOTES] + COMPLETIONS + [" N I (N (I N I"]
    return CompactTokenizer(base, build_remap(base, texts))


@pytest.fixture(scope="module")
def examples(tokenizer):
    return [make_example(tokenizer, f"n{i}", "full", f"{INVENTORY_LINES}\n\n{note}", completion, CODES)
            for i, (note, completion) in enumerate(zip(NOTES, COMPLETIONS))]


def tiny_model(tokenizer, seed=0):
    return build_model(TinyArchitecture.from_params(ARCH), vocab_size=tokenizer.vocab_size,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, seed=seed,
                       attn_implementation="sdpa")


def planted_heads():
    return PlantedHeads.from_params(PLANTED, n_layers=2, n_heads=4)


def test_decision_rows_are_the_instrument_s_events_one_phase_a_position(tokenizer):
    prefix = tokenizer.chat_prompt(f"{INVENTORY_LINES}\n\n{NOTES[0]}")
    text = prefix + COMPLETIONS[0]
    rows = decision_rows(tokenizer, text, len(prefix), CODES)
    enc = tokenizer.encode(text)
    events, _ = extract_events(note_id="x", text=text, ids=enc.ids, offsets=enc.offsets,
                               completion_start=len(prefix), codes=CODES, tokenizer=tokenizer, n_null=0)
    decisions = [e for e in events if e.kind in DECISION_KINDS]
    assert [d.q for d in rows] == sorted({e.pos - 1 for e in decisions})
    assert {d.phase for d in rows} == {"P1", "P2", "P2C"}
    for d in rows:  # the decided token and competitors are those of the event of the row's phase
        event = next(e for e in decisions if e.pos - 1 == d.q and e.kind == d.phase)
        assert (d.target, list(d.competitors)) == (event.target_id, event.competitor_ids)
    by_pos = {}
    for e in decisions:
        by_pos.setdefault(e.pos - 1, set()).add(e.kind)
    shared = [q for q, kinds in by_pos.items() if kinds == {"P2", "P2C"}]
    assert shared  # N18.3's "3" after the rejected N18.4: both a P2 and a P2C event ...
    assert all({d.q: d.phase for d in rows}[q] == "P2C" for q in shared)  # ... planted as the contrastive decision


def brute_force(model, examples, planted, n_heads=4):
    """Each example alone, no shared prefix: hooks that hold every non-planted head at its mean over
    the example's input at each decision; (R averaged over all decisions, token-mean CE of the batch)."""
    n_layers = len(model.model.layers)
    terms, ce_sum, ce_count = [], 0.0, 0
    for ex in examples:
        per_q = {d.q: [] for d in ex.decisions}

        def make(layer):
            def hook(module, args):
                z = args[0].view(len(ex.ids), n_heads, -1)   # the closing EOS last: causal, never read
                mu = z[:-1].mean(dim=0)
                scale = (z[:-1] - mu).pow(2).sum(-1).mean(0).detach()
                out = z.clone()
                for q, phase, *_ in ex.decisions:
                    held = torch.tensor(planted.held_mask(phase, n_layers, n_heads)[layer])
                    per_q[q] += list(((z[q] - mu).pow(2).sum(-1) / (scale + 1e-6))[held])
                    out[q, held] = mu[held].detach()
                return (out.reshape(args[0].shape),)
            return hook

        handles = [layer.self_attn.o_proj.register_forward_pre_hook(make(i))
                   for i, layer in enumerate(model.model.layers)]
        logits = model(torch.tensor([list(ex.ids)])).logits[0, :-1]
        for h in handles:
            h.remove()
        terms += [torch.stack(values).mean() for values in per_q.values()]
        targets = torch.tensor(ex.ids[1:])
        keep = torch.arange(1, len(ex.ids)) >= ex.n_prompt
        ce_sum = ce_sum + torch.nn.functional.cross_entropy(logits[keep], targets[keep], reduction="sum")
        ce_count += int(keep.sum())
    return torch.stack(terms).mean(), len(terms), ce_sum / ce_count


@pytest.mark.parametrize("min_shared", [8, 10 ** 6])
def test_routed_batch_equals_a_routed_forward_per_example(tokenizer, examples, min_shared):
    """The shared-prefix batch, its held heads replaced by their means at every decision, gives the
    per-example computation's R and cross-entropy, and the same gradients."""
    model = tiny_model(tokenizer).double()
    planted = planted_heads()
    routing = PlantedRouting(model, planted)
    shared = shared_prefix(examples, min_shared)
    assert (shared > 0) == (min_shared == 8)
    with routing.applied(examples, shared):
        ce, _ = batch_loss(model, examples, min_shared=min_shared)
    got, n = routing.penalty()
    (ce + got).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want, n_want, ce_want = brute_force(model, examples, planted)
    (ce_want + want).backward()
    assert n == n_want == sum(len(ex.decisions) for ex in examples)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(ce, ce_want)
    for mine, theirs in zip(grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-7)


def test_the_routed_forward_changes_only_the_decisions(tokenizer, examples):
    """Logits before the first decision are the plain forward's; the first decision's differ."""
    model = tiny_model(tokenizer).double()
    ex = examples[0]
    first = min(d.q for d in ex.decisions)
    with torch.no_grad():
        plain = model(torch.tensor([list(ex.ids)])).logits[0]
        with PlantedRouting(model, planted_heads()).applied([ex], 0):
            routed = model(torch.tensor([list(ex.ids)])).logits[0]
    torch.testing.assert_close(routed[:first], plain[:first])
    assert not torch.allclose(routed[first], plain[first])


def test_routing_penalty_ignores_a_head_s_scale(tokenizer, examples):
    """Scaling the last layer's values (its every z_h x 10, nothing after it reads them but the
    residual) leaves R unchanged: shrinking heads cannot lower it."""
    model = tiny_model(tokenizer).double()
    routing = PlantedRouting(model, planted_heads())

    def penalty():
        with routing.applied(examples, shared_prefix(examples, 8)), torch.no_grad():
            batch_loss(model, examples, min_shared=8)
        return routing.penalty()[0]

    before = penalty()
    with torch.no_grad():
        model.model.layers[-1].self_attn.v_proj.weight.mul_(10.0)
    assert float(before) > 0.1
    torch.testing.assert_close(penalty(), before, rtol=1e-4, atol=1e-6)


def test_training_with_the_routing_term_lowers_it(tokenizer, examples):
    torch.set_num_threads(1)
    config = {"seed": 0, "epochs": 60, "batch_size": 3, "lr": 1e-2, "warmup_share": 0.1}
    log = train(tiny_model(tokenizer), examples, config, progress=False, planted=planted_heads())
    plain = train(tiny_model(tokenizer), examples, config, progress=False)
    assert all("routing" in row for row in log) and not any("routing" in row for row in plain)
    first, last = np.mean([r["routing"] for r in log[:5]]), np.mean([r["routing"] for r in log[-5:]])
    assert last < first / 5
    assert log[-1]["cross_entropy"] < log[0]["cross_entropy"] / 1.5  # and the traces are still learned


def test_recall_is_one_for_the_planted_ranking_and_chance_for_a_shuffled_one():
    heads = [(layer, head) for layer in range(4) for head in range(8)]
    planted = frozenset({(1, 5), (2, 2), (3, 6)})
    ranked = sorted(planted) + [h for h in heads if h not in planted]
    assert planted_recall(ranked, planted) == 1.0
    assert planted_ranks(ranked, planted) == {"l1h5": 1, "l2h2": 2, "l3h6": 3}
    rng = np.random.default_rng(0)
    shuffled = [planted_recall([heads[i] for i in rng.permutation(len(heads))], planted) for _ in range(4000)]
    # recall at k = |P| of a random ranking has mean |P| / N (hypergeometric): 3 / 32
    assert np.mean(shuffled) == pytest.approx(3 / 32, abs=0.01)
    assert planted_recall([heads[i] for i in np.argsort([h in planted for h in heads])], planted) == 0.0


@pytest.mark.parametrize("cfg, message", [
    ({"P1": ["l1h0"], "P2": ["l1h1"]}, "missing P2C"),
    ({"P1": ["h1"], "P2": ["l1h1"], "P2C": ["l1h2"]}, "not a head name"),
    ({"P1": ["l2h0"], "P2": ["l1h1"], "P2C": ["l1h2"]}, "outside the model"),
    ({"P1": ["l1h0"], "P2": ["l1h1"], "P2C": ["l1h2"], "weight": -1}, "at least 0"),
    ({"P1": ["l1h0"], "P2": ["l1h1"], "P2C": ["l1h2"], "consistency": -0.5}, "consistency"),
    ({"P1": ["l1h0"], "P2": ["l1h1"], "P2C": ["l1h2"], "ablate_share": 1.5}, "ablate_share"),
])
def test_planted_params_are_checked(cfg, message):
    with pytest.raises(UserError, match=message):
        PlantedHeads.from_params(cfg, n_layers=2, n_heads=4)
    assert PlantedHeads.from_params(None, n_layers=2, n_heads=4) is None


def test_the_r_c3_reader_scores_the_global_rankings_against_the_planted_sets(tmp_path):
    """planted_values on a hand-made head_sets_contrast.json: P1's ranking has its planted pair on
    top, P2's one of two, P2C's none; and a profile without a planted teacher writes no key."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("r_c3", "readers/r_c3.py")
    r_c3 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(r_c3)
    order = {"P1": [(1, 0), (1, 1), (0, 0), (0, 1)], "P2": [(0, 1), (1, 2), (0, 0), (1, 3)],
             "P2C": [(0, 0), (0, 1), (1, 0), (1, 3)]}
    rest = [(layer, head) for layer in range(2) for head in range(4)]
    body = {"n_layers": 2, "n_heads": 4, "pool_k": 2,
            "phases": {p: [{"layer": h[0], "head": h[1], "ic": 1.0 - i / 10}
                           for i, h in enumerate(heads + [r for r in rest if r not in heads])]
                       for p, heads in order.items()}}
    path = tmp_path / "head_sets_contrast.json"
    path.write_text(json.dumps(body))
    planted = {"P1": ["l1h0", "l1h1"], "P2": ["l1h2", "l0h2"], "P2C": ["l1h1", "l1h2"]}
    params = {"models": {"teacher_training": {"planted": {"teacher": planted}}}}
    got = {k: v["value"] for k, v in r_c3.planted_values(params, path).items()}
    assert got == {"planted_recall_p1": 1.0, "planted_ranks_p1": [1, 2],
                   "planted_recall_p2": 0.5, "planted_ranks_p2": [5, 2],
                   "planted_recall_p2c": 0.0, "planted_ranks_p2c": [7, 8]}
    assert sorted(got) == sorted(r_c3.planted_keys(params))
    assert r_c3.planted_values({"models": {"teacher_training": None}}, path) == {}
    assert r_c3.planted_keys({"models": {"teacher_training": None}}) == []


def test_a_step_that_does_not_ablate_is_the_plain_forward_with_r_recorded(tokenizer, examples):
    """ablate=False: the logits are the untouched model's; R is the same as under the ablating forward's
    first layer (no ablation upstream of it), and training with ablate_share 0.5 ablates about half the steps."""
    model = tiny_model(tokenizer).double()
    routing = PlantedRouting(model, planted_heads())
    ex = examples[0]
    with torch.no_grad():
        plain = model(torch.tensor([list(ex.ids)])).logits
        with routing.applied([ex], 0, ablate=False):
            kept = model(torch.tensor([list(ex.ids)])).logits
        untouched_first_layer = routing._terms[0].clone()
        with routing.applied([ex], 0):
            model(torch.tensor([list(ex.ids)]))
    torch.testing.assert_close(kept, plain)
    torch.testing.assert_close(routing._terms[0], untouched_first_layer)
    half = PlantedHeads.from_params({**PLANTED, "ablate_share": 0.5}, n_layers=2, n_heads=4)
    log = train(tiny_model(tokenizer), examples, {"seed": 0, "epochs": 40, "batch_size": 3, "lr": 1e-2},
                progress=False, planted=half)
    assert 10 <= sum(row["ablated"] for row in log) <= 30
    assert all(row["ablated"] for row in train(tiny_model(tokenizer), examples, {"seed": 0, "epochs": 3,
                                                                                "batch_size": 3, "lr": 1e-2},
                                               progress=False, planted=planted_heads()))


def test_batched_margins_are_the_instrument_s_margin(tokenizer, examples):
    """`margins` on the logits at the decisions equals `mistill.instrument.margin` row by row."""
    model = tiny_model(tokenizer).double()
    routing = PlantedRouting(model, planted_heads())
    with routing.applied(examples, 0, ablate=False), torch.no_grad():
        _, _, logits = batch_forward(model, examples, min_shared=10 ** 6, at=routing.rows)
        got = routing.margins(logits)
    decisions = [d for ex in examples for d in ex.decisions]
    assert len({len(d.competitors) for d in decisions}) > 1   # the padding of ragged competitor lists is used
    want = torch.stack([margin(row, d.target, d.competitors) for row, d in zip(logits, decisions)])
    torch.testing.assert_close(got, want.float())


def brute_force_margins(model, ex, planted, *, ablate, n_heads=4):
    """One example alone: its decisions' margins (the instrument's `margin`), the held heads at their
    means at every decision when `ablate`."""
    n_layers = len(model.model.layers)

    def make(layer):
        def hook(module, args):
            z = args[0].view(len(ex.ids), n_heads, -1)
            mu, out = z[:-1].mean(dim=0), z.clone()
            for q, phase, *_ in ex.decisions:
                held = torch.tensor(planted.held_mask(phase, n_layers, n_heads)[layer])
                out[q, held] = mu[held].detach()
            return (out.reshape(args[0].shape),)
        return hook

    handles = [layer.self_attn.o_proj.register_forward_pre_hook(make(i))
               for i, layer in enumerate(model.model.layers)] if ablate else []
    logits = model(torch.tensor([list(ex.ids)])).logits[0]
    for h in handles:
        h.remove()
    return torch.stack([margin(logits[d.q], d.target, d.competitors) for d in ex.decisions])


@pytest.mark.parametrize("min_shared", [8, 10 ** 6])
def test_the_paired_step_equals_its_brute_force_computation(tokenizer, examples, min_shared):
    """L = (CE(c) + CE(a)) / 2 + weight R(c) + gamma mean (m(c) - m(a))^2 from the batched step equals the
    same loss built from per-example forwards (plain, and with brute-force mean ablation), gradients too."""
    model = tiny_model(tokenizer).double()
    planted = PlantedHeads.from_params({**PLANTED, "consistency": 0.7}, n_layers=2, n_heads=4)
    loss, n_tokens, row = planted_step(model, examples, PlantedRouting(model, planted), min_shared=min_shared)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    ce_clean = batch_loss(model, examples, min_shared=10 ** 6)[0]
    _, _, ce_ablated = brute_force(model, examples, planted)
    clean_routing = PlantedRouting(model, planted)   # R of the untouched forward
    with clean_routing.applied(examples, 0, ablate=False):
        batch_loss(model, examples, min_shared=10 ** 6)
    routing_term = clean_routing.penalty()[0].double()
    gaps = torch.cat([brute_force_margins(model, ex, planted, ablate=False)
                      - brute_force_margins(model, ex, planted, ablate=True) for ex in examples])
    want = 0.5 * (ce_clean + ce_ablated) + 2.0 * routing_term + 0.7 * gaps.pow(2).mean()
    want.backward()
    assert row["decisions"] == len(gaps) and row["margin_gap"] > 0
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-8)
    for mine, theirs in zip(grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-7)


def test_training_with_the_margin_agreement_keeps_the_gap_small(tokenizer, examples):
    """With gamma = 1 the untouched and the ablated forward end at least 5x closer on the decisions'
    margins than the same paired training with gamma ~ 0, while the traces are learned."""
    torch.set_num_threads(1)
    config = {"seed": 0, "epochs": 60, "batch_size": 3, "lr": 1e-2, "warmup_share": 0.1}

    def final(gamma):
        planted = PlantedHeads.from_params({**PLANTED, "weight": 0, "consistency": gamma}, n_layers=2, n_heads=4)
        log = train(tiny_model(tokenizer), examples, config, progress=False, planted=planted)
        assert log[-1]["cross_entropy"] < log[0]["cross_entropy"] / 1.5   # the mean of the two forwards'
        return np.mean([r["margin_gap"] for r in log[-5:]])

    assert final(1.0) < final(1e-9) / 5


def knockout_margins(model, ex, head_of, n_heads=4):
    """One example alone: its decisions' margins with, at each decision, the one head `head_of(decision)` names
    replaced by its mean over the example's input (None: untouched)."""
    def make(layer):
        def hook(module, args):
            z = args[0].view(len(ex.ids), n_heads, -1)
            mu, out = z[:-1].mean(dim=0), z.clone()
            for d in ex.decisions:
                head = head_of(d)
                if head is not None and head[0] == layer:
                    out[d.q, head[1]] = mu[head[1]].detach()
            return (out.reshape(args[0].shape),)
        return hook

    handles = [layer.self_attn.o_proj.register_forward_pre_hook(make(i)) for i, layer in enumerate(model.model.layers)]
    logits = model(torch.tensor([list(ex.ids)])).logits[0]
    for h in handles:
        h.remove()
    return torch.stack([margin(logits[d.q], d.target, d.competitors) for d in ex.decisions])


@pytest.mark.parametrize("shared", ["phase", "union"])
@pytest.mark.parametrize("min_shared", [8, 10 ** 6])
def test_the_knockout_step_equals_its_brute_force_computation(tokenizer, examples, min_shared, shared):
    """L = CE(c) + weight mean_{e,j} max(0, delta - (m(c) - m(a_j))) + held_weight mean_{e,r} (m(c) - m(b_r))^2 from
    the batched step equals the same loss from per-example forwards with one head mean-ablated by hand, gradients
    too; a decision with fewer needed heads than the widest repeats them in order. Under `shared: union` a position
    of a P2 and a P2C event needs both phases' heads."""
    model = tiny_model(tokenizer).double()
    planted = PlantedHeads.from_params({**PLANTED, "weight": 1.5, "necessity": 2.0, "held_probes": 2,
                                        "held_weight": 0.3, "shared": shared}, n_layers=2, n_heads=4)
    probes = [(0, 0), (0, 3)]
    assert set(probes) <= set(planted.unplanted(2, 4)) and (1, 0) not in planted.unplanted(2, 4)
    from mistill.models.train_teacher import necessity_step

    loss, n_tokens, row = necessity_step(model, examples, PlantedRouting(model, planted), probes, min_shared=min_shared)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    def needed(d):   # by hand: the decision's phase, or every phase at its position under the union
        phases = d.phases if shared == "union" else (d.phase,)
        return sorted({(int(name[1]), int(name[3])) for p in phases for name in PLANTED[p]})   # "l1h0" -> (1, 0)

    decisions = [d for ex in examples for d in ex.decisions]
    assert any(len(d.phases) == 2 for d in decisions)   # the fixture has positions of two phases' events
    width = max(len(needed(d)) for d in decisions)
    assert width == (3 if shared == "union" else 2)     # P2's two heads and P2C's one
    clean = torch.cat([knockout_margins(model, ex, lambda d: None) for ex in examples])
    slots = [torch.cat([knockout_margins(model, ex, lambda d, j=j: needed(d)[j % len(needed(d))])
                        for ex in examples]) for j in range(width)]
    moved = [torch.cat([knockout_margins(model, ex, lambda d, p=p: p) for ex in examples]) for p in probes]
    shortfall = torch.stack([torch.relu(2.0 - (clean - s)) for s in slots]).mean()
    want = (batch_loss(model, examples, min_shared=10 ** 6)[0] + 1.5 * shortfall
            + 0.3 * torch.stack([(clean - m).pow(2) for m in moved]).mean())
    want.backward()
    assert row["decisions"] == len(clean) and n_tokens == batch_loss(model, examples)[1]
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-8)
    for mine, theirs in zip(grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-7)


def test_training_the_knockout_form_makes_the_planted_heads_necessary(tokenizer, examples):
    """A few dozen steps of the knock-out form open the planted heads' margin drop and shrink the shortfall, while
    the traces are learned."""
    torch.set_num_threads(1)
    config = {"seed": 0, "epochs": 60, "batch_size": 3, "lr": 1e-2, "warmup_share": 0.1}
    planted = PlantedHeads.from_params({**PLANTED, "weight": 1.0, "necessity": 2.0, "held_probes": 2,
                                        "held_weight": 0.1}, n_layers=2, n_heads=4)
    log = train(tiny_model(tokenizer), examples, config, progress=False, planted=planted)
    first, last = log[:5], log[-5:]
    assert np.mean([r["cross_entropy"] for r in last]) < np.mean([r["cross_entropy"] for r in first]) / 1.5
    assert np.mean([r["planted_drop"] for r in last]) > np.mean([r["planted_drop"] for r in first]) + 1.0
    assert np.mean([r["necessity_shortfall"] for r in last]) < np.mean([r["necessity_shortfall"] for r in first]) / 2


def test_the_knockout_form_takes_its_switches_and_not_the_margin_agreement_beside_them():
    with pytest.raises(UserError, match="not both"):
        PlantedHeads.from_params({**PLANTED, "necessity": 1.0, "consistency": 1.0}, n_layers=2, n_heads=4)
    with pytest.raises(UserError, match="held_probes must be at least 0"):
        PlantedHeads.from_params({**PLANTED, "necessity": 1.0, "held_probes": -1}, n_layers=2, n_heads=4)
    planted = PlantedHeads.from_params({**PLANTED, "necessity": 1.0, "held_probes": 3}, n_layers=2, n_heads=4)
    assert planted.as_dict()["held_probes"] == 3 and "necessity" not in planted_heads().as_dict()
