"""Transplants: which parameters a block copies, exactness of `all` and `none`, recovery and the
noise rule on hand-made numbers, inputs refused before probing, and `detour analyze transplant` end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer, BertConfig

from detour.analysis import transplant as tp
from detour.model.load import weights_hash
from detour.cli import main
from detour.errors import DetourError
from tests.conftest import tiny_modernbert_config

torch.set_num_threads(1)


def _mlm(config, seed: int):
    torch.manual_seed(seed)
    return AutoModelForMaskedLM.from_config(config).eval()


def _params(model) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters())


def _inputs(seed: int = 0, length: int = 20):
    # Longer than the tiny ModernBERT's sliding window (8), with padding in the second row.
    ids = torch.randint(999, 30000, (2, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@torch.no_grad()
def _encoder_outputs(encoder, inputs):
    encoder.config.tie_last_hidden_states = False  # keep each layer's own output as the last hidden state
    out = encoder(**inputs, output_hidden_states=True)
    return [out.last_hidden_state, *out.hidden_states]


def _max_abs_diff(xs, ys) -> float:
    assert len(xs) == len(ys)
    return max((x - y).abs().max().item() for x, y in zip(xs, ys))


@pytest.fixture(scope="module")
def tiny_pair():
    """Two tiny ModernBERTs of one architecture with different weights (A, B), 6 layers."""
    config = tiny_modernbert_config(num_hidden_layers=6)
    return _mlm(config, 1), _mlm(config, 2)


def _tokenizer(minilm):
    return AutoTokenizer.from_pretrained(minilm)


# ---- exactness of the transplanted model ----

def test_all_gives_exactly_src_encoder_outputs_and_none_exactly_dst(tiny_pair, minilm, tmp_path):
    a, b = tiny_pair
    before_a, before_b = {n: p.clone() for n, p in _params(a).items()}, {n: p.clone() for n, p in _params(b).items()}
    inputs = _inputs()
    out_a, out_b = _encoder_outputs(a.base_model, inputs), _encoder_outputs(b.base_model, inputs)
    assert _max_abs_diff(out_a, out_b) > 0.1  # the two models really differ

    everything = tp.transplant(a, b, tp.block_names(b, "all"))
    assert _max_abs_diff(_encoder_outputs(everything.base_model, inputs), out_a) == 0.0
    nothing = tp.transplant(a, b, tp.block_names(b, "none"))
    assert _max_abs_diff(_encoder_outputs(nothing.base_model, inputs), out_b) == 0.0
    # the head is never transplanted, and the inputs are left as they were
    assert torch.equal(everything.head.dense.weight, b.head.dense.weight)
    assert all(torch.equal(p, before_a[n]) for n, p in _params(a).items())
    assert all(torch.equal(p, before_b[n]) for n, p in _params(b).items())

    # what the probe reads: the saved encoder body, loaded back with AutoModel
    tp._save_encoder(everything, _tokenizer(minilm), tmp_path / "all", {"block": "all"})
    reloaded = AutoModel.from_pretrained(tmp_path / "all").eval()
    assert _max_abs_diff(_encoder_outputs(reloaded, inputs), out_a) == 0.0
    assert (tmp_path / "all" / tp.MARKER).is_file()


def test_all_ignores_a_freshly_initialised_head(minilm):
    """MiniLM has no MLM head: each load draws a fresh one, which must not leak into the encoder."""
    from detour.model.load import load_mlm_model

    a, _ = load_mlm_model(minilm, seed=1)
    b, _ = load_mlm_model(minilm, seed=2)
    with torch.no_grad():
        a.bert.embeddings.word_embeddings.weight.mul_(0.5)
        a.bert.encoder.layer[3].intermediate.dense.weight.add_(0.01)
    assert not torch.equal(a.cls.predictions.transform.dense.weight, b.cls.predictions.transform.dense.weight)
    inputs = _inputs(length=12)
    out_a = _encoder_outputs(a.base_model.eval(), inputs)
    moved = tp.transplant(a, b, tp.block_names(b, "all")).eval()
    assert _max_abs_diff(_encoder_outputs(moved.base_model, inputs), out_a) == 0.0
    assert torch.equal(moved.cls.predictions.transform.dense.weight, b.cls.predictions.transform.dense.weight)


# ---- which parameters a block names ----

def test_low_copies_exactly_the_low_layers(tiny_pair):
    a, b = tiny_pair  # 6 layers: low = 0-1
    names = tp.block_names(b, "low")
    assert names == {n for n in _params(b) if n.startswith(("model.layers.0.", "model.layers.1."))}
    moved = _params(tp.transplant(a, b, names))
    pa, pb = _params(a), _params(b)
    for name, param in moved.items():
        assert torch.equal(param, pa[name] if name in names else pb[name]), name
    assert tp.block_names(b, "0-1") == names
    assert tp.block_names(b, "late") == {n for n in pb if n.startswith(("model.layers.4.", "model.layers.5."))}


def test_components_use_the_freezing_table():
    bert = AutoModelForMaskedLM.from_config(BertConfig(
        vocab_size=120, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=24))
    attention = tp.block_names(bert, "attention")
    assert attention == {f"bert.encoder.layer.{i}.attention.{p}.{w}" for i in range(3)
                         for p in ("self.query", "self.key", "self.value", "output.dense") for w in ("weight", "bias")}
    assert tp.block_names(bert, "low:attention") == {n for n in attention if ".layer.0." in n}
    mlp = tp.block_names(bert, "mlp")
    assert mlp == {f"bert.encoder.layer.{i}.{p}.dense.{w}" for i in range(3)
                   for p in ("intermediate", "output") for w in ("weight", "bias")}
    assert tp.block_names(bert, "embeddings") == {n for n in _params(bert) if n.startswith("bert.embeddings.")}
    everything = tp.block_names(bert, "all")
    assert everything == {n for n in _params(bert) if n.startswith("bert.")}  # the head (cls.*) never
    assert tp.block_names(bert, "none") == set()


def test_modernbert_attention_block(tiny_pair):
    _, b = tiny_pair
    assert tp.block_names(b, "attention") == {f"model.layers.{i}.attn.{w}.weight" for i in range(6) for w in ("Wqkv", "Wo")}
    assert tp.block_names(b, "norm") >= {"model.final_norm.weight", "model.layers.3.mlp_norm.weight"}


@pytest.mark.parametrize("block,message", [
    ("middle", "'middle' is not a block"), ("low:ffn", "'ffn' is not a component"), ("0-6", "out of range"),
    (":attention", "nothing before the colon"), ("low:embeddings", "selects no parameter"),
    ("head", "'head' is not a block"),
])
def test_unknown_blocks_are_refused(tiny_pair, block, message):
    _, b = tiny_pair
    with pytest.raises(DetourError, match=message):
        tp.block_names(b, block)


# ---- recovery and the noise rule, on hand-made numbers ----

def test_recovery_pairs_seeds_then_averages():
    a, b, t = [0.60, 0.62, 0.64], [0.50, 0.52, 0.50], [0.55, 0.52, 0.64]
    r = tp.recovery(a, b, t)  # per seed 0.05/0.10, 0/0.10, 0.14/0.14
    assert r["recovery_per_seed"] == pytest.approx([0.5, 0.0, 1.0], abs=1e-12)
    assert r["recovery_mean"] == pytest.approx(0.5, abs=1e-12)
    assert r["recovery_std"] == pytest.approx(0.5, abs=1e-12)  # sample std of 0.5, 0, 1
    assert r["recovery_of_means"] == pytest.approx((0.57 - 1.52 / 3) / (0.62 - 1.52 / 3), abs=1e-12)
    # a negative gap (A worse than B) still maps B to 0 and A to 1
    assert tp.recovery([0.4], [0.6], [0.45])["recovery_per_seed"] == pytest.approx([0.75])
    # a seed without a gap has no recovery; the others still count
    r = tp.recovery([0.6, 0.5], [0.5, 0.5], [0.6, 0.9])
    assert r["recovery_per_seed"] == [1.0, None] and r["recovery_mean"] == 1.0 and r["recovery_std"] == 0.0
    assert tp.recovery([0.5], [0.5], [0.7])["recovery_mean"] is None


def test_gap_within_noise_rule():
    noisy = tp.gap_noise([0.60, 0.64, 0.56], [0.55, 0.57, 0.53])  # gap 0.05, stds 0.04 and 0.02
    assert noisy["gap"] == pytest.approx(0.05) and noisy["pooled_std"] == pytest.approx(math.sqrt(0.001))
    assert noisy["threshold"] == pytest.approx(2 * math.sqrt(0.001)) and noisy["gap_within_noise"]
    clear = tp.gap_noise([0.60, 0.61, 0.62], [0.50, 0.51, 0.52])
    assert not clear["gap_within_noise"] and clear["threshold"] == pytest.approx(0.02)
    # one seed: no spread, so only the absolute floor applies
    assert tp.gap_noise([0.503], [0.500])["gap_within_noise"]
    assert not tp.gap_noise([0.503], [0.500], min_gap=0.001)["gap_within_noise"]
    assert tp.gap_noise([0.497], [0.500])["gap_within_noise"]  # |gap|, whichever model is better


# ---- the command ----

def _tiny_task(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = ["id\tbody\tcategory"] + [f"{i}\t{'fever and cough' if i % 2 else 'broken arm'}\t"
                                     f"{'infection' if i % 2 else 'trauma'}" for i in range(24)]
    (data / "cls.tsv").write_text("\n".join(rows) + "\n")
    spec = tmp_path / "cls.yaml"
    spec.write_text("name: tiny-cls\ntype: classification\nformat: tsv\ndata: {train: cls.tsv, test: cls.tsv}\n"
                    "options: {text_column: body, label_column: category}\nmax_length: 16\n"
                    "training: {epochs: 1, batch_size: 8}\n")
    return ["--task-spec", str(spec), "--data-root", str(data)]


def _save(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_end_to_end_on_minilm_with_a_damaged_copy(minilm, tmp_path, capsys):
    """A = MiniLM with its embeddings zeroed (so A != B only there), B = MiniLM: copying the embeddings
    recovers exactly all of the gap, copying low layers exactly none, `all` is A and `none` is B."""
    encoder = AutoModel.from_pretrained(minilm)
    with torch.no_grad():
        for name, param in encoder.embeddings.named_parameters():
            if "LayerNorm" not in name:
                param.zero_()  # every token looks the same: the probe can only guess one class
    src = _save(encoder, _tokenizer(minilm), tmp_path / "damaged")
    out = tmp_path / "out"
    rc = main(["analyze", "transplant", "--src", src, "--dst", "minilm-l6", *_tiny_task(tmp_path),
               "--blocks", "low", "embeddings", "all", "none", "--seeds", "2", "--lr", "1e-2", "--out", str(out)])
    assert rc == 0
    data = json.loads((out / "transplant.json").read_text())
    assert data["schema"] == "detour.transplant/1" and (out / "transplant.png").stat().st_size > 0
    cfg = data["config"]
    assert cfg["src"] == {"model": src, "path": src, "weights_hash": weights_hash(src)}
    assert cfg["dst"]["model"] == "minilm-l6" and cfg["dst"]["weights_hash"] == weights_hash(str(minilm))
    assert cfg["seeds"] == [0, 1] and cfg["tasks"] == ["tiny-cls"] and cfg["probe"]["lr"] == 0.01

    sizes = {row["block"]: row for row in data["blocks"]}
    n_embeddings = sum(p.numel() for p in encoder.embeddings.parameters())
    assert sizes["embeddings"]["parameters"] == n_embeddings and sizes["embeddings"]["tensors"] == 5
    assert sizes["all"]["parameters"] == data["encoder_parameters"] == sum(
        p.numel() for n, p in encoder.named_parameters() if not n.startswith("pooler."))
    assert sizes["none"]["parameters"] == 0 and sizes["low"]["layers"] == [0, 1]

    (task,) = data["tasks"]
    f1_a, f1_b = task["src"]["f1_per_seed"], task["dst"]["f1_per_seed"]
    assert all(x < y for x, y in zip(f1_a, f1_b)) and not task["gap_within_noise"]
    blocks = task["blocks"]
    assert blocks["all"]["f1_per_seed"] == f1_a and blocks["none"]["f1_per_seed"] == f1_b
    assert blocks["embeddings"]["recovery_per_seed"] == [1.0, 1.0]
    assert blocks["low"]["recovery_per_seed"] == [0.0, 0.0] and blocks["none"]["recovery_mean"] == 0.0
    assert data["average"]["blocks"]["embeddings"]["recovery_mean"] == 1.0
    assert not (out / "models").exists()  # written for the probe, removed once probed
    assert "-0.0" not in (out / "transplant.json").read_text()  # a zero recovery over a negative gap reads 0.0

    printed = capsys.readouterr().out
    assert "embeddings" in printed and "recovery" in printed and "WARNING" not in printed


def _fake_probe(scores, calls):
    """Stands in for fine-tuning: F1 by model folder name and seed, from a hand-made table."""
    def finetune(model_name, prep, seed, linear_probe=False, device=None, on_step=None):
        assert linear_probe
        calls.append((model_name, seed))
        return {"metrics": {prep.spec.headline: scores[Path(model_name).name][seed]}, "selected_epoch": 1}
    return finetune


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory, minilm):
    root = tmp_path_factory.mktemp("tiny")
    tok = _tokenizer(minilm)
    config = tiny_modernbert_config()
    folders = {"a": _save(_mlm(config, 1), tok, root / "a"), "b": _save(_mlm(config, 2), tok, root / "b"),
               "deeper": _save(_mlm(tiny_modernbert_config(num_hidden_layers=4), 3), tok, root / "deeper"),
               "narrower": _save(_mlm(tiny_modernbert_config(hidden_size=32, intermediate_size=48), 4), tok,
                                 root / "narrower")}
    other_tok = _tokenizer(minilm)
    other_tok.add_tokens(["zzzunseentoken"])
    folders["other_tok"] = _save(_mlm(config, 5), other_tok, root / "other_tok")
    return folders


def test_noise_warning_and_recovery_through_the_command(tiny_folders, tmp_path, monkeypatch, capsys):
    from detour.eval import finetune as ft

    scores = {"A": [0.60, 0.64, 0.56], "B": [0.55, 0.57, 0.53], "low": [0.575, 0.57, 0.56], "late_attention": [0.55] * 3}
    calls = []
    monkeypatch.setattr(ft, "finetune", _fake_probe(scores, calls))
    out = tmp_path / "out"
    task = _tiny_task(tmp_path)
    second = tmp_path / "second.yaml"
    second.write_text(Path(task[1]).read_text().replace("name: tiny-cls", "name: tiny-cls-2"))
    argv = ["analyze", "transplant", "--src", tiny_folders["a"], "--dst", tiny_folders["b"], *task,
            "--task-spec", str(second), "--blocks", "low", "late:attention", "--seeds", "3", "--keep-models",
            "--out", str(out)]
    assert main(argv) == 0
    assert len(calls) == 4 * 2 * 3  # (A, B, two blocks) x two tasks x three seeds
    data = json.loads((out / "transplant.json").read_text())
    task, task_2 = data["tasks"]
    assert task_2["task"] == "tiny-cls-2" and task_2["blocks"] == task["blocks"]
    average = data["average"]["blocks"]["low"]
    assert average["recovery_per_seed"] == pytest.approx([0.5, 0.0, 1.0]) and average["recovery_mean"] == pytest.approx(0.5)
    low = task["blocks"]["low"]
    assert low["recovery_per_seed"] == pytest.approx([0.5, 0.0, 1.0]) and low["recovery_std"] == pytest.approx(0.5)
    assert low["f1_mean"] == pytest.approx(sum(scores["low"]) / 3)
    assert task["gap_within_noise"] and data["average"]["tasks_within_noise"] == ["tiny-cls", "tiny-cls-2"]
    printed = capsys.readouterr().out
    assert "WARNING: task tiny-cls:" in printed and "meaningless" in printed and "average over tasks" in printed
    # kept models are the exact encoders probed, marked as ours; a rerun may replace them
    kept = out / "models" / "late_attention"
    assert (kept / tp.MARKER).is_file() and (out / "models" / "A" / "model.safetensors").is_file()
    assert {row["block"]: row["folder"] for row in data["blocks"]}["late:attention"] == str(kept)
    assert data["blocks"][1]["tensors"] == 2  # layer 2's Wqkv and Wo
    assert main(argv) == 0


def _refused(argv, capsys, monkeypatch, out):
    from detour.eval import finetune as ft

    def never(*a, **k):
        raise AssertionError("probing started before the inputs were checked")

    monkeypatch.setattr(ft, "finetune", never)
    try:
        rc = main(argv)
    except SystemExit as parse_error:  # a flag's own rule is checked while the command line is read
        rc = parse_error.code
    assert rc == 2
    assert not (out / "transplant.json").exists() and not (out / "models").exists()
    return capsys.readouterr().err


@pytest.mark.parametrize("src,dst,extra,message", [
    ("a", "deeper", [], ["layer counts differ", "/a has 3", "/deeper has 4"]),
    ("a", "narrower", [], ["configs of src", "/a and dst", "/narrower differ", "hidden_size"]),
    ("a", "other_tok", [], ["tokenizers differ", "/a", "/other_tok"]),
    ("minilm", "six_layers", [], ["architectures differ", "is bert", "/six_layers is modernbert"]),
    ("a", "b", ["--blocks", "low", "middle"], ["--blocks 'middle' is not a block"]),
    ("a", "b", ["--blocks", "low", "low"], ["low given twice"]),
    ("a", "b", ["--seeds", "0"], ["argument --seeds: must be at least 1"]),
    ("a", "b", ["--lr", "-1"], ["argument --lr: must be greater than 0", "training.lr in a task spec"]),
])
def test_bad_inputs_refused_before_any_probing(tiny_folders, minilm, tmp_path, capsys, monkeypatch,
                                                src, dst, extra, message):
    folders = {**tiny_folders, "minilm": str(minilm)}
    out = tmp_path / "out"
    if dst == "six_layers":  # MiniLM's depth, so the architecture check is what refuses it
        folders[dst] = _save(_mlm(tiny_modernbert_config(num_hidden_layers=6), 0), _tokenizer(minilm), tmp_path / dst)
    argv = ["analyze", "transplant", "--src", folders[src], "--dst", folders[dst], *_tiny_task(tmp_path),
            *extra, "--out", str(out)]
    err = _refused(argv, capsys, monkeypatch, out)
    for part in message:
        assert part in err


def test_a_folder_not_written_by_the_analysis_is_never_replaced(tiny_folders, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    (out / "models" / "low").mkdir(parents=True)
    (out / "models" / "low" / "notes.txt").write_text("mine")
    argv = ["analyze", "transplant", "--src", tiny_folders["a"], "--dst", tiny_folders["b"], *_tiny_task(tmp_path),
            "--out", str(out)]
    from detour.eval import finetune as ft

    monkeypatch.setattr(ft, "finetune", lambda *a, **k: pytest.fail("probing started"))
    assert main(argv) == 2
    assert "was not written by detour analyze transplant" in capsys.readouterr().err
    assert (out / "models" / "low" / "notes.txt").read_text() == "mine"


def test_help_lists_transplant(capsys):
    with pytest.raises(SystemExit):
        main(["analyze", "transplant", "--help"])
    printed = capsys.readouterr().out
    assert "--blocks" in printed and "--keep-models" in printed and "recover" in printed
