"""The one intervention point: the input of every attention layer's `o_proj` (Sec. 2.3, App. C "The hook").

The input of `o_proj` is the concatenation of the layer's head outputs,
[..., n_heads * head_dim]; head h owns the slice [h*d, (h+1)*d).  One forward
pre-hook per layer reshapes it to [..., n_heads, head_dim] and can

  (i)   accumulate each head's mean output mu_h over every position of a forward
        (the note's prompt and trace, during the prefill; fp32 sums);
  (ii)  expose every head's output z_h as a gradient leaf, either with the graph
        intact (z + delta, delta a zero leaf: every path through later layers is
        kept) or detached (z.detach(): only each head's direct path survives, the
        hook of the paper's attribution pass, App. C);
  (iii) replace head h's output at chosen positions with chosen values:
        V = mu_h is mean-ablation, V recorded in another run is knock-in,
        V = 0 is zeroing;
  (iv)  record every head's output (for a later knock-in).

Replacement is one primitive, `Replacement(mask, values)`:

    z'[l, t, h] = values[l, (t,) h]  where mask[l, t, h]  else  z[l, t, h]

with t the positions of the current forward (for a batch of variants run as
one sequence, t indexes the variants).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class Replacement:
    """mask [L, T, H] (bool; T may be 1 to broadcast), values [L, H, D] or [L, T, H, D]."""

    mask: torch.Tensor
    values: torch.Tensor

    def __post_init__(self):
        # which layers intervene at all: read once here, not once per layer inside the forward
        self.active_layers = self.mask.reshape(self.mask.shape[0], -1).any(1).tolist()

    def apply(self, layer: int, z: torch.Tensor) -> torch.Tensor:
        if not self.active_layers[layer]:
            return z
        mask = self.mask[layer]
        values = self.values[layer].to(device=z.device, dtype=z.dtype)
        if values.dim() == 2:  # [H, D] broadcast over positions
            values = values.expand(z.shape[-3], *values.shape)
        # z is [B, T, H, D]; the mask and values broadcast over the batch
        return torch.where(mask.to(z.device)[None, :, :, None], values[None], z)


def mean_ablation(mask: torch.Tensor, mu: torch.Tensor) -> Replacement:
    """Replace the masked heads' outputs by their mean over the note (App. C)."""
    return Replacement(mask, mu)


def knock_in(mask: torch.Tensor, recorded: torch.Tensor) -> Replacement:
    """Replace the masked heads' outputs by values recorded in another run (Sec. 2.3)."""
    return Replacement(mask, recorded)


def zeroing(mask: torch.Tensor, n_heads: int, head_dim: int) -> Replacement:
    return Replacement(mask, torch.zeros(mask.shape[0], n_heads, head_dim))


def single_position_mask(n_layers: int, n_heads: int, seq_len: int, position: int,
                         heads: list[tuple[int, int]]) -> torch.Tensor:
    """A [L, T, H] mask selecting `heads` (layer, head) at one position."""
    mask = torch.zeros(n_layers, seq_len, n_heads, dtype=torch.bool)
    for layer, head in heads:
        mask[layer, position, head] = True
    return mask


class HeadHook:
    """Pre-hooks on every layer's `o_proj`; inert unless a mode is switched on."""

    def __init__(self, model: torch.nn.Module):
        cfg = model.config
        self.layers = model.model.layers
        self.n_layers = len(self.layers)
        self.n_heads = cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.replacement: Replacement | None = None
        self.leaf_mode: str | None = None
        self.leaves: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.n_layers
        self.recorded: list[torch.Tensor | None] | None = None
        self.mean_sum: torch.Tensor | None = None
        self.mean_count = 0
        self._handles = [layer.self_attn.o_proj.register_forward_pre_hook(self._make_hook(i))
                         for i, layer in enumerate(self.layers)]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _make_hook(self, layer: int):
        def hook(module, args):
            (x,) = args
            z = x.view(*x.shape[:-1], self.n_heads, self.head_dim)
            if self.mean_sum is not None:
                self.mean_sum[layer] += z.detach().float().sum(dim=tuple(range(z.dim() - 2)))
                if layer == 0:
                    self.mean_count += z.shape[:-2].numel()
            if self.replacement is not None:
                z = self.replacement.apply(layer, z)
            if self.recorded is not None:
                self.recorded[layer] = z.detach().clone()
            if self.leaf_mode == "intact":
                delta = torch.zeros_like(z, requires_grad=True)
                self.leaves[layer] = (z.detach(), delta)
                z = z + delta
            elif self.leaf_mode == "detached":
                z = z.detach().requires_grad_(True)
                self.leaves[layer] = (z.detach(), z)
            return (z.reshape(x.shape),)

        return hook

    @contextlib.contextmanager
    def replacing(self, replacement: Replacement | None) -> Iterator[None]:
        previous, self.replacement = self.replacement, replacement
        try:
            yield
        finally:
            self.replacement = previous

    @contextlib.contextmanager
    def accumulating_mean(self) -> Iterator[dict]:
        """Yields a dict whose 'mu' ([L, H, D], fp32) is filled on exit."""
        self.mean_sum = torch.zeros(self.n_layers, self.n_heads, self.head_dim, dtype=torch.float32,
                                    device=self.layers[0].self_attn.o_proj.weight.device)
        self.mean_count = 0
        out: dict = {}
        try:
            yield out
        finally:
            out["mu"] = self.mean_sum / max(self.mean_count, 1)
            self.mean_sum = None

    @contextlib.contextmanager
    def recording(self) -> Iterator[list]:
        """Yields a list filled with each layer's head outputs [B, T, H, D] (after any replacement)."""
        self.recorded = [None] * self.n_layers
        try:
            yield self.recorded
        finally:
            self.recorded = None

    @contextlib.contextmanager
    def gradient_leaves(self, mode: str) -> Iterator[list]:
        """mode 'intact' (graph kept) or 'detached' (direct paths only); yields [(z, leaf)] per layer."""
        if mode not in ("intact", "detached"):
            raise ValueError(f"gradient leaf mode must be 'intact' or 'detached', not {mode!r}")
        self.leaf_mode, self.leaves = mode, [None] * self.n_layers
        try:
            yield self.leaves
        finally:
            self.leaf_mode = None
