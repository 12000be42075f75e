"""The on-policy baseline arms of Table 2 through TRL 1.16.0 (App. J.3): OPD and GOLD.

* OPD (on-policy distillation, Agarwal et al. 2024): `trl.DistillationTrainer`.  For each training prompt
  the student samples its own completion (capped at `max_completion_length`), the teacher scores it, and
  the student matches the teacher's next-token distribution on those tokens under the generalised
  Jensen-Shannon divergence at beta = 1, the reverse KL (TRL's default):
      L = sum_t KL(p_student(. | x, y_<t) || p_teacher(. | x, y_<t)) / (completion tokens),  y ~ student.
  It needs one vocabulary: the teacher's tokenizer (Qwen3-4B).
* GOLD (Patino et al. 2025): `trl.experimental.gold.GOLDTrainer`, the cross-tokenizer arm for SmolLM3-3B.
  Each micro-batch is on-policy with probability `lmbda` (0.5: App. J.3's deviation after a fully
  on-policy run collapsed): the student's own sample; otherwise off-policy: the teacher's trace.  The
  loss is ULD on the completion: both models' sorted probabilities compared bin by bin (L1), after the
  two tokenizations are aligned on the text spans where both end a token (`use_extended_uld`), the
  probabilities of a span's several tokens merged; with `uld_use_hybrid_loss` the tokens both
  vocabularies share are compared directly (JSD) and only the rest by sorted bins.  One epoch (App. J.3).
  The teacher's trace is cut to the rollout cap, in the student's tokens, as the paper's run did [ours:
  the cut keeps the trace's start].

Both run the shared recipe's optimiser and schedule (App. J.2; matched per App. J.4): AdamW (0.9, 0.95),
no weight decay, the recipe's learning rate and global batch (one prompt per micro-step, accumulated),
5% linear warm-up then cosine decay, gradient-norm clipping at 1.  The student is loaded in bf16 and
trained without autocast or an fp32 master copy (App. J.4: "bf16 weights, no master copy"); the
teacher runs in its own dtype.  The prompts are the teacher traces' prompts of the training notes
(the targets manifest's), rendered by the student's chat template; TRL sees our tokenizers through
`TRLTokenizer`.  Rollouts use HF `generate`, or TRL's colocated vLLM engine when the params say so.

A run directory is what the shared trainer writes, so evaluation reads it unchanged: `config.json`
(every argument, the example ids, the torch and trl versions), `metrics.jsonl` (one line per optimiser
step), `model/` at the end; plus TRL's `checkpoint-<step>/`, from which a rerun resumes.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import shutil
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mistill.errors import UserError

ON_POLICY_ARMS = ("opd", "gold")
IDENTITY_KEYS = ("arm", "student", "teacher", "seed", "settings", "recipe", "example_ids")


@dataclass
class OnPolicyConfig:
    """One arm's settings: params `baselines.<arm>` and the shared recipe (`distill.train`)."""

    arm: str
    epochs: int
    lr: float
    batch: int                      # the global batch (prompts per optimiser step)
    per_device_batch: int
    warmup_frac: float
    clip: float
    gradient_checkpointing: bool
    save_every: int
    max_completion_length: int
    temperature: float
    top_p: float
    top_k: int
    use_vllm: bool
    vllm_mode: str
    vllm_gpu_memory_utilization: float
    vllm_max_model_length: int | None = None
    max_notes: int | None = None    # [ours] the first N training notes only (the demo's CPU budget); None: all
    beta: float = 1.0               # OPD: generalised JSD's interpolation (1 = reverse KL)
    lmbda: float = 0.5              # GOLD: share of on-policy micro-batches
    use_extended_uld: bool = True
    uld_use_hybrid_loss: bool = False

    @classmethod
    def from_params(cls, arm: str, section: dict, recipe: dict, lr: float | None = None) -> OnPolicyConfig:
        if arm not in ON_POLICY_ARMS:
            raise UserError(f"unknown on-policy arm {arm!r}; known: {', '.join(ON_POLICY_ARMS)}")
        try:
            config = cls(arm=arm, epochs=int(section["epochs"]), lr=float(lr or recipe["lr"]),
                         batch=int(recipe["batch"]), per_device_batch=int(section["per_device_batch"]),
                         warmup_frac=float(recipe["warmup_frac"]), clip=float(recipe["clip"]),
                         gradient_checkpointing=bool(recipe["gradient_checkpointing"]),
                         save_every=int(recipe.get("save_every", 1)),
                         max_completion_length=int(section["max_completion_length"]),
                         temperature=float(section["temperature"]), top_p=float(section["top_p"]),
                         top_k=int(section["top_k"]), use_vllm=bool(section["use_vllm"]),
                         vllm_mode=str(section.get("vllm_mode", "colocate")),
                         vllm_gpu_memory_utilization=float(section.get("vllm_gpu_memory_utilization", 0.3)),
                         vllm_max_model_length=section.get("vllm_max_model_length"),
                         max_notes=None if section.get("max_notes") is None else int(section["max_notes"]))
            if arm == "opd":
                config.beta = float(section["beta"])
            else:
                config.lmbda = float(section["lmbda"])
                config.use_extended_uld = bool(section["use_extended_uld"])
                config.uld_use_hybrid_loss = bool(section["uld_use_hybrid_loss"])
        except KeyError as err:
            raise UserError(f"params baselines.{arm} (or distill.train) has no {err.args[0]!r}") from None
        if section.get("precision", "bf16") != "bf16":
            raise UserError(f"params baselines.{arm}.precision is {section['precision']!r}: the on-policy arms train "
                            "bf16 weights without an fp32 master copy (App. J.3, J.4)")
        if config.max_completion_length < 2:
            raise UserError(f"params baselines.{arm}.max_completion_length must be at least 2 tokens")
        if config.batch % config.per_device_batch:
            raise UserError(f"baselines.{arm}.per_device_batch {config.per_device_batch} does not divide the global "
                            f"batch {config.batch} (distill.train.batch)")
        return config

    def as_dict(self) -> dict:
        other_arm = ("lmbda", "use_extended_uld", "uld_use_hybrid_loss") if self.arm == "opd" else ("beta",)
        return {k: v for k, v in asdict(self).items() if k not in other_arm}


# ---- data ------------------------------------------------------------------------------------------------

def training_traces(traces: list[dict], note_ids: list[str], max_notes: int | None = None) -> list[dict]:
    """The teacher's trace of each training note, in the manifest's order (its first `max_notes`)."""
    by_id = {t["note_id"]: t for t in traces}
    missing = [n for n in note_ids if n not in by_id]
    if missing:
        raise UserError(f"no teacher trace for {len(missing)} training notes of the targets manifest (e.g. "
                        f"{missing[0]}); regenerate the traces (stage TR-008)")
    return [by_id[n] for n in note_ids][:max_notes]


def cut_completion(tokenizer, completion: str, cap: int) -> tuple[str, bool]:
    """The completion's first `cap` - 1 tokens of `tokenizer` (GOLD appends the end-of-sequence token), and
    whether anything was cut."""
    enc = tokenizer.encode(completion)
    if len(enc.ids) < cap:
        return completion, False
    return completion[:enc.offsets[cap - 2][1]], True


def opd_dataset(traces: list[dict]):
    """One conversational prompt per note: TRL renders it through the student's chat template."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": t["prompt"]}]} for t in traces])


def gold_dataset(traces: list[dict], tokenizer, cap: int):
    """(dataset, notes cut) of prompt-completion texts: the templated prompt and the teacher's trace, which the
    off-policy micro-batches train on."""
    from datasets import Dataset

    rows, cut = [], 0
    for t in traces:
        completion, was_cut = cut_completion(tokenizer, t["completion"], cap)
        cut += was_cut
        rows.append({"prompt": tokenizer.chat_prompt(t["prompt"]), "completion": completion})
    return Dataset.from_list(rows), cut


# ---- the run directory -------------------------------------------------------------------------------------

def trl_version() -> str:
    return importlib.metadata.version("trl")


def last_checkpoint(out: Path) -> Path | None:
    from transformers.trainer_utils import get_last_checkpoint

    found = get_last_checkpoint(str(out)) if out.is_dir() else None
    return Path(found) if found else None


def _trim_metrics(path: Path, last_step: int) -> None:
    from mistill.distill.trainer import read_metrics
    from mistill.io import atomic_open

    rows = [r for r in read_metrics(path) if r["step"] <= last_step]
    with atomic_open(path, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def prepare_run_dir(out: Path, run_config: dict) -> Path | None:
    """The checkpoint to resume from, or None for a fresh run.  A checkpoint of another run (its identity
    differs) is discarded, as the shared trainer's pipeline runs do; metrics logged after the checkpoint go."""
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = last_checkpoint(out)
    saved_path = out / "config.json"
    if checkpoint is not None:
        saved = json.loads(saved_path.read_text(encoding="utf-8")) if saved_path.exists() else {}
        differs = [k for k in IDENTITY_KEYS if saved.get(k) != run_config.get(k)]
        if differs:
            print(f"{out}: checkpoints of a different run ({', '.join(differs)} differ); starting afresh")
            for old in out.glob("checkpoint-*"):
                shutil.rmtree(old)
            checkpoint = None
    metrics = out / "metrics.jsonl"
    if checkpoint is None:
        metrics.unlink(missing_ok=True)   # a fresh run starts a fresh log
    elif metrics.exists():
        _trim_metrics(metrics, int(checkpoint.name.rsplit("-", 1)[1]))
    return checkpoint


def _callbacks(out: Path, max_steps: int | None, notes_per_step: int, total_steps: int):
    import time

    import torch
    from transformers import TrainerCallback

    from mistill.distill.trainer import peak_memory_bytes

    class MetricsLog(TrainerCallback):
        """One line per optimiser step in `metrics.jsonl`, as the shared trainer writes it (step, loss, lr,
        grad_norm, notes, step_time_s, peak_memory_bytes), plus whatever else TRL logged."""

        def __init__(self):
            self.started = time.perf_counter()

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()   # the step's rollouts are generated inside it
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            device = torch.device("cuda") if torch.cuda.is_available() and not args.use_cpu else torch.device("cpu")
            row = {"step": int(state.global_step), "epoch": logs.get("epoch"), "loss": float(logs["loss"]),
                   "lr": float(logs.get("learning_rate", 0.0)), "notes": notes_per_step,
                   "step_time_s": time.perf_counter() - self.started, "peak_memory_bytes": peak_memory_bytes(device)}
            row.update({k: v for k, v in logs.items() if k not in ("loss", "learning_rate", "epoch")
                        and isinstance(v, int | float)})
            with (out / "metrics.jsonl").open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")

    class StopAndSave(TrainerCallback):
        """`--max-steps`: stop after that many optimiser steps of this invocation, the schedule unchanged,
        with a checkpoint to resume from; and always checkpoint the last step."""

        def __init__(self):
            self.steps = 0

        def on_train_begin(self, args, state, control, **kwargs):
            # the learning-rate schedule was laid out over `total_steps`: TRL must run exactly those
            if state.max_steps != total_steps:
                raise UserError(f"TRL plans {state.max_steps} optimiser steps where the schedule has {total_steps}")

        def on_step_end(self, args, state, control, **kwargs):
            self.steps += 1
            if state.global_step >= state.max_steps:
                control.should_save = True
            if max_steps is not None and self.steps >= max_steps:
                control.should_training_stop = True
                control.should_save = True
            return control

    return [MetricsLog(), StopAndSave()]


def steps_per_epoch(n_prompts: int, config: OnPolicyConfig) -> int:
    """TRL draws whole generation batches (its `RepeatSampler` drops an incomplete last one)."""
    return n_prompts // config.batch


def recipe_optimizer(model, config: OnPolicyConfig, total_steps: int):
    """The shared trainer's AdamW (0.9, 0.95, no weight decay) and its warm-up + cosine schedule (App. J.2),
    so the optimiser and schedule are matched to the off-policy arms' (App. J.4), not TRL's defaults."""
    from mistill.distill.trainer import TrainConfig, make_optimizer

    recipe = TrainConfig(epochs=config.epochs, batch=config.batch, lr=config.lr, warmup_frac=config.warmup_frac,
                         clip=config.clip, precision="bf16")
    return make_optimizer([p for p in model.parameters() if p.requires_grad], recipe, total_steps)


def training_arguments(config: OnPolicyConfig, out: Path, seed: int, use_cpu: bool) -> dict[str, Any]:
    """The arguments both TRL configs share: the shared recipe's batch, epochs and clipping, bf16 weights
    without autocast, one log line per step and the checkpoints."""
    return dict(
        output_dir=str(out), seed=seed, data_seed=seed, use_cpu=use_cpu,
        num_train_epochs=config.epochs, per_device_train_batch_size=config.per_device_batch,
        gradient_accumulation_steps=config.batch // config.per_device_batch,
        learning_rate=config.lr, max_grad_norm=config.clip,   # the optimiser and schedule: `recipe_optimizer`
        # App. J.4: the student's weights are bf16 already; autocast would add nothing, a master copy is not kept
        bf16=False, fp16=False,
        gradient_checkpointing=config.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if config.gradient_checkpointing else None,
        logging_steps=1, save_strategy="steps", save_steps=config.save_every, save_total_limit=1,
        report_to="none", dataloader_num_workers=0, disable_tqdm=False,
        max_completion_length=config.max_completion_length,
        temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
        use_vllm=config.use_vllm, vllm_mode=config.vllm_mode,
        vllm_gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        vllm_max_model_length=config.vllm_max_model_length,
    )


@contextmanager
def _teacher_tokenizer_for_gold(tokenizer):
    """GOLDTrainer loads the teacher's tokenizer by name (`AutoTokenizer.from_pretrained`) inside its
    constructor; ours is built from our tokenizer, not read from files, so the name resolves to it there."""
    from trl.experimental.gold import gold_trainer

    class Loader:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            return tokenizer

    original = gold_trainer.AutoTokenizer
    gold_trainer.AutoTokenizer = Loader
    try:
        yield
    finally:
        gold_trainer.AutoTokenizer = original


def build_trainer(config: OnPolicyConfig, student, teacher, student_tok, teacher_tok, traces: list[dict],
                  out: Path, seed: int, *, max_steps: int | None = None, teacher_name: str = "teacher"):
    """(TRL trainer, what the run config records about its data) for one arm."""
    import torch

    from mistill.baselines.hf_tokenizer import TRLTokenizer

    use_cpu = next(student.parameters()).device.type == "cpu"
    if next(student.parameters()).dtype != torch.bfloat16:
        raise UserError("the on-policy arms train bf16 weights (App. J.4): load the student with dtype=bfloat16")
    common = training_arguments(config, out, seed, use_cpu)
    total_steps = steps_per_epoch(len(traces), config) * config.epochs
    if total_steps < 1:
        raise UserError(f"{len(traces)} training prompts make no whole global batch of {config.batch}")
    optimizers = recipe_optimizer(student, config, total_steps)
    callbacks = _callbacks(out, max_steps, config.batch, total_steps)
    student_hf = TRLTokenizer(student_tok)
    teacher.eval().requires_grad_(False)
    if config.arm == "opd":
        from trl import DistillationConfig, DistillationTrainer

        if int(student.config.vocab_size) != int(teacher.config.vocab_size):
            raise UserError(f"OPD compares the teacher's full next-token distribution: the student's vocabulary "
                            f"({student.config.vocab_size}) must be the teacher's ({teacher.config.vocab_size}); "
                            "GOLD is the cross-tokenizer arm")
        args = DistillationConfig(**common, beta=config.beta, shuffle_dataset=True)
        trainer = DistillationTrainer(model=student, teacher_model=teacher, args=args,
                                      train_dataset=opd_dataset(traces), processing_class=student_hf,
                                      callbacks=callbacks, optimizers=optimizers)
        return trainer, {}
    from trl.experimental.gold import GOLDConfig, GOLDTrainer

    dataset, cut = gold_dataset(traces, student_tok, config.max_completion_length)
    longest_prompt = max(len(student_tok.encode(row["prompt"]).ids) for row in dataset)
    args = GOLDConfig(**common, lmbda=config.lmbda, use_uld_loss=True, use_extended_uld=config.use_extended_uld,
                      uld_use_hybrid_loss=config.uld_use_hybrid_loss, teacher_tokenizer_name_or_path=teacher_name,
                      # [ours] room for the longest prompt and a full rollout: nothing is ever truncated
                      max_length=longest_prompt + config.max_completion_length + 1)
    teacher_hf = TRLTokenizer(teacher_tok)
    with _teacher_tokenizer_for_gold(teacher_hf):
        trainer = GOLDTrainer(model=student, teacher_model=teacher, args=args, train_dataset=dataset,
                              processing_class=student_hf, callbacks=callbacks, optimizers=optimizers)
    if trainer.teacher_tokenizer is not teacher_hf:
        raise UserError("GOLDTrainer did not take the teacher's tokenizer it was given; check the TRL version")
    return trainer, {"completions_cut": cut, "max_length": args.max_length}


def run_config_of(config: OnPolicyConfig, trainer, traces: list[dict], student: str, teacher: str, seed: int,
                  extra: dict) -> dict:
    import torch
    import transformers

    return {"arm": config.arm, "student": student, "teacher": teacher, "seed": seed, "precision": "bf16",
            "settings": config.as_dict(), "recipe": {k: getattr(config, k) for k in
                                                      ("lr", "batch", "warmup_frac", "clip", "epochs")},
            "example_ids": [t["note_id"] for t in traces], "trl_args": json.loads(trainer.args.to_json_string()),
            "trainer": type(trainer).__name__, "torch_version": torch.__version__, "trl_version": trl_version(),
            "transformers_version": transformers.__version__, "python": platform.python_version(), **extra}


def train(config: OnPolicyConfig, student, teacher, student_tok, teacher_tok, traces: list[dict], out: Path,
          seed: int, *, student_name: str, teacher_name: str, max_steps: int | None = None,
          run_config: dict | None = None) -> dict:
    """Train one arm into `out` (resuming its last checkpoint); the final model goes to `out/model`.
    Returns the written run config."""
    out = Path(out)
    trainer, extra = build_trainer(config, student, teacher, student_tok, teacher_tok, traces, out, seed,
                                   max_steps=max_steps, teacher_name=teacher_name)
    config_row = {**run_config_of(config, trainer, traces, student_name, teacher_name, seed, extra),
                  **(run_config or {})}
    checkpoint = prepare_run_dir(out, config_row)
    config_row["resumed_from"] = checkpoint.name if checkpoint else None
    from mistill.io import write_json

    write_json(out / "config.json", config_row)
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    state = trainer.state
    config_row["total_steps"] = int(state.max_steps)
    write_json(out / "config.json", config_row)
    if state.global_step >= state.max_steps:
        # the student alone, as the shared trainer saves it: its tokenizer is ours, written beside it
        trainer.accelerator.unwrap_model(trainer.model).save_pretrained(out / "model")
    return config_row
