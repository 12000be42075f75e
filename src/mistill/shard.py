"""Per-note passes sharded across the processes of one host, as torchrun starts them.

torchrun (`torch.distributed.run`) starts one process per GPU and tells each its RANK, WORLD_SIZE
and LOCAL_RANK. A pass then visits the notes in their fixed corpus order and computes note n on rank
n mod WORLD_SIZE; each rank writes only its notes' files (atomically, as a single process does),
and what reads every note (a pass's summary, the calibration) runs on rank 0 once all ranks have
finished their notes. Without torchrun the world is one process and nothing changes.

The processes meet through a gloo process group (CPU tensors, so the same code runs on a CPU host
and between GPUs): a barrier, and the gathering of small Python objects such as skipped notes.
A rank that dies takes the others down with it (torchrun ends the group), and every note file
already committed stays valid, so the rerun computes only the notes that are missing.

`compute.gpus_per_pass` in params asks for the processes: the pass commands of the CLI start
themselves again under torchrun with that many (`relaunch`), so DVC's stage commands stay as they
are.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from mistill.errors import UserError

T = TypeVar("T")
ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class Shard:
    """This process's place among the processes of a pass: rank `rank` of `world`."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Shard:
        env = os.environ if env is None else env
        if "WORLD_SIZE" not in env:
            return cls()
        try:
            rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
            local = int(env.get("LOCAL_RANK", rank))
        except (KeyError, ValueError):
            raise UserError(f"torchrun environment: RANK, WORLD_SIZE, LOCAL_RANK must be integers "
                            f"(got {', '.join(f'{k}={env.get(k)!r}' for k in ENV)})") from None
        if world < 1 or not 0 <= rank < world:
            raise UserError(f"torchrun environment: RANK={rank} is not a rank of WORLD_SIZE={world}")
        return cls(rank, world, local)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def owns(self, index: int) -> bool:
        """Whether the note at `index` of the pass's fixed order is this rank's."""
        return index % self.world == self.rank

    def mine(self, items: Iterable[T]) -> list[T]:
        return [item for n, item in enumerate(items) if self.owns(n)]

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            join_group()
            dist.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        join_group()
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def leader_only(self, fn: Callable[[], T]) -> T | None:
        """`fn()` on rank 0 while the others wait; its result on rank 0, None elsewhere."""
        result = fn() if self.leader else None
        self.barrier()
        return result


_current: Shard | None = None


def current() -> Shard:
    """This process's shard; under torchrun the first call joins the process group (gloo) and
    makes the rank's GPU, where there is one, the default CUDA device."""
    global _current
    if _current is None:
        shard = Shard.from_env()
        if shard.world > 1:
            import torch

            join_group()
            if torch.cuda.is_available():
                torch.cuda.set_device(shard.local_rank % torch.cuda.device_count())
        _current = shard
    return _current


def join_group() -> None:
    """Join the processes' gloo group (once; torchrun's environment says where it meets)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="gloo")


def relaunch(argv: list[str], processes: int) -> None:
    """Start this command again under torchrun with `processes` processes, unless it already runs
    under torchrun or one process is asked for. Replaces the current process."""
    if processes < 1:
        raise UserError(f"params compute.gpus_per_pass: {processes}; expected 1 or more")
    if processes == 1 or "LOCAL_RANK" in os.environ:
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               "-m", "mistill.cli", *argv]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, command)


def gpus_per_pass(params: Mapping[str, Any]) -> int:
    """params `compute.gpus_per_pass` (1 where the profile has no compute section)."""
    value = (params.get("compute") or {}).get("gpus_per_pass", 1)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UserError(f"params compute.gpus_per_pass: {value!r}; expected an integer") from None
