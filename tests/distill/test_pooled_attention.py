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
    layers = [1, 3]  # for smollm3 with interval 2, layer 1 / 3 are NoPE layers, 0 / 2 use RoPE
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


def test_pooled_rows_gradient_reaches_projections_under_checkpointing():
    model = _tiny("qwen3").train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config._attn_implementation = "sdpa"
    ids = torch.randint(2, 50, (1, 17))
    cap = pa.LayerInputCapture(model, [2])
    cap.start()
    out = model(input_ids=ids)
    cap.stop()
    pools = [pa.LayerPool(2, torch.tensor([1, 2]), torch.tensor([0.7, 0.3]))]
    buckets = torch.randint(0, 5, (17,))
    pooled, _ = pa.pooled_rows(model, cap, pools, torch.tensor([5, 16]), buckets, 5, row_chunk=1)
    assert torch.allclose(pooled.sum(-1), torch.ones(2), atol=1e-5)
    (pooled[:, 0].sum() + out.logits.float().mean()).backward()
    assert model.model.layers[2].self_attn.q_proj.weight.grad.abs().sum() > 0
    assert model.model.layers[1].mlp.up_proj.weight.grad.abs().sum() > 0
    cap.remove()
