"""bf16 GEMMs through fp32 on CPUs without bf16 kernels: the same numbers as the native bf16 kernel,
up to the order of fp32 sums, in the forward and the backward pass; everything else untouched."""

import pytest
import torch
import torch.nn.functional as F

from mistill.cli import main
from mistill.errors import UserError
from mistill.models import cpu_bf16
from mistill.models.architectures import TinyArchitecture, build_model

ULP = 2.0 ** -7   # bf16's relative spacing: one unit in the last place of an 8-bit significand


def close_to_bf16_rounding(got: torch.Tensor, ref: torch.Tensor, ulps: float = 2.0) -> bool:
    """Within a few bf16 units in the last place of the reference (a sum rounded after another order)."""
    got, ref = got.float(), ref.float()
    return bool(((got - ref).abs() <= ulps * ULP * ref.abs() + 1e-6).all())


def gemm_forms(x, w, b):
    return [F.linear(x, w, b), F.linear(x, w), x @ w.T, torch.bmm(x[None], w.T[None])[0],
            torch.addmm(b, x, w.T), torch.einsum("rd,cd->rc", x, w)]


@pytest.mark.parametrize("autocast", [False, True])
def test_emulated_gemms_equal_native_bf16_ones(autocast):
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*shape, generator=g) for shape in [(16, 48), (24, 48), (24,)])
    if not autocast:           # the bf16 arm: bf16 weights and activations
        x, w, b = x.bfloat16(), w.bfloat16(), b.bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        native = gemm_forms(x, w, b)
        with cpu_bf16.make_mode():
            emulated = gemm_forms(x, w, b)
    for n, e in zip(native, emulated):
        assert e.dtype == n.dtype == torch.bfloat16
        assert close_to_bf16_rounding(e, n)
    # Products of bf16 operands are exact in fp32: the emulated product is the fp32 product of the
    # rounded operands, rounded once.
    exact = (x.bfloat16().double() @ w.bfloat16().double().T).bfloat16()
    assert close_to_bf16_rounding(emulated[1], exact, ulps=1.0)


def test_fp32_work_is_untouched():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(8, 32, generator=g), torch.randn(32, 8, generator=g)
    with cpu_bf16.make_mode():
        inside = a @ b
    assert torch.equal(inside, a @ b) and inside.dtype == torch.float32


def test_flash_attention_forward_and_backward_match_native():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 9, 8, generator=g).bfloat16().requires_grad_() for _ in range(3))

    def run(mode):
        for t in (q, k, v):
            t.grad = None
        if mode is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            with mode:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        with mode if mode is not None else torch.autocast("cpu", enabled=False):
            out.float().square().sum().backward()
        return [out.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()]

    native, emulated = run(None), run(cpu_bf16.make_mode())
    for n, e in zip(native, emulated):
        assert e.dtype == torch.bfloat16
        assert (e.float() - n.float()).abs().max() <= 4 * ULP * n.float().abs().max()


def test_a_training_step_of_a_tiny_student_matches_native_bf16():
    """Loss, and the gradient of every weight, of one bf16 step: emulated against native."""
    arch = TinyArchitecture.from_params({"family": "qwen3", "hidden_size": 32, "intermediate_size": 64,
                                         "num_hidden_layers": 2, "num_attention_heads": 4,
                                         "num_key_value_heads": 2, "head_dim": 8})
    ids = torch.randint(3, 90, (2, 20), generator=torch.Generator().manual_seed(3))

    def step(mode):
        model = build_model(arch, vocab_size=96, eos_token_id=1, pad_token_id=0, seed=0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if mode is None:
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
            else:
                with mode:
                    loss = model(input_ids=ids, labels=ids).loss
                    loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}

    (native_loss, native_grads), (emulated_loss, emulated_grads) = step(None), step(cpu_bf16.make_mode())
    assert emulated_loss == pytest.approx(native_loss, rel=2e-3)
    for name, grad in native_grads.items():
        scale = grad.abs().max().item() or 1.0
        assert (emulated_grads[name] - grad).abs().max().item() <= 0.05 * scale, name


def test_the_choice_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(cpu_bf16.ENV, "native")
    assert cpu_bf16.wanted() is False
    monkeypatch.setenv(cpu_bf16.ENV, "emulate")
    assert cpu_bf16.wanted() is True
    monkeypatch.setenv(cpu_bf16.ENV, "auto")
    assert cpu_bf16.wanted() is (not cpu_bf16.native_bf16_gemm() and not torch.cuda.is_available())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cpu_bf16.wanted() is False                     # a GPU process keeps the native path
    monkeypatch.setenv(cpu_bf16.ENV, "fast")
    with pytest.raises(UserError, match=r"MISTILL_BF16_GEMM='fast': expected one of auto, emulate, native"):
        cpu_bf16.wanted()


def test_the_cli_reports_a_bad_setting_in_one_line(monkeypatch, capsys):
    monkeypatch.setenv(cpu_bf16.ENV, "fast")
    monkeypatch.setattr(cpu_bf16, "_installed", None)
    from mistill.models import commands

    ran = []
    monkeypatch.setattr(commands, "register", lambda sub: sub.add_parser("noop").set_defaults(
        func=lambda args: ran.append(True)))
    assert main(["models", "noop"]) == 2
    assert capsys.readouterr().err == ("mistill: error: MISTILL_BF16_GEMM='fast': expected one of auto, "
                                       "emulate, native\n")
    assert ran == []
