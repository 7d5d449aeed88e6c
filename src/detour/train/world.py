"""Who this process is in a training job: rank, world size, and the few collectives the loop needs.

    python -c "from detour.train.world import init_world; print(init_world())"

Under torchrun (WORLD_SIZE > 1) the process joins the group torchrun set up; otherwise it is a world
of one and every collective is the identity. Checkpoints, the loop and data parallelism all take a
`World`, so it lives apart from any of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, values: list[float]) -> list[float]:
        if self.size == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()

    def any(self, flag: bool) -> bool:
        return bool(self.sum([float(flag)])[0]) if self.size > 1 else flag

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order (a list of one on a single process)."""
        if self.size == 1:
            return [obj]
        gathered: list = [None] * self.size
        dist.all_gather_object(gathered, obj)
        return gathered

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()


def init_world() -> World:
    """Join the process group torchrun set up (WORLD_SIZE > 1), or run as a single process."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    if not dist.is_initialized():
        import atexit

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
        # One group for the whole process, ended at exit: `detour twins` trains several arms in one
        # process, and a group created again after an FSDP run hangs at its first collective.
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    world = World(rank=dist.get_rank(), size=dist.get_world_size(), local_rank=int(os.environ.get("LOCAL_RANK", 0)))
    if torch.cuda.is_available():
        torch.cuda.set_device(world.local_rank)
    return world


def shutdown_world(world: World) -> None:
    """The end of one training: every rank is done with it; the group itself lives until exit."""
    if world.size > 1 and dist.is_initialized():
        dist.barrier()


def check_strategy(recipe, world: World) -> None:
    """Refuse, before anything is built, a strategy this torch cannot run."""
    if recipe.distributed.strategy == "fsdp" and world.size > 1:
        try:
            from torch.distributed.fsdp import fully_shard  # noqa: F401  (public from torch 2.6)
        except ImportError:
            from detour.errors import DetourError

            raise DetourError(f"distributed.strategy: fsdp needs torch >= 2.6 (torch.distributed.fsdp.fully_shard); "
                              f"this is torch {torch.__version__}: use ddp, or upgrade torch") from None



def compute_session(world: World, device: torch.device, global_step: int) -> dict:
    """Where and on what a stretch of a run computes, from `global_step` on: one entry per start or
    resume in the run's state and summary.json. A run resumed on another thread count, world size,
    device or library version is no longer bit for bit an uninterrupted run (float sums are taken
    in another order); these entries say where that happened (detour.compute.same_compute)."""
    import platform
    from datetime import datetime, timezone

    from detour.compute import compute_record

    return {"from_step": int(global_step), "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "world_size": world.size, **compute_record(device)}
