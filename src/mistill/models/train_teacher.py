"""Train the demo teacher: a tiny Qwen3 taught to write scripted coding traces.

Each example is `chat_prompt(prompt) + completion + <|im_end|>`, tokenised once;
the loss is the cross-entropy on the completion tokens (and the closing EOS)
only, averaged over those tokens:

    L = - (1 / |C|) sum_{t in C} log p(x_t | x_<t),   C = completion positions.

Prompts mix the full inventory (what HD-001 characterizes) and the shortlist
(the validation and distillation sets), so one teacher serves both; shortlist
prompts use a seeded shortlist-shaped list (`sampled_shortlist`), never RT-003's.
Notes are the generator's train split (dt_train and the rest of that split;
never a characterization or distillation-test patient) plus teacher-only notes
from the same generator under its own seed (`teacher_training.extra_patients`,
standing in for the pretraining a real teacher brings), each cut as App. A cuts
notes for prompts.

Full-inventory prompts share their first ~3k tokens (the header and the one
shuffled inventory block, App. A: "a cacheable prefix"), so a batch of them runs
that prefix once, with gradient, and repeats its key-value cache over the batch.
The result equals running every example in full (tested), at a fraction of the
cost on CPU.

Optimiser as the paper's shared recipe (App. J.2) where it applies: AdamW
(beta1 0.9, beta2 0.95, no weight decay), linear warm-up then cosine decay,
gradient-norm clipping at 1; epoch order a function of (seed, epoch).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from mistill.models.planted import Decision, PlantedHeads, PlantedRouting, decision_rows, knockout_mask
from mistill.models.world_files import FULL, SHORTLIST, DemoWorld
from mistill.world.types import Note

IGNORE = -100


@dataclass(frozen=True)
class TeacherExample:
    note_id: str
    kind: str                 # FULL or SHORTLIST
    ids: tuple[int, ...]      # prompt, completion, EOS
    n_prompt: int             # loss on ids[n_prompt:]
    decisions: tuple[Decision, ...] = ()   # the planted routing's rows


def make_example(tokenizer: Any, note_id: str, kind: str, prompt: str, completion: str,
                 codes: Sequence[str] | None = None) -> TeacherExample:
    """Tokenise chat_prompt(prompt) + completion once; the prompt ends where the completion's first
    character begins (offsets), and EOS closes the turn.  Given the inventory's `codes`, the example
    also records its decision events (`mistill.models.planted.decision_rows`)."""
    prefix = tokenizer.chat_prompt(prompt)
    enc = tokenizer.encode(prefix + completion)
    n_prompt = next(i for i, (start, _) in enumerate(enc.offsets) if start >= len(prefix))
    decisions = decision_rows(tokenizer, prefix + completion, len(prefix), codes) if codes is not None else ()
    return TeacherExample(note_id, kind, tuple(enc.ids) + (tokenizer.eos_token_id,), n_prompt, decisions)


def build_examples(tokenizer: Any, world: DemoWorld, notes: list[Note], *, seed: int,
                   shortlist_share: float, shortlist_size: int, near_misses: bool = True,
                   with_decisions: bool = False) -> list[TeacherExample]:
    """One full-inventory example per note, plus a shortlist example for a seeded `shortlist_share`
    of the notes over a `sampled_shortlist`; `near_misses=False` scripts traces that never name a
    rejected sibling (`script_trace`); `with_decisions` records each example's decision events
    (what a planted routing term reads).

    The teacher never sees RT-003's shortlists: in the paper it is an off-the-shelf model, so its
    training must not depend on the retriever (and the demo teacher stage does not depend on it)."""
    rng = random.Random(seed)
    codes = list(world.inventory.codes) if with_decisions else None
    examples = []
    for note in tqdm(notes, desc="examples", unit="note", disable=not with_decisions):
        examples.append(_example(tokenizer, note, FULL, world.candidates(note, FULL), seed, near_misses, codes))
        if rng.random() >= shortlist_share:
            continue
        candidates = sampled_shortlist(note, world.inventory, shortlist_size, rng)
        examples.append(_example(tokenizer, note, SHORTLIST, candidates, seed, near_misses, codes))
    return examples


def _example(tokenizer: Any, note: Note, kind: str, candidates: list, seed: int,
             near_misses: bool = True, codes: Sequence[str] | None = None) -> TeacherExample:
    from mistill.models.scripted_traces import script_trace
    from mistill.world.inventory import format_line
    from mistill.world.prompt import build_prompt

    trace = script_trace(note, candidates, seed=seed, near_misses=near_misses)
    prompt = build_prompt(note, [format_line(c) for c in candidates])
    return make_example(tokenizer, note.note_id, kind, prompt, trace.completion, codes)


def sampled_shortlist(note: Note, inventory: Any, size: int, rng: random.Random, *, recall: float = 0.9) -> list:
    """A shortlist-shaped candidate list for a training note the retriever never scored: each gold
    code kept with probability `recall`, all category siblings of the kept codes (as RT-003 adds
    siblings), then random inventory codes up to `size`; in the shared order (METHOD-GUIDE §2)."""
    kept = [c for c in note.gold_codes if rng.random() < recall]
    chosen = set(kept)
    for code in kept:
        chosen.update(inventory.siblings(code))
    others = [c for c in inventory.codes if c not in chosen]
    rng.shuffle(others)
    chosen.update(others[:max(0, size - len(chosen))])
    return list(inventory.restrict(chosen))


def common_prefix_length(sequences: list[tuple[int, ...]]) -> int:
    first = sequences[0]
    length = min(len(s) for s in sequences)
    for seq in sequences[1:]:
        k = 0
        while k < length and seq[k] == first[k]:
            k += 1
        length = k
    return length


def shared_prefix(batch: list[TeacherExample], min_shared: int = 64) -> int:
    """Tokens of the prompt prefix a batch runs once (0 below `min_shared`); never a completion token."""
    shared = min(common_prefix_length([ex.ids for ex in batch]), min(ex.n_prompt for ex in batch) - 1)
    return shared if shared >= min_shared else 0


def batch_loss(model: Any, batch: list[TeacherExample], *, min_shared: int = 64):
    """Token-mean completion cross-entropy of a batch (a scalar tensor) and its token count.

    If the batch shares a prompt prefix of at least `min_shared` tokens, the prefix runs once and its
    cache is repeated over the batch; the shared part never reaches a completion token.
    """
    loss, n_tokens, _ = batch_forward(model, batch, min_shared=min_shared)
    return loss, n_tokens


def batch_forward(model: Any, batch: list[TeacherExample], *, min_shared: int = 64, at=None,
                  loss_rows: int | None = None):
    """`batch_loss`'s (cross-entropy, token count) and the logits at `at` = (batch rows, suffix
    positions) index tensors (positions counted after the shared prefix), or None without `at`; with
    `loss_rows`, only the batch's first rows enter the cross-entropy (the others are read at `at`)."""
    import torch
    import torch.nn.functional as F

    device = next(model.parameters()).device
    shared = shared_prefix(batch, min_shared)
    cache = None
    if shared:
        prefix = torch.tensor([batch[0].ids[:shared]], device=device)
        cache = model.model(input_ids=prefix, use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(batch))
    width = max(len(ex.ids) for ex in batch) - shared
    pad = model.config.pad_token_id or 0
    input_ids = torch.full((len(batch), width), pad, dtype=torch.long, device=device)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long, device=device)
    mask = torch.zeros((len(batch), shared + width), dtype=torch.long, device=device)
    mask[:, :shared] = 1
    for row, ex in enumerate(batch):
        suffix = torch.tensor(ex.ids[shared:], device=device)
        input_ids[row, :len(suffix)] = suffix
        mask[row, shared:shared + len(suffix)] = 1
        # label at suffix position j is the token at j + 1 (next-token prediction)
        targets = torch.tensor(ex.ids[shared + 1:], device=device)
        keep = torch.arange(shared + 1, len(ex.ids), device=device) >= ex.n_prompt
        labels[row, :len(targets)] = torch.where(keep, targets, torch.full_like(targets, IGNORE))
    positions = torch.arange(shared, shared + width, device=device).unsqueeze(0).expand(len(batch), -1)
    hidden = model.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                         past_key_values=cache, use_cache=cache is not None).last_hidden_state
    if loss_rows is not None:
        labels[loss_rows:] = IGNORE
    selected = labels != IGNORE
    logits = model.lm_head(hidden[selected])  # the vocabulary head only where the loss reads it
    n_tokens = int(selected.sum())
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()  # the softmax in at least single precision
    loss = F.cross_entropy(logits, labels[selected], reduction="mean")
    if at is None:
        return loss, n_tokens, None
    rows, columns = (index.to(device) for index in at)
    return loss, n_tokens, model.lm_head(hidden[rows, columns])


def planted_step(model: Any, batch: list[TeacherExample], routing: PlantedRouting, *, min_shared: int = 64):
    """(loss, token count, log row) of one step that runs the batch untouched (c) and with the held heads
    mean-ablated at the decisions (a):

        L = (L_CE(c) + L_CE(a)) / 2 + weight * R(c) + gamma * mean_e (m_e(c) - m_e(a))^2

    R read on the untouched forward (what the instrument reads), m the decisions' margins.  Both copies
    run as one forward of the doubled batch (the shared prefix once); its token-mean cross-entropy is
    the mean of the two, which hold the same tokens."""
    planted, n = routing.planted, len(batch)
    paired = batch + batch
    with routing.applied(paired, shared_prefix(paired, min_shared), ablate=[False] * n + [True] * n):
        cross_entropy, n_tokens, logits = batch_forward(model, paired, min_shared=min_shared, at=routing.rows)
        routing_term, n_decisions = routing.penalty(range(n))
        if routing_term is None:
            return cross_entropy, n_tokens // 2, {}
        margins = routing.margins(logits)
    gap = (margins[:n_decisions] - margins[n_decisions:]).pow(2).mean()
    loss = cross_entropy + planted.weight * routing_term + planted.consistency * gap
    row = {"cross_entropy": float(cross_entropy.detach()), "routing": float(routing_term.detach()),
           "margin_gap": float(gap.detach()), "decisions": n_decisions, "ablated": True}
    return loss, n_tokens // 2, row


def necessity_step(model: Any, batch: list[TeacherExample], routing: PlantedRouting, probes: Sequence[tuple[int, int]],
                   *, min_shared: int = 64):
    """(loss, token count, log row) of one step of the knock-out form (`mistill.models.planted`): the batch
    untouched (c), with the j-th planted head of each decision's phase knocked out (a_j, one copy per
    slot), and with each of `probes` (heads no phase plants) knocked out (b_r), one forward of all copies:

        L = L_CE(c) + weight * mean_{e,j} max(0, delta - (m_e(c) - m_e(a_j))) + held_weight * mean_{e,r} (m_e(c) - m_e(b_r))^2

    A decision with fewer needed heads (`PlantedHeads.needed`) than the widest repeats its heads in order."""
    import torch

    planted, n = routing.planted, len(batch)
    decisions = [d for ex in batch for d in ex.decisions]
    if not decisions:
        loss, n_tokens = batch_loss(model, batch, min_shared=min_shared)
        return loss, n_tokens, {}
    n_layers, n_heads = len(routing.layers), routing.n_heads
    needed = [planted.needed(d) for d in decisions]
    slots = max(len(heads) for heads in needed)
    copies = [np.zeros((len(decisions), n_layers, n_heads), dtype=bool)]
    copies += [np.stack([knockout_mask(heads[j % len(heads)], n_layers, n_heads) for heads in needed])
               for j in range(slots)]
    copies += [np.broadcast_to(knockout_mask(head, n_layers, n_heads), copies[0].shape) for head in probes]
    repeated = batch * len(copies)
    with routing.applied(repeated, shared_prefix(repeated, min_shared), ablate=[False] * n + [True] * (len(repeated) - n),
                         held=np.concatenate(copies)):
        cross_entropy, n_tokens, logits = batch_forward(model, repeated, min_shared=min_shared, at=routing.rows,
                                                        loss_rows=n)
        margins = routing.margins(logits).view(len(copies), len(decisions))
    drop = margins[0] - margins[1:1 + slots]
    shortfall = torch.relu(planted.necessity - drop).mean()
    loss = cross_entropy + planted.weight * shortfall
    row = {"cross_entropy": float(cross_entropy.detach()), "necessity_shortfall": float(shortfall.detach()),
           "planted_drop": float(drop.detach().mean()), "decisions": len(decisions)}
    if probes:
        moved = (margins[0] - margins[1 + slots:]).pow(2).mean()
        loss = loss + planted.held_weight * moved
        row["held_move"] = float(moved.detach())
    return loss, n_tokens, row


def make_batches(examples: list[TeacherExample], batch_size: int, rng: random.Random) -> list[list[TeacherExample]]:
    """Batches of one prompt kind each (full-inventory batches share their prefix), in a seeded order."""
    batches = []
    for kind in (FULL, SHORTLIST):
        group = [ex for ex in examples if ex.kind == kind]
        rng.shuffle(group)
        batches += [group[i:i + batch_size] for i in range(0, len(group), batch_size)]
    rng.shuffle(batches)
    return batches


def lr_at(step: int, total: int, peak: float, warmup_share: float) -> float:
    """Linear warm-up over `warmup_share` of the steps, then cosine decay to zero (App. J.2)."""
    warmup = max(1, round(warmup_share * total))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * 0.5 * (1 + math.cos(math.pi * progress))


def train(model: Any, examples: list[TeacherExample], config: dict[str, Any], *, progress: bool = True,
          desc: str = "teacher", planted: PlantedHeads | None = None) -> list[dict]:
    """Train in place; returns the per-step log (epoch, step, lr, loss, tokens, seconds).

    With `planted`, the forward holds the non-planted heads at their means at every decision and the
    loss adds its weight times the routing term R (`mistill.models.planted.PlantedRouting`; the
    examples must carry their decisions); with its consistency gamma > 0 each step runs the untouched
    and the ablated forward and adds gamma times their mean squared margin gap (`planted_step`).  The
    log has each step's R."""
    import torch

    seed, epochs, batch_size = int(config["seed"]), int(config["epochs"]), int(config["batch_size"])
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(config["lr"]), betas=(0.9, 0.95),
                                  weight_decay=float(config.get("weight_decay", 0.0)))
    steps_per_epoch = len(make_batches(examples, batch_size, random.Random(0)))
    total = steps_per_epoch * epochs
    # max_steps stops early (smoke runs, timing) without changing the schedule of the full run
    stop = min(total, int(config.get("max_steps") or total))
    routing_hooks = PlantedRouting(model, planted) if planted is not None else None
    ablation_draws = random.Random(seed * 1_000_003 + 7)   # which steps ablate (planted.ablate_share < 1)
    unplanted = planted.unplanted(len(model.model.layers), model.config.num_attention_heads) if planted else []
    model.train()
    log, step, start = [], 0, time.time()
    bar = tqdm(total=stop, desc=desc, unit="step", disable=not progress)
    for epoch in range(epochs):
        for batch in make_batches(examples, batch_size, random.Random(seed * 1_000_003 + epoch)):
            if step >= stop:
                break
            lr = lr_at(step, total, float(config["lr"]), float(config.get("warmup_share", 0.05)))
            for group in optimizer.param_groups:
                group["lr"] = lr
            row: dict = {}
            if planted is None:
                loss, n_tokens = batch_loss(model, batch)
            elif planted.necessity > 0:
                probes = ablation_draws.sample(unplanted, min(planted.held_probes, len(unplanted)))
                loss, n_tokens, row = necessity_step(model, batch, routing_hooks, probes)
            elif planted.consistency > 0:
                loss, n_tokens, row = planted_step(model, batch, routing_hooks)
            else:
                ablate = planted.ablate_share >= 1 or ablation_draws.random() < planted.ablate_share
                with routing_hooks.applied(batch, shared_prefix(batch), ablate=ablate):
                    loss, n_tokens = batch_loss(model, batch)
                routing, n_decisions = routing_hooks.penalty()
                if routing is not None:
                    row = {"cross_entropy": float(loss.detach()), "routing": float(routing.detach()),
                           "decisions": n_decisions, "ablated": ablate}
                    loss = loss + planted.weight * routing
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), float(config.get("clip", 1.0)))
            optimizer.step()
            log.append({"epoch": epoch, "step": step, "lr": lr, "loss": float(loss.detach()), "tokens": n_tokens,
                        "kind": batch[0].kind, "seconds": round(time.time() - start, 2), **row})
            step += 1
            bar.update(1)
            bar.set_postfix(epoch=epoch, loss=f"{float(loss.detach()):.3f}", **(
                {"routing": f"{row['routing']:.3f}"} if "routing" in row else {}))
    bar.close()
    model.eval()
    return log
