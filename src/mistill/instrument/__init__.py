"""mistill.instrument: the characterization instrument (Sec. 2-3, App. C, D).

events       P1 / P2 / P2C / NULL decision events from token ids, offsets and the inventory
margin       margin = logit(target) - logsumexp(competitors); entropy of the close call
hook         the one intervention point: every layer's o_proj input (mean-ablate, knock in, zero,
             record, accumulate mu_h, gradient leaves intact or detached)
patching     exact single-position patches against the clean prefill's cache, batched variants
attribution  first-order A_h, exact nominees, the fidelity self-test (Table 8)
calibration  I_c = I - I_NULL, t-tests + BH, the split-half NULL check, sparsity, recurrence
global_sets  per-phase rankings and pooled weights -> head_sets_contrast.json
knockin      necessity and knock-in recovery of head sets against controls; exact P2C refinement
passes       the resumable passes over notes; commands: `mistill instrument <pass>`
readout      what the readers (readers/r_c1..r_c4.py) share
"""
