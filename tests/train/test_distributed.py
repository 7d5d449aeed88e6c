"""Real multi-process training: torchrun with 2 CPU processes (gloo), DDP and FSDP2, against 1 process.

    OMP_NUM_THREADS=1 python -m pytest -q tests/train/test_distributed.py

1 process x micro-batch 2 against 2 processes x micro-batch 1: each step is the same 4 sequences of
the one stream. The budgets, 1300 and 700 tokens of 64-token sequences (21 and 11 sequences), do
not divide by the 2 processes: the CLM phase's last step is one 20-token sequence (rank 1 gets
none), the decay's is 64 + 64 + 60. The decay (MLM) freezes layer 0, so DDP is rebuilt there.

Equal within the tolerances below, not bit for bit: a step's gradient is the same sum of per-token
gradients added in another order (each rank sums its micro-batches, then the all-reduce sums the
ranks; one process sums micro-batches of two sequences), and a forward over one row rounds unlike
one over two. Measured here: weights 2.4e-7 (DDP) and 6.8e-7 (FSDP) apart, losses 1e-7 relative,
gradient norms 1e-7 (DDP) and 1e-5 (FSDP sums the norm from its shards) relative.

Everything on 2 processes runs in one torchrun launch (the `launch` fixture): this file, run as a
script, first does the checks that need real ranks (`_checks`), then the plan's training runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from detour.config import load_recipe
from detour.errors import DetourError
from detour.train.loop import train
from tests.train.conftest import RECIPES, TINY

REPO = Path(__file__).resolve().parents[2]
RUN = ["phases.0.tokens=1300", "phases.1.tokens=700", "phases.1.freeze.layers=0", "checkpoint.every_tokens=512",
       "checkpoint.keep_last=20"]
TWO = ["batch.micro_batch=1"]  # per process: 2 x 1 = the single process's micro-batch of 2
WEIGHT_TOL = 5e-6
LOSS_RTOL = 1e-6
NORM_RTOL = 1e-4
SPLIT_STEPS = [256, 20, 188, 70, 130, 1, 192]  # tokens per step: full, and last steps of every shape
SYNC_STEPS = [384, 320]  # 6 and 5 sequences: 3 micro-batches a rank (rank 1 pads the second with a stand-in)


def _sets(data, *extra) -> list[str]:
    return [f"data.sources=[{data}]", *TINY, *RUN, *extra]


def _train_args(data, out, overrides, *extra) -> list[str]:
    args = ["train", str(RECIPES / "tiny-modernbert.yaml"), "--out", str(out), "--no-progress", *extra]
    for s in _sets(data, *overrides):
        args += ["--set", s]
    return args


def _crashed_copy(run: Path, dest: Path, keep_steps: int) -> Path:
    """The run folder as a kill after the checkpoint of `keep_steps` would leave it."""
    shutil.copytree(run, dest)
    shutil.rmtree(dest / "model")
    (dest / "summary.json").unlink()
    for ckpt in (dest / "checkpoints").iterdir():
        if int(ckpt.name.split("-")[1]) > keep_steps:
            shutil.rmtree(ckpt)
    return dest


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _last_state(run: Path) -> dict:
    return json.loads((sorted((run / "checkpoints").iterdir())[-1] / "state.json").read_text())


def _assert_same_run(reference: Path, run: Path) -> None:
    """The same steps, losses, gradient norms, weights, masks and stream position, within the tolerances."""
    ref, got = _metrics(reference), _metrics(run)
    assert [(m["phase"], m["global_step"], m["tokens"], m["lr"]) for m in got] == \
           [(m["phase"], m["global_step"], m["tokens"], m["lr"]) for m in ref]
    for a, b in zip(ref, got):
        assert b["stream_hash"] == a["stream_hash"], (run.name, a["global_step"])  # whatever the world size
        assert b["loss"] == pytest.approx(a["loss"], rel=LOSS_RTOL), (run.name, a["global_step"])
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=NORM_RTOL), (run.name, a["global_step"])
    for folder in ("export/clm", "model"):
        a, b = (load_file(str(r / folder / "model.safetensors")) for r in (reference, run))
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=WEIGHT_TOL, msg=f"{run.name} {folder}: {k}")
    summaries = [json.loads((r / "summary.json").read_text()) for r in (reference, run)]
    for phase in ("clm", "decay"):
        ours, theirs = (s["phases"][phase] for s in summaries)
        assert ours["tokens"] == theirs["tokens"] == ours["budget"]  # exact budgets, not multiples of 2
        assert theirs["mask_hash"] == ours["mask_hash"]  # the same positions masked
    assert summaries[1]["global_tokens"] == 2000
    assert _last_state(run)["sampler"] == _last_state(reference)["sampler"]  # the same place in the stream


@pytest.fixture(scope="module")
def single(synthetic_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("single") / "run"
    train(load_recipe(RECIPES / "tiny-modernbert.yaml", _sets(synthetic_data)), out, progress=False)
    return out


@pytest.fixture(scope="module")
def launch(synthetic_data, single, tmp_path_factory) -> dict:
    """One torchrun launch for everything on 2 processes: the rank checks of `_checks`, then a DDP
    run; FSDP continuing it from step 2 (its recipe.json has no `distributed`, as before the field
    existed); the single run resumed from step 7."""
    root = tmp_path_factory.mktemp("two")
    runs = {"ddp": root / "ddp", "fsdp": root / "fsdp", "1to2": root / "1to2"}
    plan = {"results": str(root / "checks.json"), "data": str(synthetic_data), "steps": [
        ["train", _train_args(synthetic_data, runs["ddp"], TWO)],
        ["copy", [str(runs["ddp"]), str(runs["fsdp"]), 2]],
        ["train", _train_args(synthetic_data, runs["fsdp"], [*TWO, "distributed.strategy=fsdp"], "--resume")],
        ["copy", [str(single), str(runs["1to2"]), 7]],  # in the decay, before its uneven last step
        ["train", _train_args(synthetic_data, runs["1to2"], [], "--resume")],  # 2 processes x 1 micro-batch of 2
    ]}
    (root / "plan.json").write_text(json.dumps(plan))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(Path(__file__)),
           str(root / "plan.json")]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return {**runs, "checks": json.loads((root / "checks.json").read_text()), "stderr": done.stderr}


def test_each_rank_reads_its_own_slice_of_one_stream_and_steps_are_exact(launch):
    for step in launch["checks"]["split"]:
        whole = {i: tokens for i, tokens in step["whole"]}
        seen = [i for rank in step["ranks"] for i, _ in rank]
        assert sorted(seen) == sorted(whole) and len(seen) == len(set(seen)), step["n"]  # disjoint, all of it
        first = min(whole)
        for r, rank in enumerate(step["ranks"]):
            for i, tokens in rank:
                assert tokens == whole[i] and (i - first) % 2 == r, (step["n"], r, i)  # dealt in stream order
        assert sum(len(t) for rank in step["ranks"] for _, t in rank) == step["n"]
        assert step["states"] == [step["whole_state"]] * 2  # the sampler's state is global
        assert len(set(step["micro_batches"])) == 1  # as many micro-batches on every rank
    sizes = {step["n"]: [len(rank) for rank in step["ranks"]] for step in launch["checks"]["split"]}
    assert sizes[20] == [1, 0] and sizes[188] == [2, 1] and sizes[1] == [1, 0]


def test_gradients_are_reduced_once_per_step_on_the_last_micro_batch(launch):
    for strategy in ("ddp", "fsdp"):
        steps = launch["checks"]["sync"][strategy]
        assert len(steps) == len(SYNC_STEPS)
        for reductions in steps:  # the micro-batch (1, 2, 3) during whose backward each reduction ran
            assert reductions and set(reductions) == {3}, (strategy, steps)


def test_ddp_two_processes_match_one(single, launch):
    run = launch["ddp"]
    _assert_same_run(single, run)
    assert "distributed" not in json.loads((run / "recipe.json").read_text())  # saved as before the field existed
    ckpt = sorted((run / "checkpoints").iterdir())[-1]
    files = {p.name for p in ckpt.iterdir()}
    assert {"rng-0.pt", "rng-1.pt", "model.safetensors", "optimizer.pt", "state.json"} <= files


def test_ddp_checkpoints_resume_on_one_process_and_one_process_ones_on_two(single, launch, synthetic_data, tmp_path):
    assert "resuming a checkpoint of 1 process(es) on 2" in launch["stderr"]
    # the recipe of the run resumed: 1 process x 4 micro-batches of 1
    # in the CLM phase, before its 1-sequence step
    two_to_one = _crashed_copy(launch["ddp"], tmp_path / "2to1", keep_steps=4)
    train(load_recipe(RECIPES / "tiny-modernbert.yaml", _sets(synthetic_data, *TWO)), two_to_one, resume=True,
          progress=False)
    for run in (two_to_one, launch["1to2"]):
        _assert_same_run(single, run)


def test_fsdp_continues_a_ddp_run_and_its_checkpoints_resume_on_one_process(single, launch, synthetic_data, tmp_path):
    # FSDP ran both phase ends (a rank with no sequence, the freeze), periodic checkpoints and exports
    run = launch["fsdp"]
    assert json.loads((run / "recipe.json").read_text())["distributed"] == {"strategy": "fsdp"}
    _assert_same_run(single, run)
    ours, theirs = (torch.load(r / "checkpoints" / "step-00000007" / "optimizer.pt", weights_only=True)
                    for r in (single, run))
    assert theirs["param_groups"] == ours["param_groups"] and theirs["state"].keys() == ours["state"].keys()
    for i, entry in ours["state"].items():  # full moments, not shards: the single-process format
        for k, v in entry.items():
            torch.testing.assert_close(theirs["state"][i][k], v, rtol=0, atol=WEIGHT_TOL)
    back = _crashed_copy(run, tmp_path / "fsdp-to-1", keep_steps=7)
    train(load_recipe(RECIPES / "tiny-modernbert.yaml", _sets(synthetic_data, *TWO)), back, resume=True, progress=False)
    _assert_same_run(single, back)


def test_an_unknown_strategy_is_refused_by_the_cli(synthetic_data, tmp_path, capsys):
    from detour.cli import main

    assert main(_train_args(synthetic_data, tmp_path / "run", ["distributed.strategy=zero3"])) == 2
    assert "distributed.strategy" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_fsdp_on_a_torch_without_fully_shard_is_refused_before_anything_is_built(tiny_recipe, monkeypatch):
    import torch.distributed.fsdp

    from detour.train.world import World, check_strategy

    recipe = tiny_recipe("distributed.strategy=fsdp")
    check_strategy(recipe, World(rank=0, size=2))
    monkeypatch.delattr(torch.distributed.fsdp, "fully_shard")  # as in torch < 2.6
    with pytest.raises(DetourError, match=r"distributed\.strategy: fsdp needs torch >= 2\.6"):
        check_strategy(recipe, World(rank=0, size=2))
    check_strategy(recipe, World())  # one process: no wrapper, nothing to refuse


# -- run by torchrun ------------------------------------------------------------------------


def _checks(results: Path, data: str) -> None:
    """What each rank reads of a step, and when gradients are reduced; rank 0 writes it all."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from detour.data.packing import PackedStream
    from detour.train.distributed import DataParallelism, micro_batches, rank_sequences
    from detour.train.world import World, init_world
    from detour.train.loop import train_step
    from detour.train.setup import build_model, build_optimizer

    world = init_world()
    found: dict = {"split": [], "sync": {}}
    mine = PackedStream.from_paths([(data, None)], seq_len=64, seed=42, rank=world.rank, world_size=world.size)
    whole = PackedStream.from_paths([(data, None)], seq_len=64, seed=42)
    for n in SPLIT_STEPS:
        sequences = rank_sequences(mine, n, world)
        found["split"].append({
            "n": n, "ranks": world.gather([[s.index, s.input_ids.tolist()] for s in sequences]),
            "whole": [[s.index, s.input_ids.tolist()] for s in rank_sequences(whole, n, World())],
            "states": world.gather(mine.state_dict()), "whole_state": whole.state_dict(),
            "micro_batches": world.gather(len(micro_batches(sequences, 1, n, 64, world)))})

    cpu = torch.device("cpu")
    for strategy in ("ddp", "fsdp"):
        recipe = load_recipe(RECIPES / "tiny-modernbert.yaml", [
            f"data.sources=[{data}]", *TINY, "batch.micro_batch=1", "batch.global_sequences=6",
            f"distributed.strategy={strategy}"])
        torch.manual_seed(0)
        model, tokenizer = build_model(recipe, cpu)
        parallel = DataParallelism(model, build_optimizer(model, recipe.optimizer), recipe, world, cpu)
        parallel.start_phase()
        forwards, reductions = [0], []
        parallel.computation.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
        if strategy == "ddp":
            def hook(state, bucket):
                reductions.append(forwards[0])
                return allreduce_hook(state, bucket)

            parallel.module.register_comm_hook(None, hook)
        else:
            reduce_scatter = torch.distributed.reduce_scatter_single

            def counted(*args, **kwargs):
                reductions.append(forwards[0])
                return reduce_scatter(*args, **kwargs)

            torch.distributed.reduce_scatter_single = counted
        stream = PackedStream.from_paths([(data, None)], seq_len=64, seed=42, rank=world.rank, world_size=world.size)
        found["sync"][strategy] = []
        for n in SYNC_STEPS:
            forwards[0] = 0
            train_step(parallel, parallel.optimizer, stream, recipe, recipe.phases[0], n, 1e-3, torch.Generator(),
                       tokenizer.pad_token_id, {"stream_hash": ""}, cpu, world)
            found["sync"][strategy].append(list(reductions))
            reductions.clear()
        if strategy == "fsdp":
            torch.distributed.reduce_scatter_single = reduce_scatter
    if world.main:
        results.write_text(json.dumps(found))


if __name__ == "__main__":  # torchrun ... test_distributed.py PLAN: the checks, then the plan's steps in order
    from detour.cli import main

    # Several trainings in one process, a DDP run then an FSDP one and more, as `detour twins` does
    # under torchrun: they share the process's one group (a group created again after FSDP hangs).
    plan = json.loads(Path(sys.argv[1]).read_text())
    _checks(Path(plan["results"]), plan["data"])
    for kind, args in plan["steps"]:
        if kind == "copy" and os.environ["RANK"] == "0":
            _crashed_copy(Path(args[0]), Path(args[1]), args[2])
        elif kind == "train" and main(args) != 0:
            sys.exit(1)
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()
