"""Teacher targets, both arms under one trainer, resume, and refusals of wrong inputs (tiny models)."""

import json

import numpy as np
import pytest
import torch

from mistill.distill import arms
from mistill.distill import pools as pl
from mistill.distill import targets as tg
from mistill.distill.trainer import TrainConfig, Trainer, epoch_order
from mistill.errors import UserError
from mistill.io import write_jsonl
from mistill.models.architectures import TinyArchitecture, build_model
from mistill.models.tokenizers import CompactTokenizer, build_remap, qwen3_tokenizer, smollm3_tokenizer

torch.set_num_threads(1)


def _tok(base, note_prompt, completion):
    return CompactTokenizer(base, build_remap(base, [base.chat_prompt(note_prompt) + completion]))


def _model(tok, seed, layers=3, family="qwen3", hidden=48, heads=4):
    arch = TinyArchitecture(family=family, hidden_size=hidden, intermediate_size=64, num_hidden_layers=layers,
                            num_attention_heads=heads, num_key_value_heads=2, head_dim=hidden // heads)
    return build_model(arch, vocab_size=tok.vocab_size, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id, seed=seed)


def _head_sets(n_layers, n_heads, seed):
    rng = np.random.default_rng(seed)
    phases = {}
    for phase in ("P1", "P2", "P2C", "prose"):
        ic = np.sort(rng.normal(size=n_layers * n_heads))[::-1]
        order = rng.permutation(n_layers * n_heads)
        phases[phase] = [{"layer": int(o // n_heads), "head": int(o % n_heads), "ic": float(v), "weight": 0.0}
                         for o, v in zip(order, ic)]
    return {"n_layers": n_layers, "n_heads": n_heads, "phases": phases, "tau": {}, "provenance": {}}


def targets_world(tmp_path, notes: dict, completion: str, events: list, *, layers: int, head_sets: dict, k: int):
    """A tiny teacher's targets on `notes` (id -> text; the same trace after each): the tokenizer, the teacher,
    the prompts and the targets' manifest (under tmp_path / "targets")."""
    from mistill.world.prompt import build_prompt
    from tests.distill.conftest import LINES

    prompts = {n: build_prompt(text, LINES) for n, text in notes.items()}
    base = qwen3_tokenizer()
    tok = CompactTokenizer(base, build_remap(base, [base.chat_prompt(p) + completion for p in prompts.values()]))
    teacher = _model(tok, seed=1, layers=layers)
    for note_id in notes:
        write_jsonl(tmp_path / "events" / note_id / "events.jsonl", events)
    traces = [{"note_id": n, "prompt": p, "completion": completion, "valid": True} for n, p in prompts.items()]
    manifest = tg.compute_targets(teacher, tok, traces, tmp_path / "events", tmp_path / "targets",
                                  pl.build_pools(head_sets, k), pl.build_pool(head_sets, "prose", k), window=8, topk=8,
                                  teacher_id="tiny-teacher", provenance={})
    return tok, teacher, prompts, manifest


@pytest.fixture(scope="module")
def setup(tmp_path_factory, note_prompt, completion, events):
    tmp_path = tmp_path_factory.mktemp("targets")
    tok = _tok(qwen3_tokenizer(), note_prompt, completion)
    teacher = _model(tok, seed=1, layers=3)
    events_dir = tmp_path / "events"
    for note_id in ("n1", "n2"):
        write_jsonl(events_dir / note_id / "events.jsonl", events)
    traces = [{"note_id": n, "prompt": note_prompt, "completion": completion, "valid": True} for n in ("n1", "n2")]
    traces.append({"note_id": "bad", "prompt": note_prompt, "completion": completion, "valid": False})
    hs = _head_sets(3, 4, 0)
    t_pools = pl.build_pools(hs, 6)
    prose = pl.build_pool(hs, "prose", 6)
    out = tmp_path / "targets"
    manifest = tg.compute_targets(teacher, tok, traces, events_dir, out, t_pools, prose, window=8, topk=8,
                                  teacher_id="tiny-teacher", provenance={})
    return {"tok": tok, "teacher": teacher, "out": out, "manifest": manifest, "note_prompt": note_prompt,
            "completion": completion, "events": events, "events_dir": events_dir, "traces": traces}


def test_targets_files_and_teacher_record(setup):
    m = setup["manifest"]
    assert m["notes"] == ["n1", "n2"] and m["skipped"][0]["note_id"] == "bad"
    meta, arrays = tg.read_note_targets(setup["out"] / "n1.npz")
    assert arrays["P1_rows"].shape[0] == 2 and arrays["P2C_rows"].shape[0] == 1
    assert np.allclose(arrays["P1_rows"].sum(-1), 1.0, atol=1e-5)
    assert arrays["window_rows"].shape[0] == 16  # 8 rows before each of 2 P1 events
    # carved slots: empty at P1, populated at P2C (the prefix "N18." at least)
    n_base = len(meta["axis"]["base"])
    assert np.all(arrays["P1_rows"][:, n_base + 1:] == 0)
    assert arrays["P2C_rows"][0, n_base + 1:].sum() > 0
    assert np.all((arrays["P1_m"] >= 0) & (arrays["P1_m"] <= 1))
    assert tg.teacher_fingerprint(setup["teacher"]) == m["teacher_hash"]


def test_teacher_targets_reproduced_by_an_independent_route(setup):
    """App. I.5: the stored pooled rows equal eager full attention pooled by brute force."""
    meta, arrays = tg.read_note_targets(setup["out"] / "n1.npz")
    tok, teacher = setup["tok"], setup["teacher"]
    from mistill.distill import buckets as bk
    from mistill.distill.mechanism import note_view
    axis = bk.build_axis(meta["prompt"], meta["completion"])
    view = note_view(tok, axis, meta["events"], meta["competitors"])
    with torch.no_grad():
        attn = teacher(input_ids=torch.tensor([view.ids]), output_attentions=True).attentions
    pool = pl.Pool(**{k: v for k, v in zip(("phase", "heads", "weights"),
                                           ("P1", tuple(map(tuple, setup["manifest"]["pools"]["P1"]["heads"])),
                                            tuple(setup["manifest"]["pools"]["P1"]["weights"])))})
    p1 = [ev for ev in view.realized if ev.kind == "P1"]
    for row_i, ev in enumerate(p1):
        brute = np.zeros(axis.n_buckets)
        for (layer, head), w in zip(pool.heads, pool.weights):
            brute += w * bk.pool_rows_numpy(attn[layer][0, head, ev.row].numpy(), view.tokens.base_index,
                                            axis.n_buckets)
        assert np.allclose(arrays["P1_rows"][row_i], brute, atol=1e-5)


def test_targets_pass_reuses_only_files_written_from_the_same_inputs(setup, tmp_path):
    """Resumable per note, but a note's file made from other pools (or events, trace, window) is recomputed."""
    import shutil

    out = tmp_path / "targets"
    shutil.copytree(setup["out"], out)
    traces = [t for t in setup["traces"] if t["note_id"] == "n1"]
    hs = _head_sets(3, 4, 0)
    before = (out / "n1.npz").stat().st_mtime_ns
    kwargs = dict(window=8, topk=8, teacher_id="tiny-teacher", provenance={})
    tg.compute_targets(setup["teacher"], setup["tok"], traces, setup["events_dir"], out, pl.build_pools(hs, 6),
                       pl.build_pool(hs, "prose", 6), **kwargs)
    assert (out / "n1.npz").stat().st_mtime_ns == before  # same inputs: kept
    manifest = (out / "manifest.json").read_bytes()
    again = tg.compute_targets(setup["teacher"], setup["tok"], traces, setup["events_dir"], out, pl.build_pools(hs, 6),
                               pl.build_pool(hs, "prose", 6), **{**kwargs, "provenance": {"code_version": "other"}})
    assert (out / "manifest.json").read_bytes() == manifest and again["provenance"] == {}   # nothing to do: as was
    tg.compute_targets(setup["teacher"], setup["tok"], traces, setup["events_dir"], out, pl.build_pools(hs, 4),
                       pl.build_pool(hs, "prose", 6), **kwargs)
    _, arrays = tg.read_note_targets(out / "n1.npz")
    _, original = tg.read_note_targets(setup["out"] / "n1.npz")
    assert (out / "n1.npz").stat().st_mtime_ns != before  # other pools: recomputed ...
    assert not np.allclose(arrays["P1_rows"], original["P1_rows"])  # ... with the new pools' rows
    assert "input_key" not in arrays


def test_targets_refuse_events_free_trace_and_other_teacher(setup, tmp_path):
    write_jsonl(setup["events_dir"] / "empty" / "events.jsonl", [{"kind": "NULL", "anchor": 3}])
    traces = [{"note_id": "empty", "prompt": setup["note_prompt"], "completion": setup["completion"], "valid": True}]
    hs = _head_sets(3, 4, 0)
    with pytest.raises(UserError, match="no P1/P2/P2C events"):
        tg.compute_targets(setup["teacher"], setup["tok"], traces, setup["events_dir"], tmp_path / "t2",
                           pl.build_pools(hs, 6), None, window=8, topk=8, teacher_id="x", provenance={})
    assert not (tmp_path / "t2" / "empty.npz").exists()
    other = _model(setup["tok"], seed=99, layers=3)
    with pytest.raises(UserError, match="not from"):
        tg.check_teacher(setup["out"] / "manifest.json", tg.teacher_fingerprint(other), "other-teacher")


def _batches(setup, student_tok, arm):
    out = []
    for note_id in setup["manifest"]["notes"]:
        meta, arrays = tg.read_note_targets(setup["out"] / f"{note_id}.npz")
        out.append(arms.prepare_note(meta, arrays, student_tok, setup["tok"], arm))
    return out


def test_student_tokenizer_realising_no_event_is_refused(setup):
    """A note whose only events sit inside SmolLM3's merged digit run "18": nothing to supervise."""
    meta, arrays = tg.read_note_targets(setup["out"] / "n1.npz")
    keep = [i for i, ev in enumerate(meta["events"]) if ev["kind"] == "P2" and ev["prefix"] == "N1"]
    meta["events"] = [meta["events"][i] for i in keep]
    meta["competitors"] = [meta["competitors"][i] for i in keep]
    base = smollm3_tokenizer()
    stok = CompactTokenizer(base, build_remap(base, [base.chat_prompt(setup["note_prompt"]) + setup["completion"]]))
    with pytest.raises(UserError, match="realises none"):
        arms.prepare_note(meta, arrays, stok, setup["tok"], arms.ArmConfig(arm="mistill"))
    # the same note is fine for Vanilla CoT-KD, which needs no events
    arms.prepare_note(meta, arrays, stok, setup["tok"], arms.ArmConfig(arm="vanilla"))


def test_training_resumes_exactly(setup, tmp_path):
    """Optimiser, scheduler and RNG states restored: steps 3-4 of an interrupted run equal the
    uninterrupted run's (Mistill arm; the Vanilla arm shares the trainer and runs in test_commands)."""
    tok = setup["tok"]
    s_pools = pl.build_pools(_head_sets(2, 4, 5), 5)
    cfg = TrainConfig(epochs=2, batch=1, lr=3e-3, precision="fp32", seed=0, gradient_checkpointing=False)
    arm = arms.ArmConfig(arm="mistill", lambda_p1=1.0, lambda_p2=1.0, row_chunk=4)
    full = Trainer(_model(tok, seed=3, layers=2), _batches(setup, tok, arm), arm, cfg, tmp_path / "a",
                   pools=s_pools).run()
    assert len(full) == 4 and all(np.isfinite(r["loss"]) for r in full)
    Trainer(_model(tok, seed=3, layers=2), _batches(setup, tok, arm), arm, cfg, tmp_path / "b",
            pools=s_pools).run(max_steps=2)
    resumed = Trainer(_model(tok, seed=3, layers=2), _batches(setup, tok, arm), arm, cfg, tmp_path / "b",
                      pools=s_pools).run()
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in full[2:]], rel=1e-6)
    cfg_json = json.loads((tmp_path / "b" / "config.json").read_text())
    assert cfg_json["resumed"] and cfg_json["example_ids"] == ["n1", "n2"]
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4]
    assert {"P1_attn", "P1_inter", "P2C_attn", "step_time_s", "peak_memory_bytes"} <= set(full[0])
    # a finished run resumed does nothing and leaves every file as it was (its readers stay fresh)
    before = {p.relative_to(tmp_path): p.read_bytes() for p in sorted((tmp_path / "a").rglob("*")) if p.is_file()}
    again = Trainer(_model(tok, seed=3, layers=2), _batches(setup, tok, arm), arm, cfg, tmp_path / "a",
                    pools=s_pools, run_config={"provenance": {"code_version": "another commit"}}).run()
    assert again == []
    assert {p.relative_to(tmp_path): p.read_bytes() for p in sorted((tmp_path / "a").rglob("*"))
            if p.is_file()} == before
    # a different recipe in the same directory is refused, not silently mixed
    other = TrainConfig(epochs=2, batch=1, lr=1e-3, precision="fp32", seed=0, gradient_checkpointing=False)
    with pytest.raises(UserError, match="different run"):
        Trainer(_model(tok, seed=3, layers=2), _batches(setup, tok, arm), arm, other, tmp_path / "b",
                pools=s_pools).run()
    # ... unless the caller (a pipeline stage whose inputs changed) asks to start afresh
    restarted = Trainer(_model(tok, seed=3, layers=2), _batches(setup, tok, arm), arm, other, tmp_path / "b",
                        pools=s_pools, restart_if_different=True).run(max_steps=1)
    assert [r["step"] for r in restarted] == [1]
    assert not json.loads((tmp_path / "b" / "config.json").read_text())["resumed"]
    # the same recipe on other targets (or other initial weights) is another run too
    Trainer(_model(tok, seed=3, layers=2), _batches(setup, tok, arm), arm, cfg, tmp_path / "c", pools=s_pools,
            run_config={"targets_sha256": "a"}).run(max_steps=1)
    with pytest.raises(UserError, match="targets_sha256"):
        Trainer(_model(tok, seed=3, layers=2), _batches(setup, tok, arm), arm, cfg, tmp_path / "c", pools=s_pools,
                run_config={"targets_sha256": "b"}).run()


def test_a_finished_run_of_the_same_identity_is_taken_as_the_run_it_would_train(setup, tmp_path):
    """`same_run_as` / `reuse`: a second run of the same recipe takes the finished run's files, which equal what
    training it would write; a run that differs in any identity field (here λ) is not the same run."""
    tok = setup["tok"]
    s_pools = pl.build_pools(_head_sets(2, 4, 5), 5)
    cfg = TrainConfig(epochs=1, batch=1, lr=3e-3, precision="fp32", seed=0, gradient_checkpointing=False)
    arm = arms.ArmConfig(arm="mistill", lambda_p1=1.0, lambda_p2=1.0, row_chunk=4)

    def trainer(out, arm=arm):
        return Trainer(_model(tok, seed=3, layers=2), _batches(setup, tok, arm), arm, cfg, tmp_path / out,
                       pools=s_pools, run_config={"provenance": {"stage": out}})

    trainer("main").run()
    trained = trainer("trained")
    assert not trained.same_run_as(tmp_path / "trained")        # itself, not yet run
    trained.run()
    taken = trainer("taken")
    assert taken.same_run_as(tmp_path / "main")
    taken.reuse(tmp_path / "main")

    def files(run):
        return {p.relative_to(tmp_path / run).as_posix(): p.read_bytes()
                for p in sorted((tmp_path / run).rglob("*")) if p.is_file() and p.relative_to(tmp_path / run).as_posix() != "config.json"}

    weights = "model/model.safetensors"
    assert files("taken")[weights] == files("trained")[weights] == files("main")[weights]
    assert files("taken").keys() == files("trained").keys()
    assert files("taken")["model/config.json"] == files("trained")["model/config.json"]   # the model's own config
    config = json.loads((tmp_path / "taken" / "config.json").read_text())
    assert config["same_run_as"] == str(tmp_path / "main") and config["provenance"] == {"stage": "taken"}
    lighter = arms.ArmConfig(arm="mistill", lambda_p1=0.3, lambda_p2=1.0, row_chunk=4)
    assert not trainer("lighter", lighter).same_run_as(tmp_path / "main")
    unfinished = trainer("unfinished")
    unfinished.run(max_steps=1)
    assert not trainer("another").same_run_as(tmp_path / "unfinished")


def test_mistill_attention_term_falls_during_short_training(setup, tmp_path):
    tok = setup["tok"]
    s_pools = pl.build_pools(_head_sets(2, 4, 5), 5)
    arm = arms.ArmConfig(arm="mistill", lambda_p1=1.0, lambda_p2=1.0)
    notes = _batches(setup, tok, arm)[:1]
    cfg = TrainConfig(epochs=12, batch=1, lr=1e-2, warmup_frac=0.0, precision="fp32", gradient_checkpointing=False,
                      save_every=100)
    rows = Trainer(_model(tok, seed=3, layers=2), notes, arm, cfg, tmp_path / "run", pools=s_pools).run()
    attn = [r["attn"] for r in rows]
    assert attn[-1] < 0.5 * attn[0]


def test_cross_tokenizer_student_trains_on_realised_subset(setup, tmp_path):
    base = smollm3_tokenizer()
    stok = CompactTokenizer(base, build_remap(base, [base.chat_prompt(setup["note_prompt"]) + setup["completion"]]))
    arm = arms.ArmConfig(arm="mistill", row_chunk=8)
    notes = _batches(setup, stok, arm)
    assert notes[0].uld  # SmolLM3 tokenises the trace differently: ULD replaces the top-32 KL
    kinds = [ev.kind for ev in notes[0].view.realized]
    assert kinds.count("P1") == 2 and kinds.count("P2") == 4
    s_pools = pl.build_pools(_head_sets(2, 4, 7), 5)
    model = _model(stok, seed=4, layers=2, family="smollm3", hidden=48, heads=4)
    rows = Trainer(model, notes, arm, TrainConfig(epochs=1, batch=2, precision="bf16"), tmp_path / "smol",
                   pools=s_pools).run()
    assert len(rows) == 1 and np.isfinite(rows[0]["loss"])


def test_offloaded_checkpoints_train_on_a_cpu(setup, tmp_path):
    """The paper's recipe (gradient checkpointing, offloaded layer inputs, MLP chunks) on a model that sits
    on the CPU: pinned host memory needs an accelerator, so nothing is offloaded (the rehearsal found it)."""
    tok = setup["tok"]
    arm = arms.ArmConfig(arm="vanilla")
    cfg = TrainConfig(epochs=1, batch=2, precision="bf16", gradient_checkpointing=True, offload_checkpoints=True,
                      mlp_chunk=16)
    rows = Trainer(_model(tok, seed=3, layers=2), _batches(setup, tok, arm), arm, cfg, tmp_path / "run").run()
    assert len(rows) == 1 and np.isfinite(rows[0]["loss"])


def test_epoch_order_depends_only_on_seed_and_epoch():
    assert epoch_order(10, 0, 1) == epoch_order(10, 0, 1)
    assert epoch_order(10, 0, 1) != epoch_order(10, 0, 0)


def test_chunked_mlp_changes_memory_not_values(setup):
    from mistill.distill.trainer import chunk_mlps

    ids = torch.randint(1, setup["tok"].vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    grads = []
    for chunk in (0, 7):
        model = _model(setup["tok"], seed=3, layers=2).train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        chunk_mlps(model, chunk)
        out = model(input_ids=ids).logits
        out.float().pow(2).mean().backward()
        grads.append((out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        assert set(model.state_dict()) == set(_model(setup["tok"], seed=3, layers=2).state_dict())
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-6)
    for name, g in grads[0][1].items():
        assert torch.allclose(grads[1][1][name], g, atol=1e-6, rtol=1e-4), name


def test_event_weights_up_weight_the_event_and_window_rows_only(setup):
    """evw4 (App. M.1): weight w at each realised event's decision row and at the W rows before each P1 event;
    the weighted CoT sums equal the per-token losses weighted by hand, and with w = 1 the unweighted sums."""
    from mistill.distill import objective as obj

    meta, arrays = tg.read_note_targets(setup["out"] / "n1.npz")
    arm = arms.ArmConfig(arm="vanilla", window=3, event_weight=4.0)
    batch = arms.prepare_note(meta, arrays, setup["tok"], setup["tok"], arm)
    view = arms.note_view(setup["tok"], arms.bk.build_axis(meta["prompt"], meta["completion"]), meta["events"],
                          meta["competitors"])
    rows = {ev.row for ev in view.realized} | {ev.row - d for ev in view.realized if ev.kind == "P1"
                                               for d in (1, 2, 3)}
    assert torch.equal(batch.token_weights, torch.tensor([4.0 if t in rows else 1.0 for t in range(len(view.ids))]))
    assert arms.ArmConfig(arm="vanilla").as_dict().get("event_weight") is None   # old runs keep their identity
    assert arm.as_dict()["event_weight"] == 4.0

    torch.manual_seed(0)
    logits = torch.randn(len(view.ids), setup["tok"].vocab_size, dtype=torch.float64)
    args = (batch.top_ids, batch.top_logprobs)
    ce_t, kl_t = obj.cot_token_losses(logits, batch.labels, *args)
    keep = batch.labels != -100
    w = batch.token_weights[keep].double()
    ce, kl, n, extra = obj.weighted_cot_loss_sums(logits, batch.labels, batch.token_weights, *args)
    assert n == int(keep.sum()) and float(ce) == pytest.approx(float((w * ce_t).sum()), rel=1e-6)
    assert float(kl) == pytest.approx(float((w * kl_t).sum()), rel=1e-6)
    assert extra == pytest.approx(float(((w - 1) * (ce_t + kl_t)).sum()), rel=1e-6) and extra > 0
    plain = obj.cot_loss_sums(logits, batch.labels, *args)
    same = obj.weighted_cot_loss_sums(logits, batch.labels, torch.ones(len(view.ids)), *args)
    assert float(same[0]) == pytest.approx(float(plain[0]), rel=1e-6) and same[3] == 0.0
    assert float(same[1]) == pytest.approx(float(plain[1]), rel=1e-6)
    with pytest.raises(UserError, match="event-weight"):
        arms.ArmConfig(arm="vanilla", event_weight=0.0)
