"""Window attribution, window ablations and the read at the locus (App. F, passes A and B).

A decided mention's *window* is the W tokens ending at its locus (params `locus.window`, the paper's 64),
read after the cache cropped before them and followed by the forcing suffix.

Window attribution (App. F "Window attribution").  One forward of window + suffix with every head
output at every position a gradient leaf (the intact graph: every path through later layers and
later positions is kept), one backward from the forced margin at the suffix's last token:

    A[t, h] = (mu_h - z_h(t)) . d margin / d z_h(t)     (the change in margin under mean-ablation)

and, with the instrument's sign convention (positive when the head supports the forced letter),
I[t, h] = -A[t, h].  Prose-time importance of head h = sum of I[t, h] over the window positions;
suffix ("transport") importance = the same sum over the suffix positions.  Each is then calibrated against NULL windows
(the same window and suffix at the trace's NULL positions, a random letter as the target) as the
emission sets are: I_c = mean over a note's mentions - mean over its NULL windows.

Ablations (passes A and B): a head set mean-ablated (mu_h) at the window positions only, the suffix
positions only, or both, within the same window + suffix forward; its *necessity* is the share of the
clean forced margin it removes, (m_clean - m_ablated) / m_clean (m_clean >= theta > 0 at a locus).

Several windows share one forward: each is a sequence after the whole cache (`forward_sequences`),
and the gradient of the summed margins at a window's leaves is that window's own gradient, since no
window sees another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mistill.instrument.hook import HeadHook, Replacement
from mistill.locus.probe import ForcedTarget, forward_sequences


@dataclass(frozen=True)
class Window:
    """W tokens ids[start:cut] (the cut is the locus) and the suffix after them, with the forced target."""

    start: int
    cut: int
    tokens: tuple[int, ...]
    suffix: tuple[int, ...]
    target: ForcedTarget

    @classmethod
    def at(cls, ids: Sequence[int], cut: int, width: int, floor: int, suffix: Sequence[int],
           target: ForcedTarget) -> Window:
        start = max(floor, cut - width)
        return cls(start, cut, tuple(int(t) for t in ids[start:cut]), tuple(int(t) for t in suffix), target)

    @property
    def sequence(self) -> tuple[int, ...]:
        return self.tokens + self.suffix


@dataclass
class WindowImportance:
    margin: np.ndarray      # [B] clean forced margins
    window: np.ndarray      # [B, L, H] importance (-A) summed over the window positions
    suffix: np.ndarray      # [B, L, H] ... over the suffix positions


def attribute_windows(model, hook: HeadHook, cache, mu: torch.Tensor, windows: Sequence[Window]) -> WindowImportance:
    """Window attribution of every window, in one forward and one backward (intact leaves)."""
    with torch.enable_grad(), hook.gradient_leaves("intact") as leaves:
        logits = forward_sequences(model, hook, cache, [w.start for w in windows], [w.sequence for w in windows])
        margins = torch.stack([w.target.margin(logits[b]) for b, w in enumerate(windows)])
        grads = torch.autograd.grad(margins.sum(), [delta for _, delta in leaves])
    # per layer: z [1, N, H, D], grad [1, N, H, D] -> I = -A [N, L, H]
    scores = torch.stack([((z[0].float() - mu[layer].to(z.device)) * grad[0].float()).sum(-1)
                          for layer, ((z, _), grad) in enumerate(zip(leaves, grads))], dim=1)
    window_sum, suffix_sum, start = [], [], 0
    for w in windows:
        rows = scores[start:start + len(w.sequence)]
        window_sum.append(rows[:len(w.tokens)].sum(0))
        suffix_sum.append(rows[len(w.tokens):].sum(0))
        start += len(w.sequence)
    return WindowImportance(margins.detach().cpu().double().numpy(),
                            torch.stack(window_sum).detach().cpu().double().numpy(),
                            torch.stack(suffix_sum).detach().cpu().double().numpy())


PLACES = ("window", "suffix", "both")


def ablation_mask(window: Window, heads: Sequence[int], place: str, n_layers: int, n_heads: int) -> torch.Tensor:
    """[L, len(sequence), H]: the flat heads (layer * n_heads + head) at the window, suffix or both positions."""
    if place not in PLACES:
        raise ValueError(f"ablation place must be one of {PLACES}, not {place!r}")
    mask = torch.zeros(n_layers, len(window.sequence), n_heads, dtype=torch.bool)
    at = {"window": slice(0, len(window.tokens)), "suffix": slice(len(window.tokens), None),
          "both": slice(0, None)}[place]
    for flat in heads:
        mask[int(flat) // n_heads, at, int(flat) % n_heads] = True
    return mask


@torch.no_grad()
def ablated_margins(model, hook: HeadHook, cache, mu: torch.Tensor, window: Window,
                    variants: Sequence[tuple[Sequence[int], str]], max_batch: int) -> tuple[float, np.ndarray]:
    """(clean forced margin, [len(variants)] margins with each (heads, place) mean-ablated), in batches."""
    n_layers, n_heads = hook.n_layers, hook.n_heads
    masks = [torch.zeros(n_layers, len(window.sequence), n_heads, dtype=torch.bool)]
    masks += [ablation_mask(window, heads, place, n_layers, n_heads) for heads, place in variants]
    out = []
    per_forward = max(1, max_batch)
    for begin in range(0, len(masks), per_forward):
        chunk = masks[begin:begin + per_forward]
        replacement = Replacement(torch.cat(chunk, dim=1), mu)
        logits = forward_sequences(model, hook, cache, [window.start] * len(chunk), [window.sequence] * len(chunk),
                                   replacement)
        out += [float(window.target.margin(logits[b])) for b in range(len(chunk))]
    return out[0], np.asarray(out[1:], dtype=np.float64)

