"""Rows recomputed at the supervised positions equal the model's own eager attention and o_proj input."""

import pytest
import torch

from mistill.distill import pooled_attention as pa
from mistill.models.architectures import TinyArchitecture, build_model


def _tiny(family):
    arch = TinyArchitecture(family=family, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, no_rope_layer_interval=2)
    return build_model(arch, vocab_size=50, eos_token_id=0, pad_token_id=1, seed=0)


@pytest.mark.parametrize("family", ["qwen3", "smollm3"])
def test_rows_match_eager_attention_and_o_proj_input(family):
    torch.manual_seed(0)
    model = _tiny(family)
    ids = torch.randint(2, 50, (1, 23))
    # smollm3 with interval 2 alternates RoPE and NoPE layers; all four layers are checked
    z_seen = {}
    hooks = [model.model.layers[l].self_attn.o_proj.register_forward_pre_hook(
        lambda m, a, l=l: z_seen.__setitem__(l, a[0].detach())) for l in range(4)]
    cap = pa.LayerInputCapture(model, range(4))
    cap.start()
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
    cap.stop()
    for h in hooks:
        h.remove()
    rows = torch.tensor([3, 10, 22])
    heads = torch.tensor([0, 3])
    for l in range(4):
        cos, sin = cap.rotary[l]
        probs, writes = pa.attention_rows(model.model.layers[l], cap.inputs[l][0], (cos[0], sin[0]), rows, heads,
                                          with_writes=True)
        ref = out.attentions[l][0][heads][:, rows]
        assert torch.allclose(probs, ref.float(), atol=1e-5)
        z = z_seen[l][0, rows].view(3, 4, 16)[:, heads]
        w_o = model.model.layers[l].self_attn.o_proj.weight.view(64, 4, 16)[:, heads]
        assert torch.allclose(writes, torch.einsum("rhd,Dhd->rhD", z, w_o), atol=1e-5)
    assert cap.final_input is not None and cap.final_input.shape == (1, 23, 64)
    cap.remove()


def _pooled_loss_grads(checkpointing: bool, nested: bool):
    model = _tiny("qwen3").train()
    model.config._attn_implementation = "sdpa"
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(2, 50, (1, 17), generator=torch.Generator().manual_seed(1))
    hook = pa.SupervisedRows(model, [1, 2], row_chunk=1, nested_checkpoint=nested, nested_min_elements=0)
    pools = [pa.LayerPool(1, torch.tensor([0]), torch.tensor([0.4])),
             pa.LayerPool(2, torch.tensor([1, 2]), torch.tensor([0.4, 0.2]))]
    buckets = torch.randint(0, 5, (17,), generator=torch.Generator().manual_seed(2))
    hook.arm([pa.RowRequest("P1", torch.tensor([5, 16]), buckets, pools, with_writes=True)], 5)
    out = model(input_ids=ids)
    hook.stop_recording()
    pooled, writes = hook.collect()["P1"]
    loss = (pooled[:, 0] * torch.tensor([1.0, 2.0])).sum() + writes.float().pow(2).mean() + out.logits.float().mean()
    loss.backward()
    hook.remove()
    return pooled.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_rows_inside_checkpointed_layers_give_the_plain_gradients():
    """The pooled rows and their gradients are the same with and without (nested) checkpointing."""
    ref_pooled, ref = _pooled_loss_grads(False, False)
    assert torch.allclose(ref_pooled.sum(-1), torch.ones(2), atol=1e-5)
    assert ref["model.layers.2.self_attn.q_proj.weight"].abs().sum() > 0
    assert ref["model.layers.1.self_attn.k_proj.weight"].abs().sum() > 0
    for checkpointing, nested in ((True, False), (True, True)):
        pooled, grads = _pooled_loss_grads(checkpointing, nested)
        assert torch.allclose(pooled, ref_pooled, atol=1e-6)
        for name, g in ref.items():
            assert torch.allclose(grads[name], g, atol=1e-6, rtol=1e-4), name
