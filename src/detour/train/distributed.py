"""Data parallelism under torchrun: one process per device, one shared token stream, DDP or FSDP2.

    torchrun --nproc-per-node 2 -m detour.cli train recipes/tiny-modernbert.yaml --out runs/ddp \
        --set batch.micro_batch=4   # 8 sequences a step = 2 processes x 4; add
        # --set distributed.strategy=fsdp to shard parameters, gradients and optimizer state

Each rank reads a disjoint slice of the same global stream (see `rank_sequences`). The whole
training computation (encoder body, MLM head and loss) is one module, `TrainingComputation`, so
torch's wrappers see every parameter it uses through their forward hooks: DistributedDataParallel
(bucketed all-reduce overlapped with the backward pass) or FSDP2's `fully_shard` on each encoder
layer and on the root. Gradients are synchronised once per optimizer step, on each rank's last
micro-batch; the loop then divides them by the label count of the whole global batch, so a step
means the same thing on 1 or N processes. A single process runs the module as is, no wrapper.
docs/distributed.md has the multi-node, SLURM and NCCL side.
"""

from __future__ import annotations

import copy
import inspect
from contextlib import contextmanager, nullcontext

import torch

from detour.train.world import World


# -- the data of a step -------------------------------------------------------------------------


def rank_sequences(stream, n_tokens: int, world: World) -> list:
    """This rank's sequences of a step of exactly `n_tokens` tokens (all ranks together).

    The step is the sequences one process would read: full `seq_len` ones and, on a phase's last
    step, one shorter. Global sequence j goes to rank j % world.size, as the stream deals them, so
    the ranks' data are disjoint slices of one stream, each sequence keeps its stream index (its
    MLM masks), and the stream's state after the step is the one a single process would have. A
    last step that does not fill every rank gives some ranks fewer sequences, or none.
    """
    seq_len = stream.seq_len
    lengths = [seq_len] * (n_tokens // seq_len) + ([n_tokens % seq_len] if n_tokens % seq_len else [])
    mine = []
    for start in range(0, len(lengths), world.size):
        group = lengths[start:start + world.size]
        if len(group) == world.size and len(set(group)) == 1:
            mine.append(stream.next_sequence(group[0]))  # one sequence per rank, each its own slice
            continue
        # The step's tail (fewer sequences than ranks, or of unequal lengths): every rank reads
        # each of its sequences from the global stream and keeps its own, at most world.size - 1
        # extra sequences read once per phase.
        with _whole_stream(stream):
            for j, length in enumerate(group):
                sequence = stream.next_sequence(length)
                if j == world.rank:
                    mine.append(sequence)
    return mine


def micro_batches(sequences: list, micro: int, n_tokens: int, seq_len: int, world: World) -> list:
    """This rank's sequences of a step in micro-batches, as many on every rank: None is a stand-in.

    A rank the last step gave fewer sequences (or none) pads with stand-ins (`stand_in_batch`):
    FSDP gathers weights in every forward and DDP reduces in the last backward, so every rank
    must run the same number of micro-batches. Rank 0 has the most: ceil(step sequences / ranks).
    """
    step_sequences = -(-n_tokens // seq_len)
    count = -(-(-(-step_sequences // world.size)) // micro)
    parts = [sequences[i:i + micro] for i in range(0, len(sequences), micro)]
    return parts + [None] * (count - len(parts))


@contextmanager
def _whole_stream(stream):
    """The stream as one process reads it: `next_sequence(n)` takes the next n global tokens."""
    rank, size = stream.rank, stream.world_size
    stream.rank, stream.world_size = 0, 1
    try:
        yield stream
    finally:
        stream.rank, stream.world_size = rank, size


# -- the training computation -------------------------------------------------------------------


class TrainingComputation(torch.nn.Module):
    """Body + MLM head + loss of one micro-batch as one module: what DDP and FSDP wrap.

    forward(batch, objective, mask_rate, mask_key) returns (loss_sum, n_labels, labels). The
    losses are those of `detour.model.objectives` as training calls them: CLM with the recipe's
    chunking, MLM with masks drawn from the stream (`mask_key`), never from a generator. With
    `held_out=True` it returns `objectives.held_out_scores` instead (the validation, no gradient):
    through this forward, so FSDP gathers the weights for it as for a training step.
    """

    def __init__(self, model, clm_chunk_size: int, reach_every_parameter: bool = False):
        super().__init__()
        self.model = model
        self.clm_chunk_size = clm_chunk_size
        self.reach_every_parameter = reach_every_parameter

    def forward(self, batch: dict, objective: str, mask_rate: float | None, mask_key: str, held_out: bool = False):
        from detour.model.objectives import clm_loss, held_out_scores, mlm_loss

        if held_out:
            return held_out_scores(self.model, batch, objective, mask_rate, mask_key, self.clm_chunk_size)
        if objective == "clm":
            out = clm_loss(self.model, batch, chunk_size=self.clm_chunk_size)
        else:
            out = mlm_loss(self.model, batch, mask_rate, mask_key=mask_key)
        loss = out.loss_sum
        if self.reach_every_parameter and out.n_labels == 0:
            # No label (a short last sequence, or a rank's stand-in batch): the head is skipped, but
            # DDP and FSDP wait for a gradient of every parameter they manage; a zero one is exact.
            loss = loss + 0.0 * sum(p.sum() for p in _head_parameters(self.model) if p.requires_grad)
        return loss, out.n_labels, out.labels


def _head_parameters(model):
    from detour.model.load import head_module_names

    for name in head_module_names(model):
        yield from model.get_submodule(name).parameters()


def stand_in_batch(pad_id: int) -> dict:
    """One pad token, for a rank with no sequence in a step: it still joins the gradient reduction.

    A special token carries no label in either objective, so its loss and gradients are zero.
    """
    one = torch.ones((1, 1), dtype=torch.long)
    return {"input_ids": one * pad_id, "doc_ids": one * 0, "position_ids": one * 0, "attention_mask": one,
            "seq_index": torch.tensor([-1])}


class DataParallelism:
    """The training computation on this world: as is on one process, under DDP or FSDP2 on several.

    `module` is what a micro-batch calls and `optimizer` the one to step (FSDP builds a new one over
    the shards, with the given one's state). `sync(last)` wraps each micro-batch: only a step's last
    one reduces gradients. `full_model()` and `checkpoint_parts()` give the weights and optimizer
    state in the single-process format (FSDP gathers them to the main rank: every rank must call).
    """

    def __init__(self, model, optimizer, recipe, world: World, device: torch.device):
        self.model, self.world, self.device = model, world, device
        self.strategy = recipe.distributed.strategy if world.size > 1 else None
        self.computation = TrainingComputation(model, recipe.clm_chunk_size, reach_every_parameter=world.size > 1)
        self.module = self.computation
        self.optimizer = optimizer
        # DDP and FSDP average gradients over the W ranks, while a step's gradient is the global
        # loss SUM's, divided once by the global label count. Each rank backpropagates W x its own
        # loss sum, so the average is (1/W) * sum_r W * grad(L_r) = sum_r grad(L_r): what one
        # process gets over the whole global batch (x W and / W are exact for W a power of two).
        self.loss_scale = world.size
        self._trainable: tuple[str, ...] | None = None
        if self.strategy == "fsdp":
            from detour.train.setup import build_optimizer

            # The main rank keeps an unsharded copy on the CPU to gather into for exports and
            # checkpoints: the same files as a single process writes, which resume on any world.
            self._gathered = _cpu_copy(model) if world.main else None
            self.module = _fully_shard(self.computation, model, device, world)
            self.optimizer = _sharded_optimizer(optimizer, build_optimizer(model, recipe.optimizer))

    def start_phase(self) -> None:
        """Call after a phase's freeze: DDP is (re)built when the parameters to train have changed.

        DDP registers the parameters that require a gradient when it is built and waits for a
        gradient of each in every synchronised backward: a freeze that changes the set needs a new
        wrapper (its cost: one broadcast of the weights, once per phase). find_unused_parameters=True
        would not do instead: it never syncs a parameter that was frozen when DDP was built (a later
        phase that unfreezes it would drift apart across ranks), and it walks the autograd graph
        after every synchronised forward (on the 2-process CPU test model, 121-147 ms a step with
        or without it: lost in the noise there; torch warns of the cost). Every parameter that
        trains gets a gradient in every micro-batch (see TrainingComputation), so it is not needed.
        FSDP2 reads requires_grad at each backward: nothing to rebuild.
        """
        if self.strategy != "ddp":
            return
        trainable = tuple(name for name, p in self.model.named_parameters() if p.requires_grad)
        if trainable == self._trainable:
            return
        self._trainable = trainable
        if not trainable:  # everything frozen: no gradient to reduce
            self.module = self.computation
            return
        from torch.nn.parallel import DistributedDataParallel

        # No buffer broadcast in forward (the buffers, rotary tables and position ids, are the same
        # everywhere): the only collective is the gradient reduction. Newer torch renamed the option.
        buffers = ({"forward_sync_buffers": False} if "forward_sync_buffers" in
                   inspect.signature(DistributedDataParallel).parameters else {"broadcast_buffers": False})
        self.module = DistributedDataParallel(
            self.computation, device_ids=[self.device.index] if self.device.type == "cuda" else None,
            gradient_as_bucket_view=True, **buffers)  # gradients live in the buckets: no second copy

    def sync(self, last: bool):
        """Context for one micro-batch's forward and backward: reduce gradients only if `last`."""
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(self.module, DistributedDataParallel):
            return nullcontext() if last else self.module.no_sync()
        if self.strategy == "fsdp":
            self.module.set_requires_gradient_sync(last)
        return nullcontext()

    def full_model(self):
        """The model with all its weights (main rank; other ranks get their own model back)."""
        if self.strategy != "fsdp":
            return self.model
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.world.main:
            return self.model
        self._gathered.load_state_dict({k.removeprefix("model."): v for k, v in full.items()})
        return self._gathered

    def checkpoint_parts(self):
        """(model, optimizer) for `save_checkpoint`: what a single process would save."""
        if self.strategy != "fsdp":
            return self.model, self.optimizer
        model = self.full_model()
        saved = self.optimizer.state_dict()  # ids as a single process numbers them, shards as values
        state = {i: {k: _full_tensor(v) for k, v in saved["state"][i].items()} for i in sorted(saved["state"])}
        if not self.world.main:
            return model, self.optimizer
        return model, _OptimizerState({"state": state, "param_groups": saved["param_groups"]})


def _cpu_copy(model):
    """A deep copy of `model` with every tensor on the CPU, made without a second copy on the device."""
    memo = {id(p): torch.nn.Parameter(p.detach().to("cpu", copy=True), p.requires_grad) for p in model.parameters()}
    memo.update({id(b): b.detach().to("cpu", copy=True) for b in model.buffers()})
    return copy.deepcopy(model, memo)  # tied weights stay tied: one parameter, one entry


def _fully_shard(computation, model, device: torch.device, world: World):
    """FSDP2: each encoder layer is a unit, the root (embeddings, head, norms) another."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from detour.model.load import encoder_layers

    mesh = init_device_mesh(device.type, (world.size,))
    options = {"mesh": mesh}
    if device.type == "cuda":  # bf16 compute, fp32 master weights and gradient reduction
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in encoder_layers(model)[1]:
        fully_shard(layer, **options)
    # The root is the computation, not the model: the objectives call the body and the head
    # directly, so only the computation's forward is sure to run (and to gather the root's weights).
    return fully_shard(computation, **options)


def _sharded_optimizer(plain: torch.optim.Optimizer, sharded: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """`sharded` (built over the FSDP shards) with `plain`'s state, each moment split like its weight.

    Both were built by `build_optimizer` over the same named parameters, so they number them alike.
    """
    from torch.distributed.tensor import distribute_tensor

    params = [p for group in sharded.param_groups for p in group["params"]]
    saved = plain.state_dict()
    for i in sorted(saved["state"]):  # the same order on every rank: distribute_tensor is a collective
        p, entry = params[i], saved["state"][i]
        saved["state"][i] = {k: distribute_tensor(v.to(p.device), p.device_mesh, p.placements)
                             if torch.is_tensor(v) and v.shape == p.shape else v for k, v in entry.items()}
    sharded.load_state_dict(saved)
    return sharded


def _full_tensor(value):
    from torch.distributed.tensor import DTensor

    return value.full_tensor().cpu() if isinstance(value, DTensor) else value


class _OptimizerState:
    """What `save_checkpoint` reads of an optimizer: `state_dict()`, and `state` to size it."""

    def __init__(self, saved: dict):
        self._saved = saved
        self.state = saved["state"]

    def state_dict(self) -> dict:
        return self._saved
