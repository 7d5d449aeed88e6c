"""`detour twins`: both arms see the identical token stream; exports load in stock transformers."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

from detour.cli import main as detour
from detour.train.twins import run_twins
from tests.train.conftest import RECIPES, TINY


def test_twins_same_stream_and_loadable_exports(tiny_recipe, tmp_path):
    report = run_twins(tiny_recipe(), tmp_path, progress=False)
    saved = json.loads((tmp_path / "twins.json").read_text())
    assert saved == json.loads(json.dumps(report))
    assert report["checks"] == {"tokens_equal": True, "stream_hashes_equal": True, "mlm_masks_equal": True}
    detour_arm, baseline = report["arms"]["detour"], report["arms"]["baseline"]
    # the decay is the same experiment in both arms: the same positions masked in the same tokens,
    # although the baseline's Phase 1 drew masks and the detour's did not
    assert detour_arm["phases"]["decay"]["mask_hash"] == baseline["phases"]["decay"]["mask_hash"] is not None
    # the twin's replaced phase is named for what it is, and matched with the detour's by position
    assert list(baseline["phases"]) == ["mlm30", "decay"]
    assert detour_arm["phases"]["clm"]["mask_hash"] is None and baseline["phases"]["mlm30"]["mask_hash"]
    assert report["stream_vs_detour"]["baseline"] == {"clm": "equal", "decay": "equal, same masks"}
    assert detour_arm["phases"]["clm"]["objective"] == "clm"
    assert baseline["phases"]["mlm30"]["objective"] == "mlm" and baseline["phases"]["mlm30"]["mask_rate"] == 0.30
    assert detour_arm["phases"]["clm"]["stream_hash"] == baseline["phases"]["mlm30"]["stream_hash"] != ""
    assert detour_arm["phases"]["decay"]["stream_hash"] != detour_arm["phases"]["clm"]["stream_hash"]
    for arm in ("detour", "baseline"):
        folder = tmp_path / arm / "model"
        config = json.loads((folder / "config.json").read_text())
        assert not config.get("is_decoder", False)
        model = AutoModelForMaskedLM.from_pretrained(folder)
        tok = AutoTokenizer.from_pretrained(folder)
        fill = pipeline("fill-mask", model=model, tokenizer=tok)
        assert len(fill(f"the patient was given {tok.mask_token} daily.")) == 5
        with torch.no_grad():
            assert torch.isfinite(model(**tok("a test", return_tensors="pt")).logits).all()
    assert "clm" in (tmp_path / "detour" / "model" / "README.md").read_text()
    assert "mlm30" in (tmp_path / "baseline" / "model" / "README.md").read_text()
    assert report["end_of_decay_mlm_loss"]["detour"] > 0 and report["end_of_decay_mlm_loss"]["baseline"] > 0
    assert report["synthetic_data"] is True
    assert "SYNTHETIC" in (tmp_path / "detour" / "model" / "README.md").read_text()


def test_dry_run_prints_plan(synthetic_data, capsys):
    args = ["twins", str(RECIPES / "tiny-modernbert.yaml"), "--out", "unused", "--dry-run"]
    for s in [f"data.sources=[{synthetic_data}]", *TINY]:
        args += ["--set", s]
    assert detour(args) == 0
    out = capsys.readouterr().out
    assert "MLM baseline arm" in out and "1,300" in out and "last_step_tokens" in out


def test_study_arms_freeze_branch_and_share_the_stream(tiny_recipe, tmp_path, capsys):
    """Freeze arms, a decay-length arm and a second-seed baseline, with exports along the decay."""
    from safetensors.torch import load_file

    from detour.model.freeze import frozen_parameter_names
    from detour.train.setup import build_model, select_device

    sets = ["checkpoint.export_every_tokens=256", "checkpoint.export_phases=[decay]"]
    recipe = tiny_recipe(*sets)
    args = ["twins", str(RECIPES / "tiny-modernbert.yaml"), "--out", str(tmp_path), "--no-progress",
            "--freeze", "low@clm", "--freeze", "low@decay", "--arm", "decay-short", "phases.1.tokens=512",
            "--baseline-arm", "baseline-seed2", "seed=18"]
    for s in [f"data.sources=[{recipe.data.sources[0].path}]", *TINY, *sets]:
        args += ["--set", s]
    assert detour(args) == 0
    printed = capsys.readouterr().out
    assert "layer groups: low 0, mid 1, late 2 (of 3 layers)" in printed
    assert ("checks: same token counts: yes, same token stream: yes, same MLM masks where the arms' phases "
            "match: yes") in printed and "{" not in printed  # words, not a Python dict
    assert f"branched from {tmp_path / 'detour'} after clm" in printed
    report = json.loads((tmp_path / "twins.json").read_text())
    assert list(report["arms"]) == ["detour", "baseline", "freeze-low-clm", "freeze-low-decay", "decay-short",
                                    "baseline-seed2"]
    assert report["checks"] == {"tokens_equal": True, "stream_hashes_equal": True, "mlm_masks_equal": True}
    assert report["layer_groups"] == "low 0, mid 1, late 2 (of 3 layers)"
    vs = report["stream_vs_detour"]
    for arm in ("baseline", "freeze-low-clm", "freeze-low-decay"):
        assert vs[arm] == {"clm": "equal", "decay": "equal, same masks"}, arm
    assert vs["baseline-seed2"] == {"clm": "equal", "decay": "equal"}  # another seed: other masks, by design
    assert vs["decay-short"] == {"clm": "equal", "decay": "budget differs"}
    # arms that share Phase 1 with the detour branch from its checkpoint; the others start from scratch
    arms_out = report["arms"]
    assert arms_out["freeze-low-decay"]["branch"]["parent"] == str(tmp_path / "detour")
    assert arms_out["decay-short"]["branch"]["stream_continues_parent"]["decay"]["equal"] is True
    assert "branch" not in arms_out["freeze-low-clm"] and "branch" not in arms_out["baseline-seed2"]

    # freeze low during clm: layer 0 is bit-identical to the initial weights through Phase 1
    torch.manual_seed(recipe.seed)
    initial, _ = build_model(recipe, select_device("cpu"))
    frozen = frozen_parameter_names(initial, "low", None)
    assert frozen and all(n.startswith("model.layers.0.") for n in frozen)
    after_clm = load_file(str(tmp_path / "freeze-low-clm" / "export" / "clm" / "model.safetensors"))
    detour_clm = load_file(str(tmp_path / "detour" / "export" / "clm" / "model.safetensors"))
    params = dict(initial.named_parameters())
    assert all(torch.equal(after_clm[n], params[n].detach()) for n in frozen)
    assert not all(torch.equal(detour_clm[n], params[n].detach()) for n in frozen)  # the detour moved them
    others = [n for n in after_clm if n not in frozen and n in params]
    assert any(not torch.equal(after_clm[n], params[n].detach()) for n in others)
    # freeze low during the decay: layer 0 stays as the detour left it after clm
    decayed = load_file(str(tmp_path / "freeze-low-decay" / "model" / "model.safetensors"))
    assert all(torch.equal(decayed[n], detour_clm[n]) for n in frozen)

    # exports along the decay: at 256 and 512 tokens, inside the phase's own export, stock-loadable,
    # and the same weights as the checkpoint of that step
    for arm in ("detour", "baseline"):
        phase_dir = tmp_path / arm / "export" / "decay"
        assert (phase_dir / "config.json").is_file()
        assert sorted(p.name for p in phase_dir.iterdir() if p.is_dir()) == ["256", "512"]
        AutoModelForMaskedLM.from_pretrained(phase_dir / "256")
    assert not (tmp_path / "detour" / "export" / "clm" / "256").exists()  # export_phases: decay only
    sub = load_file(str(tmp_path / "detour" / "export" / "decay" / "256" / "model.safetensors"))
    ckpt = load_file(str(tmp_path / "detour" / "checkpoints" / "step-00000007" / "model.safetensors"))
    shared = [k for k in sub if k in ckpt]
    assert len(shared) > 10 and all(torch.equal(sub[k], ckpt[k]) for k in shared)


def test_arm_errors_name_the_problem(tiny_recipe):
    from detour.errors import DetourError
    from detour.train.twins import build_arms

    recipe = tiny_recipe()
    for freezes, message in ((["low"], "expected LAYERS@PHASE"), (["low@warmup"], "no phase 'warmup'")):
        try:
            build_arms(recipe, freezes=freezes)
        except DetourError as exc:
            assert message in str(exc)
        else:
            raise AssertionError(freezes)
    try:
        build_arms(recipe, arms=[["baseline", "seed=3"]])
    except DetourError as exc:
        assert "must be new" in str(exc)
    else:
        raise AssertionError("duplicate arm name accepted")


def test_a_head_warm_up_trains_only_the_fresh_head_and_is_the_same_in_both_arms(synthetic_data, minilm, tmp_path):
    """recipes/minilm-biomed-headwarm.yaml: MiniLM ships no MLM head; its first phase trains the fresh
    one with the body frozen, an MLM phase in the detour and its twin alike (so both start Phase 1
    from the same warm head)."""
    from safetensors.torch import load_file

    from detour.config import baseline_of, load_recipe
    from detour.train.loop import train
    from detour.train.setup import build_model

    small = [f"data.sources=[{synthetic_data}]", "data.seq_len=32", "batch.global_sequences=2", "batch.micro_batch=2",
             "phases.0.tokens=128", "phases.0.lr.warmup_tokens=32", "phases.1.tokens=64",
             "phases.1.lr.warmup_tokens=32", "phases.2.tokens=64", "checkpoint.every_tokens=100k",
             "validation=null"]  # the fixture's corpus has no held-out split
    recipe = load_recipe(RECIPES / "minilm-biomed-headwarm.yaml", small)
    twin = baseline_of(recipe)
    assert [p.objective for p in recipe.phases] == ["mlm", "clm", "mlm"]
    assert twin.phases[0] == recipe.phases[0]  # the warm-up is not a CLM phase: the twin runs it unchanged
    assert twin.phases[1].objective == "mlm" and twin.phases[1].name == "mlm30"
    train(recipe, tmp_path / "run", progress=False)
    torch.manual_seed(recipe.seed)  # as training does before it builds the model: the same fresh head
    fresh = {k: v.detach().clone() for k, v in build_model(recipe, torch.device("cpu"))[0].state_dict().items()}
    warm = load_file(tmp_path / "run" / "export" / "head" / "model.safetensors")
    body = [k for k in warm if k.startswith("bert.") and k in fresh]  # the export adds the pretrained pooler
    head = [k for k in warm if k.startswith("cls.")]
    assert len(body) > 90 and head
    assert all(torch.equal(warm[k], fresh[k]) for k in body)  # frozen through the warm-up
    assert all(not torch.equal(warm[k], fresh[k]) for k in head if not k.endswith("decoder.weight"))  # trained
    after = load_file(tmp_path / "run" / "export" / "clm" / "model.safetensors")
    assert any(not torch.equal(warm[k], after[k]) for k in body)  # the body trains from Phase 1 on
