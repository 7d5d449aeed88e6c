"""bench/bench_gpu.py and bench/gpu.sh without a CUDA device: what can be checked before a GPU run.

Exit 2 and say why, before building anything; the arguments; the MFU arithmetic; the training
check's recipe passes detour's own validation; and its whole code path, run on the CPU at a tiny
shape, so that a GPU run does not find its first bug in the part that needs a GPU least.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def bench_gpu():
    sys.path.insert(0, str(REPO / "bench"))  # bench_gpu imports its siblings as top-level modules
    try:
        yield importlib.import_module("bench_gpu")
    finally:
        sys.path.remove(str(REPO / "bench"))


def no_gpu_env() -> dict:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU even on a machine that has one


def test_gpu_benchmark_without_cuda_exits_2_with_a_clear_message():
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--quick"], cwd=REPO,
                          env=no_gpu_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "no CUDA device" in proc.stderr and "bench/bench_train.py" in proc.stderr
    assert proc.stdout == ""


def test_gpu_sh_prints_the_versions_then_exits_2_without_cuda(tmp_path):
    # the versions step's 30 s are for a GPU node; importing torch on 2 loaded cores can take longer
    env = {**no_gpu_env(), "PYTHON": sys.executable, "OUT": str(tmp_path), "LIMIT_VERSIONS": "200"}
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu.sh"), "--quick"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    import torch
    import transformers

    assert f"torch {torch.__version__}" in proc.stdout and f"transformers {transformers.__version__}" in proc.stdout
    assert "gpu: none" in proc.stdout
    assert "no CUDA device" in proc.stderr
    assert "== 2/" not in proc.stdout  # nothing ran past the device check
    versions = (tmp_path / "versions.txt").read_text().splitlines()  # $OUT is the output folder
    assert [line for line in versions if line.startswith("torch ")] == [f"torch {torch.__version__}"]


def test_arguments_defaults_quick_and_parts(bench_gpu):
    args = bench_gpu.parse_args([])
    assert (args.seq_len, args.train_seq_len, args.train_steps) == (8192, 8192, 200)
    assert args.parts == ["attention", "train"]
    assert (args.warmup, args.rounds, args.steps_per_round) == (3, 4, 4)
    quick = bench_gpu.parse_args(["--quick", "--parts", "train,attention"])
    assert (quick.warmup, quick.rounds, quick.steps_per_round, quick.train_steps) == (1, 2, 1, 20)
    assert (args.train_docs, quick.train_docs) == (2000, 500)
    assert quick.parts == ["attention", "train"]  # always in this order
    assert bench_gpu.parse_args(["--quick", "--train-steps", "50"]).train_steps == 50
    for bad in (["--parts", "kernels"], ["--train-steps", "1"]):
        with pytest.raises(SystemExit):
            bench_gpu.parse_args(bad)


def test_mfu_follows_the_printed_formula(bench_gpu):
    shape = {"body_non_embedding_params": 100, "layers": 2, "hidden": 4, "vocab": 10}
    # T*(6*N_body + 12*L*d*S) + R*6*(d^2 + d*V) with T=8, S=4, R=3
    flops = 8 * (6 * 100 + 12 * 2 * 4 * 4) + 3 * 6 * (4 * 4 + 4 * 10)
    assert bench_gpu.step_flops(shape, 8, 4, 3) == flops == 8880
    assert bench_gpu.mfu(flops, 2.0, 8880.0) == pytest.approx(0.5)
    # per token: CLM's head on every row, MLM's on 30% of them
    assert bench_gpu.train_flops_per_token(shape, 4, "clm") == bench_gpu.step_flops(shape, 4, 4, 4) / 4
    assert bench_gpu.train_flops_per_token(shape, 10, "mlm") == bench_gpu.step_flops(shape, 10, 10, 3) / 10


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory, tokenizer_dir):
    from detour.cli import main as detour

    out = tmp_path_factory.mktemp("bench-gpu") / "data"
    assert detour(["prepare", "synthetic:clinical?docs=30&seed=0", "--tokenizer", str(tokenizer_dir), "--out",
                   str(out), "--workers", "1"]) == 0
    return out


@pytest.mark.parametrize("strategy", [None, "fsdp"])
def test_training_recipe_passes_detours_validation(bench_gpu, tiny_corpus, tokenizer_dir, tmp_path, capsys, strategy):
    import yaml

    from detour.cli import main as detour
    from detour.config import load_recipe

    recipe = bench_gpu.train_recipe(tiny_corpus, str(tokenizer_dir), 200, 8192, 4, 2, "cuda", strategy)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert detour(["train", str(path), "--out", str(tmp_path / "run"), "--dry-run"]) == 0
    assert "varlen" in capsys.readouterr().out
    loaded = load_recipe(path)
    assert sum(p.tokens for p in loaded.phases) == 200 * 4 * 8192  # 200 steps, no partial one
    assert [p.objective for p in loaded.phases] == ["clm", "mlm"] and loaded.phases[1].mask_rate == 0.30
    assert loaded.model.config["num_hidden_layers"] == 22 and loaded.model.config["hidden_size"] == 768
    assert loaded.distributed.strategy == (strategy or "ddp")


def test_training_check_runs_the_engine_on_the_cpu(bench_gpu, tiny_corpus, tokenizer_dir, tmp_path):
    """The whole part `train` (prepare, recipe, `detour train`, metrics, summary) at a tiny shape."""
    args = argparse.Namespace(tokenizer=str(tokenizer_dir), train_procs=None, work=str(tmp_path), train_docs=30,
                              train_steps=8, train_seq_len=64, train_global_sequences=2, train_micro_batch=1,
                              strategy="fsdp")
    tiny = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                global_attn_every_n_layers=3, local_attention=16, max_position_embeddings=128)
    result = bench_gpu.run_train(args, "cpu", architecture=tiny)
    assert result["processes"] == 1 and result["exit_code"] == 0
    assert {k: v for k, v in result["checks"].items() if k != "clm_loss_fell"} == {
        "exit_0": True, "exports_written": True, "both_phases_ran": True, "losses_finite": True}
    assert isinstance(result["checks"]["clm_loss_fell"], bool)
    clm, decay = result["phases"]["clm"], result["phases"]["decay"]
    assert (clm["steps"], decay["steps"]) == (6, 2) and (clm["tokens"], decay["tokens"]) == (6 * 128, 2 * 128)
    assert clm["tokens_per_s"]["median"] > 0 and clm["mfu"] is None  # no matmul probe on the CPU
    assert decay["flops_per_token"] < clm["flops_per_token"]  # the MLM head runs on 30% of the rows
    assert result["shape"]["layers"] == 3 and result["shape"]["vocab"] == 30522
    assert result["recipe"]["model"]["attn_implementation"] == "varlen"
