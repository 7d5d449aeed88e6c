"""Data parallelism under torchrun: one process per device, one shared token stream.

    torchrun --nproc-per-node 2 -m detour.cli train recipes/tiny-modernbert.yaml --out runs/ddp \
        --set batch.micro_batch=4   # 8 sequences a step = 2 processes x 4

Each rank reads a disjoint slice of the same global stream (see detour.data.packing), runs its
micro-batches, and the gradients are summed across ranks once per optimizer step, after
accumulation, then divided by the label count of the whole global batch, so a step means the same
thing on 1 or N processes. The all-reduce is explicit rather than torch's DDP wrapper because the
objectives call the encoder body and the head separately (the fused CLM head), which the wrapper's
forward hooks do not see; it gives up DDP's overlap of communication with the backward pass.
"""

from __future__ import annotations

import hashlib
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

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        if self.size == 1:
            return
        for p in params:
            if p.grad is None:  # a trainable parameter this rank's batch did not reach
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)

    def stream_digest(self, local: str) -> str:
        """Combine each rank's digest of the tokens it consumed, in rank order."""
        if self.size == 1:
            return local
        gathered: list[str] = [""] * self.size
        dist.all_gather_object(gathered, local)
        return hashlib.sha256("".join(gathered).encode()).hexdigest()

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
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
    world = World(rank=dist.get_rank(), size=dist.get_world_size(), local_rank=int(os.environ.get("LOCAL_RANK", 0)))
    if torch.cuda.is_available():
        torch.cuda.set_device(world.local_rank)
    return world


def shutdown_world(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
