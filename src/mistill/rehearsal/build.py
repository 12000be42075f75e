"""`build_rehearsal(out)`: a working copy that runs the paper profile's chain on stand-ins.

params.yaml's `rehearsal` section is the paper profile's structure (keys, seeds, arms, loaders, vLLM,
YaRN, revision pins) at CPU sizes.  The working copy is the repository's pipeline (dvc.yaml, pipelines/,
registry.yaml, readers/, src/mistill/, results/expected/) with `profile: *rehearsal`, plus what the
paper profile expects to find on a GPU cluster, replaced by stand-ins:

* MIMIC-IV: `world.mimiciv.table` and `split_table` in the format of Edin et al. (2023)'s release
  (`_id`, `subject_id`, `note_id`, `text`, undotted `icd10_diag`, `icd10_proc`, `target`; `_id`,
  `split`), holding notes of the demo note generator over a demo inventory of real ICD-10-CM codes;
* the paper's models: tiny random Qwen3 / SmolLM3 / Qwen2 (QwQ-32B) models under the paper's ids in a local Hugging
  Face cache (`stand-ins/hf`) at the pinned revisions, with compact tokenizer tables that cover every
  text the chain shows them; the shortlist encoder (`thenlper/gte-large`) a tiny random BERT over
  the notes' words;
* vLLM: `tests/fakes/vllm`, copied to `fakes/vllm`, in scripted mode: a request is answered with the
  demo's scripted reasoning (`mistill.models.scripted_traces`) over the prompt's candidate lines for
  the note's gold codes, which the fake reads from `stand-ins/fake_vllm_script.json`; each gold code
  is kept with probability 0.95 (the teacher) or 0.7 (a student, trained or not) under the request's
  seed, model and note, so traces differ between arms and seeds, name codes and their rejected
  siblings, and the instrument finds P1, P2 and P2C events.
  The tiny models never write a trace: they are random.  Everything downstream of generation
  (events, attribution, calibration, targets, training, fidelity, own heads) runs on them.

What a run needs (PATH with this interpreter's `mistill` and `dvc`, PYTHONPATH with fakes/ and src/,
HF_HOME, HF_HUB_OFFLINE=1, the fake's script) is written to `env.sh` and returned.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mistill.errors import UserError

PROFILE = "rehearsal"
# the distillation chain (every arm, seed and loader), its setup, its instrument checks
TARGETS = ("R-D6", "R-D1", "R-D2", "R-D5", "R-D0", "R-D21", "R-D18", "R-D16", "R-C5", "R-C10", "R-C11", "R-D28",
           "R-C9", "R-D33", "R-D34", "R-D35", "R-C14", "R-D24", "R-D25", "R-D14", "R-D13", "R-D7", "R-D23", "R-D10",
           "R-D12", "R-D26", "R-D27", "R-D31", "R-D32", "R-D29", "R-D36", "R-C15")
COPIED = ("dvc.yaml", "pipelines", "registry.yaml", "readers", "src/mistill", "results/expected")
FAKES = Path("tests") / "fakes"
STAND_INS = "stand-ins"
SCRIPT_ENV = "MISTILL_FAKE_VLLM_SCRIPT"        # read by tests/fakes/vllm: scripted traces instead of random ids
KEEP_SHARE = {"students": 0.7, "teacher": 0.95}  # share of a note's gold codes a scripted trace names

# The stand-in world: the demo generator's notes (short: ~200 words, 2-4 codes) over a demo inventory of ~30
# codes, sized so the corpora's rules (params rehearsal.world.corpora) find 4 characterization, 4 training
# and 5 test notes; short prompts keep every teacher-forced pass and training step small.
INVENTORY = {"target_codes": 30, "seed": 0, "min_leaves": 2, "max_leaves": 8, "max_description_words": 8}
NOTES = {"n_patients": 70, "second_note_share": 0.1, "min_gold": 2, "max_gold": 4, "exam_findings": (1, 3),
         "results": (1, 2), "denied_mentions": (0, 2), "seed": 0}
FIRST_ADMISSION, FIRST_SUBJECT = 20_000_000, 10_000_000

# Tiny random models in the paper's architectures and windows (YaRN applies to these bases: 40,960 for
# Qwen3, SmolLM3's native 65,536), 16 / 8 / 16 heads.  A wide initialisation (std 0.4, not 0.02) gives
# random heads effects of about a nat, so the instrument's 1-nat range gate passes some events.
INIT = {"initializer_range": 0.4}
ARCHITECTURES = {
    "teacher": {"family": "qwen3", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                "max_position_embeddings": 40960, "extra": INIT},
    "student_qwen": {"family": "qwen3", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                     "max_position_embeddings": 40960, "extra": INIT},
    "student_smol": {"family": "smollm3", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                     "no_rope_layer_interval": 4, "max_position_embeddings": 65536, "rope_theta": 5_000_000.0,
                     "extra": INIT},
    # QwQ-32B (R-C15): Qwen2, half again the teacher's depth; YaRN applies to its 32,768-token base
    "teacher_qwq": {"family": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 6,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                    "max_position_embeddings": 32768, "extra": INIT},
}
ENCODER_REVISION = hashlib.sha1(b"mistill rehearsal: tiny random BERT").hexdigest()
UNPINNED_REVISION = hashlib.sha1(b"mistill rehearsal: a model the paper profile pins no revision of").hexdigest()

# Trace shapes the scripted fake writes that a full-inventory script of the notes may not (a shortlist
# without the ruled-out sibling, a note whose kept gold codes are none of the listed ones).
TRACE_FRAMES = ["<think>\nno listed code is supported by the summary.\n</think>\n\n[]",
                " is not documented, rejected.\n", " is ruled out in the summary, rejected.\n",
                " is documented, accepted.\n", "; the findings point to chapter "]


@dataclass(frozen=True)
class Rehearsal:
    root: Path
    env: dict[str, str] = field(default_factory=dict)   # the variables env.sh exports
    targets: tuple[str, ...] = TARGETS

    @property
    def command(self) -> str:
        ids = " ".join(self.targets)
        return f"cd {self.root} && . ./env.sh && mistill repro warm dvc repro {ids} && mistill repro check {ids}"

    def run_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's environment) with the rehearsal's variables; PATH prepended."""
        env = dict(os.environ if base is None else base)
        for key, value in self.env.items():
            env[key] = f"{value}{os.pathsep}{env['PATH']}" if key == "PATH" and env.get("PATH") else value
        return env


def build_rehearsal(out: str | Path, *, repo: str | Path = ".") -> Rehearsal:
    """Write the working copy, the stand-ins and env.sh under `out` (a new or empty directory)."""
    from mistill.params import load_params

    repo, out = Path(repo).resolve(), Path(out).resolve()
    missing = [p for p in (*COPIED, "params.yaml", str(FAKES / "vllm")) if not (repo / p).exists()]
    if missing:
        raise UserError(f"{repo}: not the repository root (missing {', '.join(missing)}); run from the checkout")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out}: not empty; give a new directory for the rehearsal")
    out.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "dvc.lock")   # the demo run's locks
    for name in COPIED:
        source = repo / name
        if source.is_dir():
            shutil.copytree(source, out / name, ignore=ignore)
        else:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, out / name)
    shutil.copytree(repo / FAKES, out / "fakes", ignore=ignore)
    write_params(repo / "params.yaml", out / "params.yaml")
    params = load_params(out / "params.yaml")
    stand_ins = out / STAND_INS
    inventory, notes = write_release(out, params)
    write_script(stand_ins / "fake_vllm_script.json", notes,
                 [str(params["models"][key]) for key in ("teacher", "teacher_qwq")])
    write_models(stand_ins / "hf" / "hub", params, inventory, notes)
    rehearsal = Rehearsal(out, {
        "PATH": str(Path(sys.executable).parent),    # `mistill` and `dvc` of this environment
        "PYTHONPATH": os.pathsep.join([str(out / "fakes"), str(out / "src")]),
        "HF_HOME": str(stand_ins / "hf"), "HF_HUB_CACHE": str(stand_ins / "hf" / "hub"),
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        SCRIPT_ENV: str(stand_ins / "fake_vllm_script.json"), "DVC_NO_ANALYTICS": "1"})
    lines = [f'export PATH="{rehearsal.env["PATH"]}{os.pathsep}$PATH"']
    lines += [f'export {k}="{v}"' for k, v in rehearsal.env.items() if k != "PATH"]
    (out / "env.sh").write_text("# the stand-ins of the paper profile's rehearsal (mistill rehearsal build)\n"
                                + "\n".join(lines) + "\n")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=out, check=True,
                   env=rehearsal.run_env())
    return rehearsal


def write_params(source: Path, target: Path) -> None:
    """params.yaml with the rehearsal as the active profile (the one line `profile: *<name>` changed)."""
    text, n = re.subn(r"(?m)^profile: \*[\w-]+$", f"profile: *{PROFILE}", source.read_text(encoding="utf-8"))
    if n != 1:
        raise UserError(f"{source}: expected one `profile: *<name>` line")
    if not re.search(rf"(?m)^{PROFILE}: &{PROFILE}$", text):
        raise UserError(f"{source}: no `{PROFILE}: &{PROFILE}` section")
    target.write_text(text, encoding="utf-8")


def write_release(out: Path, params: dict[str, Any]):
    """The stand-in MIMIC-IV release at the profile's paths; (inventory, notes) as the chain's loader reads them."""
    import pandas as pd

    from mistill.world.demo_notes import NoteGeneratorConfig, generate_notes
    from mistill.world.inventory import demo_inventory
    from mistill.world.mimic import mimiciv_inventory, mimiciv_notes

    mimic = params["world"]["mimiciv"]
    table, split_table = out / mimic["table"], out / mimic["split_table"]
    source = demo_inventory(INVENTORY["target_codes"], INVENTORY["seed"], min_leaves=INVENTORY["min_leaves"],
                            max_leaves=INVENTORY["max_leaves"],
                            max_description_words=INVENTORY["max_description_words"])
    config = NoteGeneratorConfig.from_params({k: v for k, v in NOTES.items() if k != "seed"})
    generated = generate_notes(source, config, NOTES["seed"])
    admissions = [FIRST_ADMISSION + i for i in range(len(generated))]
    subjects = [FIRST_SUBJECT + int(n.patient_id.lstrip("p")) for n in generated]
    diagnoses = [[c.replace(".", "") for c in n.gold_codes] for n in generated]   # MIMIC-IV stores them undotted
    procedures = [["0DJ08ZZ"] if i % 2 == 0 else [] for i in range(len(generated))]
    frame = pd.DataFrame({"subject_id": subjects, "_id": admissions,
                          "note_id": [f"{s}-DS-{n.note_id.rsplit('-', 1)[1]}" for s, n in zip(subjects, generated)],
                          "text": [n.text for n in generated], "icd10_diag": diagnoses, "icd10_proc": procedures,
                          "target": [p + d for p, d in zip(procedures, diagnoses)]})
    table.parent.mkdir(parents=True, exist_ok=True)
    frame.to_feather(table)
    pd.DataFrame({"_id": admissions, "split": [n.split for n in generated]}).to_feather(split_table)
    inventory = mimiciv_inventory(table, int(params["seeds"]["inventory_shuffle"]),
                                  descriptions=mimic.get("descriptions"))
    return inventory, mimiciv_notes(table, split_table, inventory)


def write_script(path: Path, notes, teachers: list[str]) -> None:
    """What the scripted fake vLLM answers from: each admission's text and gold codes, and the share of
    them a trace names (each teacher's cache entry a better coder than any student, as in the paper)."""
    from mistill.io import write_json

    write_json(path, {"keep": KEEP_SHARE["students"],
                      "keep_by_model": {f"models--{t.replace('/', '--')}": KEEP_SHARE["teacher"] for t in teachers},
                      "notes": [{"text": n.text, "gold": list(n.gold_codes)} for n in notes]}, indent=None)


def covered_texts(inventory, notes) -> list[str]:
    """Every text the chain shows a model: inventory lines, notes (whole and cut), prompt frames,
    scripted traces, and the trace shapes the fake adds."""
    from mistill.models.world_files import DemoWorld, cut_for_prompt, remap_corpus

    shown = list(notes) + [cut_for_prompt(n) for n in notes]
    codes = list(inventory.codes)
    return remap_corpus(DemoWorld(inventory, {}), shown) + TRACE_FRAMES + [json.dumps([c]) for c in codes]


def cache_checkpoint(cache: Path, repo_id: str, revision: str, directory: Path) -> Path:
    """Put a checkpoint into a Hugging Face cache as the hub client does: content-addressed blobs
    (`blobs/<sha256>`), a snapshot of symlinks per commit, and `refs/main` naming the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for path in sorted(directory.iterdir()):
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def write_models(cache: Path, params: dict[str, Any], inventory, notes) -> None:
    """Tiny random models under the profile's ids and revisions, and the shortlist encoder, in `cache`."""
    from mistill.models.architectures import TinyArchitecture, build_model
    from mistill.models.tokenizers import CompactTokenizer, base_tokenizer, build_remap

    models = params["models"]
    texts = covered_texts(inventory, notes)
    tokenizers: dict[str, CompactTokenizer] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed, (key, section) in enumerate(ARCHITECTURES.items()):
            arch = TinyArchitecture.from_params(section)
            family = arch.tokenizer_family   # one table per tokenizer: teacher and Qwen3 student pair exactly
            if family not in tokenizers:
                base = base_tokenizer(family)
                tokenizers[family] = CompactTokenizer(base, build_remap(base, texts + [base.chat_prompt("")]))
            tokenizer = tokenizers[family]
            model = build_model(arch, vocab_size=tokenizer.vocab_size, eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=tokenizer.pad_token_id, seed=seed,
                                attn_implementation=models.get("attn_implementation") or "eager")
            directory = Path(tmp) / key
            model.save_pretrained(directory)
            tokenizer.save(directory)
            revisions = models.get("revision") or {}
            if key not in revisions:
                raise UserError(f"params {PROFILE}.models.revision.{key}: the rehearsal caches the pinned revision "
                                "(null: the hub's main, as for a model the paper pins no commit of)")
            # an unpinned model loads the cache's `main`, which names this snapshot
            cache_checkpoint(cache, str(models[key]), str(revisions[key] or UNPINNED_REVISION), directory)
        encoder = params["world"]["shortlist"]["encoder"]
        if encoder != "tfidf":
            cache_checkpoint(cache, encoder, ENCODER_REVISION, write_encoder(Path(tmp) / "encoder", texts))


def write_encoder(directory: Path, texts: list[str]) -> Path:
    """A tiny random BERT sentence encoder whose word-level vocabulary covers the texts."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    words = sorted({w for text in texts for w in re.findall(r"[a-z0-9]+", text.lower())})
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=512))
    model.save_pretrained(directory)
    BertTokenizer(vocab=vocab).save_pretrained(directory)
    return directory
