"""One trainer for every off-policy arm (App. J.2, "Shared recipe").

AdamW (beta1 0.9, beta2 0.95, no weight decay), 5% linear warm-up then cosine decay to 0,
gradient-norm clipping at 1, one trace per micro-step with gradient accumulation to a global batch
of 8, two epochs; the epoch order is a function of (seed, epoch).  (`notes_per_forward` > 1 pads
several traces into one micro-step's forward: the same loss to rounding, fewer and larger kernels
for small models.)  Two precisions are arms
(App. J.2, "Precision"): `bf16` = bf16 weights with no fp32 master copy, plain AdamW (its states
in bf16 too); `fp32` = fp32 master weights under bf16 autocast.  A run writes `config.json`
(every argument, the example ids, the torch version), `metrics.jsonl` (one line per optimiser step:
losses, lr, step time, peak memory) and `checkpoint.pt` (model, optimiser, scheduler, step and
every RNG state), so a resumed run continues exactly where it stopped; the final model goes to
`model/`.

The arms of this package are the trainer's own (`note_loss`); another arm subclasses `Trainer`,
overrides `note_loss` and hands its extra trained modules (Feature-KD's adapters) to `extra`: they
are optimised, clipped and checkpointed with the student, and saved beside it.
"""

from __future__ import annotations

import json
import math
import platform
import random
import resource
import shutil
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint
from tqdm import tqdm

from mistill.distill.arms import ArmConfig, note_loss, notes_loss, recorded_fields
from mistill.distill.mechanism import supervised_layers
from mistill.distill.pooled_attention import SupervisedRows
from mistill.distill.pools import Pool
from mistill.errors import UserError
from mistill.io import atomic_open, write_json

PRECISIONS = ("bf16", "fp32")


@dataclass
class TrainConfig:
    epochs: int = 2
    batch: int = 8
    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    warmup_frac: float = 0.05
    clip: float = 1.0
    precision: str = "bf16"
    seed: int = 0
    gradient_checkpointing: bool = True
    offload_checkpoints: bool = False   # keep the checkpointed layer inputs in pinned host memory
    mlp_chunk: int = 0                  # tokens per checkpointed MLP chunk inside each layer (0: off)
    save_every: int = 1       # optimiser steps between checkpoints
    notes_per_forward: int = 1   # notes of a micro-step, right-padded into one forward (the arms' own loss)

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise UserError(f"unknown precision {self.precision!r}; known: {', '.join(PRECISIONS)}")
        if self.notes_per_forward < 1:
            raise UserError(f"notes_per_forward must be at least 1, not {self.notes_per_forward}")

    def as_dict(self) -> dict:
        """The recipe as its runs record it; one note per forward (the default) is left out."""
        return recorded_fields(self, {"notes_per_forward": 1})


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """App. J.2: the epoch order is a function of (seed, epoch) only."""
    return np.random.default_rng([seed, epoch]).permutation(n).tolist()


def cosine_with_warmup(total_steps: int, warmup_frac: float):
    warmup = max(1, math.ceil(warmup_frac * total_steps)) if warmup_frac > 0 else 0

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def chunk_mlps(model, chunk: int) -> None:
    """Run every decoder layer's MLP over the sequence in chunks, each under its own checkpoint.

    The MLP acts on each position separately, so the result is the same; what changes is memory:
    the recompute of a checkpointed layer then holds one chunk's [chunk, intermediate] activations
    instead of the whole sequence's (about 2.5 GiB at 34k tokens on Qwen3-4B), for one more MLP
    forward in backward.  The modules and their state dict are untouched.
    """
    for layer in model.model.layers:
        mlp = layer.mlp
        original = type(mlp).forward

        def forward(self, x, original=original):
            n = x.shape[-2]
            if chunk <= 0 or n <= chunk or not torch.is_grad_enabled():
                return original(self, x)
            return torch.cat([checkpoint(original, self, x[..., s:s + chunk, :], use_reentrant=False)
                              for s in range(0, n, chunk)], dim=-2)
        mlp.forward = types.MethodType(forward, mlp)


def precision_dtype(precision: str) -> str:
    """The dtype a precision arm's student is loaded in: bf16 weights (no master copy) or fp32 weights."""
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    return "bfloat16" if precision == "bf16" else "float32"


def prepare_model(model, cfg: TrainConfig):
    """Precision arm and memory settings: bf16 weights (no master copy) or fp32 weights.

    `mistill distill train` loads the student in its arm's dtype (`from_pretrained(dtype=...)`); a model
    built in memory in another dtype has its weights cast here with RoPE's `inv_freq` kept fp32, which a
    plain `model.to(torch.bfloat16)` would round (angle errors of radians at tens of thousands of tokens).
    """
    from mistill.models.loading import cast_weights

    dtype = getattr(torch, precision_dtype(cfg.precision))
    if model.dtype != dtype:
        model = cast_weights(model, dtype)
    try:
        model.set_attn_implementation("sdpa")  # no full attention matrices in the training forward
    except (AttributeError, ValueError, ImportError):
        model.config._attn_implementation = "sdpa"
    if cfg.gradient_checkpointing:
        # transformers >= 5.20 names it activation checkpointing; both take `offload` (layers x T x D
        # bytes of layer inputs held in host memory: what dominates at 36k tokens); pinned host memory needs
        # an accelerator, and a model on the CPU keeps its layer inputs in host memory anyway
        offload = {"offload": True} if cfg.offload_checkpoints and next(model.parameters()).is_cuda else {}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False}, **offload)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}, **offload)
    if cfg.mlp_chunk > 0:
        chunk_mlps(model, cfg.mlp_chunk)
    model.config.use_cache = False
    return model.train()


def make_optimizer(parameters: list[torch.nn.Parameter], cfg: TrainConfig, total_steps: int):
    # fused AdamW on CUDA: one kernel, no parameter-sized temporaries (the foreach path allocates
    # several, which would set the run's peak memory at the optimiser step)
    on_cuda = parameters[0].is_cuda
    opt = torch.optim.AdamW(parameters, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                            **({"fused": True} if on_cuda else {"foreach": False}))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine_with_warmup(total_steps, cfg.warmup_frac))
    return opt, sched


def read_metrics(path: Path) -> list[dict]:
    """The rows of a run's `metrics.jsonl`.  A last line cut off by a killed run is dropped: a step's
    line is logged before its checkpoint, so that step is recomputed on resume anyway."""
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line.rstrip("\r\n")))
        except json.JSONDecodeError as err:
            if number == len(lines) and not line.endswith("\n"):
                break
            raise UserError(f"{path}:{number}: not a JSON object at column {err.colno}; the training log is "
                            "corrupt: remove the run directory to train afresh") from None
    return rows


class Trainer:
    # what makes two runs the same run: a checkpoint is resumed only when all of these match
    RUN_IDENTITY = ("arm", "train", "example_ids", "student_sha256", "teacher_hash", "targets_sha256", "pools")

    def __init__(self, model, notes: list, arm: ArmConfig, cfg: TrainConfig, out_dir: Path, *,
                 pools: dict[str, Pool] | None = None, run_config: dict | None = None, restart_if_different: bool = False,
                 extra: torch.nn.Module | None = None):
        """`restart_if_different`: a checkpoint of another run in `out_dir` is discarded and the run starts
        afresh (what a pipeline stage wants once its inputs changed); by default it is refused.
        `arm` is anything with `.arm` (its name) and `.as_dict()`; `extra`: modules trained with the
        student (on its device), saved to `extra.pt` at the end."""
        if not notes:
            raise UserError("no training notes")
        if arm.arm == "mistill" and not pools:
            raise UserError("the mistill arm needs the student's head pools")
        self.arm, self.cfg, self.notes, self.pools = arm, cfg, notes, pools
        self.restart_if_different = restart_if_different
        self.out_dir = Path(out_dir)
        self.model = prepare_model(model, cfg)
        self.device = next(self.model.parameters()).device
        self.extra = extra.to(self.device).train() if extra is not None else None
        self.parameters = list(self.model.parameters()) + (list(extra.parameters()) if extra is not None else [])
        self.steps_per_epoch = math.ceil(len(notes) / cfg.batch)
        self.total_steps = self.steps_per_epoch * cfg.epochs
        self.opt, self.sched = make_optimizer(self.parameters, cfg, self.total_steps)
        self.step = 0
        self.rows_hook = None
        if arm.arm == "mistill":
            self.rows_hook = SupervisedRows(self.model, supervised_layers(pools, pools.get("P1")),
                                            row_chunk=arm.row_chunk)
        self.run_config = {"arm": arm.as_dict(), "train": cfg.as_dict(), "example_ids": [n.note_id for n in notes],
                           "torch_version": torch.__version__, "python": platform.python_version(),
                           "total_steps": self.total_steps, **(run_config or {})}

    # -- resume ---------------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.out_dir / "checkpoint.pt"

    def save_checkpoint(self) -> None:
        state = {"step": self.step, "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                 "scheduler": self.sched.state_dict(), "rng": _rng_state(), "config": self.run_config}
        if self.extra is not None:
            state["extra"] = self.extra.state_dict()
        with atomic_open(self.checkpoint_path, "wb") as fh:
            torch.save(state, fh)

    def maybe_resume(self) -> bool:
        if not self.checkpoint_path.exists():
            return False
        state = torch.load(self.checkpoint_path, map_location=self.device, weights_only=False)
        saved = state["config"]
        differs = [k for k in self.RUN_IDENTITY if saved.get(k) != self.run_config.get(k)]
        if differs:
            if not self.restart_if_different:
                raise UserError(f"{self.checkpoint_path}: a checkpoint of a different run ({', '.join(differs)} "
                                "differ); remove it or choose another output directory")
            print(f"{self.checkpoint_path}: a checkpoint of a different run ({', '.join(differs)} differ); "
                  "starting afresh")
            self.checkpoint_path.unlink()
            return False
        self.model.load_state_dict(state["model"])
        if self.extra is not None:
            self.extra.load_state_dict(state["extra"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        _set_rng_state(state["rng"])
        self.step = state["step"]
        metrics = self.out_dir / "metrics.jsonl"
        if metrics.exists():  # drop lines logged after the checkpoint
            rows = read_metrics(metrics)
            with atomic_open(metrics, "w") as fh:
                for row in rows:
                    if row["step"] <= self.step:
                        fh.write(json.dumps(row) + "\n")
        return True

    # -- reuse --------------------------------------------------------------------------
    def same_run_as(self, other_dir: Path) -> bool:
        """Whether `other_dir` holds a finished run of this very run: the same identity (objective, recipe, notes,
        student, teacher, targets, pools) and every step taken. Training is deterministic on a machine, so such a
        run's files are the files this one would write."""
        config_path = Path(other_dir) / "config.json"
        if Path(other_dir).resolve() == self.out_dir.resolve() or not config_path.is_file():
            return False
        if not (Path(other_dir) / "model").is_dir():
            return False
        other = json.loads(config_path.read_text(encoding="utf-8"))
        ours = json.loads(json.dumps(self.run_config))       # as config.json holds it: tuples read back as lists
        return (other.get("total_steps") == self.total_steps
                and all(other.get(k) == ours.get(k) for k in self.RUN_IDENTITY))

    def reuse(self, other_dir: Path) -> None:
        """Take a finished run of this very run (`same_run_as`) as this run's result: its weights, log and
        checkpoint copied, this run's config written with the run it came from."""
        other_dir = Path(other_dir)
        if self.out_dir.exists():
            shutil.rmtree(self.out_dir)
        shutil.copytree(other_dir, self.out_dir, ignore=shutil.ignore_patterns(".*.tmp"))
        write_json(self.out_dir / "config.json", {**self.run_config, "resumed": False, "same_run_as": str(other_dir)})

    # -- training -------------------------------------------------------------------------
    def note_loss(self, batch) -> tuple[torch.Tensor, dict]:
        """One note's loss and its log under this trainer's arm."""
        return note_loss(self.model, batch, self.arm, self.pools, self.rows_hook)

    def group_losses(self, batches: list) -> list[tuple[torch.Tensor, dict]]:
        """Each note's loss and log, the group's notes in one padded forward (mistill.distill.arms.notes_loss).
        An arm that brings its own `note_loss` (a subclass) computes its notes one forward each."""
        if type(self).note_loss is not Trainer.note_loss:
            return [self.note_loss(b) for b in batches]
        return notes_loss(self.model, batches, self.arm, self.pools, self.rows_hook)

    def autocast(self):
        """fp32 master weights compute under bf16 autocast; a bf16 run's weights are bf16 already (App. J.2)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "fp32")

    @torch.no_grad()
    def first_batch_logs(self) -> list[dict]:
        """Each note's loss log on the first optimiser step's batch, before any update (dose matching)."""
        indices = epoch_order(len(self.notes), self.cfg.seed, 0)[:self.cfg.batch]
        autocast = self.autocast()
        logs = []
        for i in indices:
            with autocast:
                logs.append(self.note_loss(self.notes[i])[1])
        return logs

    def _batches(self):
        for step in range(self.step, self.total_steps):
            epoch, within = divmod(step, self.steps_per_epoch)
            order = epoch_order(len(self.notes), self.cfg.seed, epoch)
            yield step, epoch, order[within * self.cfg.batch:(within + 1) * self.cfg.batch]

    def train_step(self, indices: list[int]) -> dict:
        t0 = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.opt.zero_grad(set_to_none=True)
        logs = []
        autocast = self.autocast()
        per_forward = self.cfg.notes_per_forward
        for start in range(0, len(indices), per_forward):
            with autocast:
                losses = self.group_losses([self.notes[i] for i in indices[start:start + per_forward]])
            (sum(loss for loss, _ in losses) / len(indices)).backward()
            logs += [log for _, log in losses]
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.cfg.clip)
        lr = self.sched.get_last_lr()[0]
        self.opt.step()
        self.sched.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        row = {k: float(np.mean([log[k] for log in logs if k in log]))
               for k in sorted({k for log in logs for k in log})}
        row.update({"grad_norm": float(grad_norm), "lr": lr, "notes": len(indices),
                    "step_time_s": time.perf_counter() - t0, "peak_memory_bytes": peak_memory_bytes(self.device)})
        return row

    def run(self, *, max_steps: int | None = None) -> list[dict]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        resumed = self.maybe_resume()
        if resumed and self.step == self.total_steps and (self.out_dir / "model").is_dir():
            # a finished run has nothing left to do: its directory stays byte for byte what it was, so a stage
            # re-run after an edit elsewhere does not make everything that reads the run stale
            return []
        if not resumed and (self.out_dir / "metrics.jsonl").exists():
            (self.out_dir / "metrics.jsonl").unlink()  # a fresh run starts a fresh log
        write_json(self.out_dir / "config.json", {**self.run_config, "resumed": resumed})
        rows = []
        metrics = self.out_dir / "metrics.jsonl"
        bar = tqdm(self._batches(), total=self.total_steps, initial=self.step, desc=f"train {self.arm.arm}",
                   unit="step")
        for step, epoch, indices in bar:
            if max_steps is not None and len(rows) >= max_steps:
                break
            row = {"step": step + 1, "epoch": epoch, **self.train_step(indices)}
            self.step = step + 1
            with metrics.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            rows.append(row)
            if self.step % self.cfg.save_every == 0 or self.step == self.total_steps:
                self.save_checkpoint()
        if self.step == self.total_steps:
            self.model.save_pretrained(self.out_dir / "model")
            if self.extra is not None:
                with atomic_open(self.out_dir / "extra.pt", "wb") as fh:
                    torch.save(self.extra.state_dict(), fh)
        return rows
