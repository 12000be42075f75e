"""Batched sampling with one random stream per row: the transformers backend's decoding loop.

Prompts are decoded together in a left-padded batch (a CPU-sized tiny model spends its time in
per-step overhead, so a batch of 16 costs little more than one prompt); each row samples from its
own `torch.Generator` seeded with its prompt's seed, so a row's tokens depend on its seed and its
own logits only, never on which prompts share its batch. A lone row consumes its generator exactly
as transformers' `generate(do_sample=True)` consumes the global generator after
`torch.manual_seed(seed)` (tests/chain/test_generate.py: a single row equals `generate`, token for
token). Sampling follows transformers' order: logits / temperature, top-k, top-p (the smallest set
of tokens whose probability reaches top_p), then one draw. A row is finished at the model's
end-of-turn token and leaves the batch (its cache rows are dropped), so the steps after it cost
only the rows still writing; by the same row independence, the others' tokens do not change.
"""

from __future__ import annotations


def filter_logits(logits, temperature: float, top_k: int, top_p: float):
    """Logits after temperature, top-k and top-p (nucleus) filtering; filtered entries are -inf."""
    import torch

    logits = logits / temperature
    k = min(int(top_k), logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    logits = logits.masked_fill(logits < kth, float("-inf"))
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= 1 - top_p
    drop_sorted[..., -1] = False  # keep at least the most likely token
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample_rows(model, tokenizer, prompts: list[str], seeds: list[int], decoding, *,
                decode_context=None) -> list[list[int]]:
    """Sample one continuation per prompt, row i from a generator seeded with seeds[i]: the new
    token ids, ending with the end-of-turn token when the row closed its turn within the cap.

    `decode_context(rows, pads, seq_len)`, when given, is entered around every decoding step after the
    prefill (which stays clean): `rows` are the prompts (indices) still in the batch, in batch order,
    `pads[i]` is prompt i's left padding, `seq_len` the keys the step sees (an intervention on what the
    model reads while it writes, e.g. a decode-time key mask).
    """
    import contextlib

    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    encoded = [tokenizer.encode(tokenizer.chat_prompt(p)).ids for p in prompts]
    width = max(len(ids) for ids in encoded)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    pads = [width - len(ids) for ids in encoded]
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded], device=device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=device)
    generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
    eos = tokenizer.eos_token_id
    new: list[list[int]] = [[] for _ in prompts]
    rows = list(range(len(prompts)))   # the prompts still writing, in batch order
    cache = DynamicCache()
    step_ids = input_ids
    with torch.no_grad():
        for _ in range(decoding.max_new_tokens):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1]:]
            decoding_step = decode_context is not None and cache.get_seq_length() > 0
            with decode_context(rows, pads, mask.shape[1]) if decoding_step else contextlib.nullcontext():
                out = model(input_ids=step_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                            use_cache=True)
            cache = out.past_key_values
            logits = filter_logits(out.logits[:, -1, :].float(), decoding.temperature, decoding.top_k,
                                   decoding.top_p)
            probs = logits.softmax(-1)
            writing = []   # batch positions of the rows that did not close their turn
            for b, i in enumerate(rows):
                token = int(torch.multinomial(probs[b], 1, generator=generators[i]))
                new[i].append(token)
                if token != eos:
                    writing.append(b)
            if not writing:
                break
            if len(writing) < len(rows):   # finished rows leave the batch
                keep = torch.tensor(writing, device=device)
                cache.batch_select_indices(keep)
                mask = mask[keep]
                rows = [rows[b] for b in writing]
            step_ids = torch.tensor([[new[i][-1]] for i in rows], device=device)
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
    return new
