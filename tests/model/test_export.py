"""Export: a stock `AutoModelForMaskedLM` folder equal to the trained model, with a Hub model card; atomic."""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml
from huggingface_hub import ModelCard
from transformers import AutoModelForMaskedLM, pipeline

from detour.cli import main as detour
from detour.config import baseline_of, load_recipe, recipe_to_dict
from detour.errors import DetourError
from detour.model.doctor import packed_batch
from detour.model.card import card_license, check_card, hub_id_of
from detour.model.export import export_hf
from detour.model.load import config_special_ids, load_mlm_model, tiny_modernbert_config
from detour.model.objectives import clm_loss
from tests.train.conftest import RECIPES, TINY

CARD = {
    "base_model": "answerdotai/ModernBERT-base",
    "recipe": {"seed": 17, "phases": [{"name": "clm", "tokens": "10B"}]},
    "phases": [{"name": "clm", "objective": "clm", "tokens": 1000, "final_loss": 2.5},
               {"name": "decay", "objective": "mlm", "mask_rate": 0.15, "tokens": 100, "final_loss": 3.25}],
    "data": [{"path": "data/en-biomed", "weight": 1.0, "documents": 12}],
    "notes": "test export",
}


def train_a_little(model, steps=2):
    """A few real CLM steps, so the export carries trained (not initial) weights."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = packed_batch([[20, 12]], 32, model.config.vocab_size, config_special_ids(model.config),
                         model.config.pad_token_id)
    model.train()
    for _ in range(steps):
        clm_loss(model, batch).loss_sum.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


@pytest.mark.parametrize("kind,attn", [("modernbert", "sdpa"), ("bert", "eager")])
def test_export_reloads_in_stock_transformers_with_equal_outputs(minilm, tmp_path, kind, attn):
    if kind == "modernbert":
        model, tok = load_mlm_model(config=tiny_modernbert_config(), tokenizer=minilm, attn_implementation=attn, seed=0)
    else:
        model, tok = load_mlm_model(minilm, attn_implementation=attn, seed=0)
    before = model.get_input_embeddings().weight.detach().clone()
    train_a_little(model)
    assert not torch.equal(before, model.get_input_embeddings().weight)
    out = export_hf(model, tok, tmp_path / "final", CARD)
    assert out == tmp_path / "final"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # no temp folders left
    config = json.loads((out / "config.json").read_text())
    assert config["is_decoder"] is False and config["architectures"][0].endswith("ForMaskedLM")
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    card = (out / "README.md").read_text()
    assert "base_model: answerdotai/ModernBERT-base" in card and "| decay | mlm | 0.15 | 100 |" in card
    assert "3.2500" in card and "data/en-biomed" in card

    reloaded = AutoModelForMaskedLM.from_pretrained(out, attn_implementation=attn).eval()
    ids = tok(["the patient was given aspirin .", "a short one"], return_tensors="pt", padding=True)
    with torch.no_grad():
        ours = model(**ids).logits
        theirs = reloaded(**ids).logits
    assert (ours - theirs).abs().max().item() <= 1e-6
    fill = pipeline("fill-mask", model=str(out), device="cpu")
    predictions = fill("the patient was given [MASK] .")
    assert len(predictions) == 5 and all("token_str" in p for p in predictions)


def test_export_replaces_an_older_export_and_keeps_the_model_config(minilm, tmp_path):
    model, tok = load_mlm_model(config=tiny_modernbert_config(), tokenizer=minilm, seed=0)
    target = tmp_path / "model"
    export_hf(model, tok, target, {"base_model": "/abs/path", "phases": []})
    (target / "stale.txt").write_text("from the older export")
    model.config.is_decoder = True  # even if something set it during training, it is never exported
    export_hf(model, tok, target, CARD)
    assert not (target / "stale.txt").exists()
    assert json.loads((target / "config.json").read_text())["is_decoder"] is False
    assert model.config.is_decoder is True  # the live model's config is left as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_bert_export_keeps_the_pretrained_pooler_for_classification(minilm, tmp_path):
    """Loading an export for classification reports only the new classifier as missing."""
    import subprocess
    import sys

    from safetensors import safe_open

    model, tok = load_mlm_model(minilm)
    assert set(model.extra_export_weights) == {"bert.pooler.dense.weight", "bert.pooler.dense.bias"}
    out = export_hf(model, tok, tmp_path / "export", CARD)
    with safe_open(str(minilm / "model.safetensors"), "pt") as base, \
            safe_open(str(out / "model.safetensors"), "pt") as saved:
        assert torch.equal(saved.get_tensor("bert.pooler.dense.weight"), base.get_tensor("pooler.dense.weight"))
    # a clean interpreter with stock transformers, as a user would load it
    code = (
        "import sys, json\n"
        "from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification, "
        "AutoModelForTokenClassification\n"
        "report = {}\n"
        "for cls in (AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification, "
        "AutoModelForTokenClassification):\n"
        "    _, info = cls.from_pretrained(sys.argv[1], output_loading_info=True)\n"
        "    report[cls.__name__] = sorted(info['missing_keys'])\n"
        "print(json.dumps(report))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, check=True)
    missing = json.loads(done.stdout.strip().splitlines()[-1])
    assert missing["AutoModel"] == [] and missing["AutoModelForMaskedLM"] == []
    assert missing["AutoModelForSequenceClassification"] == ["classifier.bias", "classifier.weight"]
    assert missing["AutoModelForTokenClassification"] == ["classifier.bias", "classifier.weight"]


def test_the_exported_tokenizer_config_matches_the_model(minilm, tmp_path):
    from transformers import AutoTokenizer

    model, tok = load_mlm_model(None, config={**tiny_modernbert_config(), "max_position_embeddings": 1024},
                                tokenizer=minilm)  # more positions than the tokenizer's 512
    out = export_hf(model, tok, tmp_path / "export", CARD)
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert saved["model_max_length"] == model.config.max_position_embeddings == 1024
    assert not {"is_local", "local_files_only", "max_length"} & set(saved)
    assert AutoTokenizer.from_pretrained(out).model_max_length == 1024


# -- model cards -------------------------------------------------------------------------------

MIDPHASE = ["checkpoint.export_every_tokens=[512]", "checkpoint.export_phases=[clm]"]
CARD_FIELDS = ["card.language=en", "card.datasets=[bigbio/e3c]", "card.tags=[biomedical]"]


@pytest.fixture(scope="module")
def synthetic(minilm, tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "synthetic"
    assert detour(["prepare", "synthetic:clinical?docs=40&seed=0", "--tokenizer", str(minilm), "--out", str(out),
                   "--workers", "1"]) == 0
    return out


@pytest.fixture(scope="module")
def real_text(minilm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("real")
    (folder / "notes.txt").write_text("the patient was given aspirin daily.\nno fever was reported.\n", encoding="utf-8")
    assert detour(["prepare", str(folder / "notes.txt"), "--tokenizer", str(minilm), "--out", str(folder / "data"),
                   "--workers", "1"]) == 0
    return folder / "data"


@pytest.fixture(scope="module")
def arms(synthetic, tmp_path_factory):
    """The tiny recipe's detour and its baseline_of twin, trained, with an export during phase clm."""
    from detour.train.loop import train

    recipe = load_recipe(RECIPES / "tiny-modernbert.yaml", [f"data.sources=[{synthetic}]", *TINY, *MIDPHASE,
                                                            *CARD_FIELDS])
    out = tmp_path_factory.mktemp("arms")
    runs = {}
    for name, arm in (("detour", recipe), ("baseline", baseline_of(recipe))):
        train(arm, out / name, progress=False)
        runs[name] = (arm, out / name)
    return runs


def load_card(folder):
    card = ModelCard.load(folder / "README.md")
    recipe = yaml.safe_load(card.text.split("```yaml\n", 1)[1].split("```", 1)[0])
    return card, recipe


def table_row(card, phase: str) -> list[str]:
    for line in card.text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and cells[0].split(" (")[0] == phase:
            return cells
    raise AssertionError(f"no table row for phase {phase}")


def test_the_detour_arms_card_states_its_recipe_phases_and_data(arms, synthetic):
    recipe, run = arms["detour"]
    card, in_card = load_card(run / "model")
    assert card.data.license == "other"  # synthetic text only and no card.license: an engine test
    assert card.data.base_model is None  # built from model.config: no hub model to name
    assert card.data.language == ["en"] and card.data.datasets == ["bigbio/e3c"]
    assert card.data.pipeline_tag == "fill-mask" and card.data.library_name == "transformers"
    # built from a config, it continued nothing: tagged as pretrained from scratch
    assert card.data.tags == ["detour", "pretraining-from-scratch", "clm-detour", "synthetic-data", "biomedical"]
    assert card.text.splitlines()[1] == "# tiny-modernbert: CLM detour"
    assert "The run's final model: it has had phase clm (CLM), then phase decay (MLM at 15% masking)." in card.text
    summary = json.loads((run / "summary.json").read_text())["phases"]
    for phase in recipe.phases:
        done = summary[phase.name]
        assert table_row(card, phase.name) == [
            phase.name, phase.objective, "-" if phase.mask_rate is None else str(phase.mask_rate),
            f"{phase.tokens:,}", f"{done['tokens']:,}", f"{done['final_loss']:.4f}"]
    assert in_card == recipe_to_dict(recipe) == json.loads((run / "recipe.json").read_text())
    manifest = json.loads((synthetic / "manifest.json").read_text())
    assert f"`{synthetic}`: {manifest['documents']:,} documents, {manifest['tokens']:,} tokens" in card.text
    assert "**SYNTHETIC DATA.**" in card.text and "none chosen: the run trains on SYNTHETIC text only" in card.text
    assert "not meant for use" not in card.text


def test_exports_taken_at_or_during_a_phase_say_what_they_have_not_had(arms):
    _, run = arms["detour"]
    during, _ = load_card(run / "export" / "clm" / "512")
    assert during.text.splitlines()[1] == "# tiny-modernbert: CLM detour, phase clm at 512 of 1,300 tokens"
    assert ("Taken during phase clm (CLM), after 512 of its 1,300 tokens. It has not had the rest of phase clm, "
            "nor phase decay (MLM at 15% masking).") in during.text
    assert "not meant for use as a masked LM" in during.text
    assert table_row(during, "clm")[3:5] == ["1,300", "512"] and table_row(during, "decay")[3:] == ["700", "0", "-"]
    end_clm, _ = load_card(run / "export" / "clm")
    assert "Taken at the end of phase clm (CLM). It has not had phase decay (MLM at 15% masking) yet." in end_clm.text
    assert "not meant for use as a masked LM" in end_clm.text
    end_decay, _ = load_card(run / "export" / "decay")
    assert "That is the last phase: the same weights as the run's final model." in end_decay.text
    assert "not meant for use" not in end_decay.text and "An intermediate model" not in end_decay.text


def test_the_baseline_arms_card_never_claims_a_clm_phase(arms):
    recipe, run = arms["baseline"]
    assert recipe.phases[0].name == "mlm30" and recipe.phases[0].objective == "mlm"  # named for what it is
    stand_in = "mlm30 (MLM at 30% masking, matched with the detour's phase of the same budget)"
    for folder in (run / "model", run / "export" / "mlm30", run / "export" / "mlm30" / "512"):
        card, in_card = load_card(folder)
        assert "mlm-baseline" in card.data.tags and "clm-detour" not in card.data.tags, folder
        assert card.text.splitlines()[1].startswith("# tiny-modernbert: MLM baseline"), folder
        assert "CLM" not in card.text and "causal" not in card.text and not re.search(r"\bclm\b", card.text), folder
        assert f"phase {stand_in}" in card.text
        assert [table_row(card, p.name)[1] for p in recipe.phases] == ["mlm", "mlm"]
        assert table_row(card, "mlm30")[:3] == [stand_in, "mlm", "0.3"]
        assert in_card == recipe_to_dict(recipe)
    card, _ = load_card(run / "export" / "mlm30")
    assert (f"Taken at the end of phase {stand_in}. It has not had "
            "phase decay (MLM at 15% masking) yet.") in card.text


def test_a_pretrained_base_gives_its_hub_id_and_its_license(minilm, real_text, tmp_path):
    from detour.train.loop import _export, fresh_state

    recipe = load_recipe(RECIPES / "minilm-biomed.yaml", [f"data.sources=[{real_text}]"])
    assert recipe.model.source == "minilm-l6"
    assert check_card(recipe) == "apache-2.0"  # from the MiniLM folder's own README front matter
    model, tok = load_mlm_model(minilm)
    state = fresh_state(1)
    state["phase_index"] = len(recipe.phases)  # the final export
    card, _ = load_card(_export(model, tok, recipe, state, tmp_path / "model"))
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2" and card.data.license == "apache-2.0"
    assert "inherited from the base model's card (sentence-transformers/all-MiniLM-L6-v2)" in card.text
    assert "SYNTHETIC" not in card.text and "synthetic-data" not in card.data.tags
    assert "notes (`" in card.text and "2 documents" in card.text  # the input file and its counts
    # MiniLM ships no MLM head: the card says so first, and no fill-mask widget shows its fresh head
    assert model.fresh_mlm_head
    first = card.text.split("## Phases")[0]
    assert "**A fresh MLM head.** The base model shipped no masked-LM head" in first
    assert "fill-mask predictions are not meaningful" in first
    assert card.data.pipeline_tag == "feature-extraction"
    assert card.data.datasets is None  # a local corpus: no Hub dataset id to name, never its path
    assert f"Seeds: `seed` {recipe.seed}, `data.shuffle_seed` {recipe.data.shuffle_seed}" in card.text


def test_the_card_keeps_fill_mask_for_a_head_the_base_shipped_or_trained_long_enough():
    from detour.model.card import FILL_MASK_MIN_TOKENS, _pipeline_tag

    mlm = {"phases": [{"objective": "clm", "tokens_done": 10**9}, {"objective": "mlm", "tokens_done": 5000}]}
    assert _pipeline_tag(mlm, last_clm=False) == "fill-mask"  # the base's own head, continued
    assert _pipeline_tag({**mlm, "fresh_head": True}, last_clm=False) == "feature-extraction"
    long = {"fresh_head": True, "phases": [{"objective": "mlm", "tokens_done": FILL_MASK_MIN_TOKENS}]}
    assert _pipeline_tag(long, last_clm=False) == "fill-mask"
    assert _pipeline_tag(mlm, last_clm=True) == "feature-extraction"  # last trained as a causal LM


def test_card_datasets_are_hub_ids_and_languages_come_from_the_recipe_or_the_generator(tmp_path):
    from detour.model.card import card_languages, hub_datasets

    local = tmp_path / "corpus"
    local.mkdir()
    card = {"datasets": ["bigbio/e3c", str(local), "./mine"],
            "data": [{"path": str(local), "sources": [
                {"input": "hf:pubmed_qa?split=train&field=context", "kind": "hf-hub"},
                {"input": str(local / "notes.jsonl"), "kind": "jsonl"},
                {"input": "synthetic:clinical?docs=20&seed=0&lang=fr", "kind": "synthetic"}]}]}
    assert hub_datasets(card) == ["bigbio/e3c", "pubmed_qa"]
    assert card_languages(card) == ["fr"]  # from the generator's source when the recipe names none
    assert card_languages({**card, "language": ["en"]}) == ["en"]
    assert card_languages({"data": [{"sources": [{"input": "notes.txt"}]}]}) == []


def test_the_license_comes_from_the_recipe_else_the_base_card_else_an_error(minilm, real_text, synthetic):
    on_real = [f"data.sources=[{real_text}]"]
    tiny = RECIPES / "tiny-modernbert.yaml"
    assert check_card(load_recipe(tiny, [*on_real, "card.license=cc-by-4.0"])) == "cc-by-4.0"
    with pytest.raises(DetourError, match=r"card.license: .*built from model.config.*--set card.license=ID"):
        check_card(load_recipe(tiny, on_real))
    with pytest.raises(DetourError, match=r"card.license: .*'detour-tests/no-such-model' has no model card"):
        check_card(load_recipe(tiny, [*on_real, "model.source=detour-tests/no-such-model", "model.config=null"]))
    assert check_card(load_recipe(tiny, [f"data.sources=[{synthetic}]"])) == "other"  # an engine test
    assert card_license(load_recipe(tiny, [f"data.sources=[{synthetic}, {real_text}]"]))[0] is None
    minilm_recipe = RECIPES / "minilm-biomed.yaml"
    assert check_card(load_recipe(minilm_recipe, [*on_real, "card.license=mit"])) == "mit"  # the recipe wins
    assert check_card(load_recipe(minilm_recipe, [*on_real, f"model.source={minilm}"])) == "apache-2.0"
    with pytest.raises(DetourError, match="card.license: expected a Hub license id"):
        load_recipe(tiny, ["card.license=Apache 2.0"])


def test_hub_ids_of_model_references(minilm, tmp_path):
    assert hub_id_of("minilm-l6") == hub_id_of(str(minilm)) == "sentence-transformers/all-MiniLM-L6-v2"
    assert hub_id_of("answerdotai/ModernBERT-base") == "answerdotai/ModernBERT-base"
    snapshot = tmp_path / "hub" / "models--answerdotai--ModernBERT-base" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert hub_id_of(str(snapshot)) == "answerdotai/ModernBERT-base"
    assert hub_id_of(str(tmp_path)) is None and hub_id_of(None) is None and hub_id_of("/no/such/folder") is None
