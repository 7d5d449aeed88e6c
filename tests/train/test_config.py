"""Recipes: token counts, validation errors that name the field, overrides, the MLM twin."""

from pathlib import Path

import pytest

from detour.config import baseline_of, load_recipe, parse_tokens
from detour.errors import DetourError

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


@pytest.mark.parametrize("text,value", [("10B", 10**10), ("100M", 10**8), ("250k", 250_000), ("1.5M", 1_500_000),
                                        (4096, 4096), ("4096", 4096)])
def test_parse_tokens(text, value):
    assert parse_tokens(text) == value


@pytest.mark.parametrize("bad", ["ten", "1.5k5", -3, 0, "0.5"])
def test_parse_tokens_rejects(bad):
    with pytest.raises(ValueError):
        parse_tokens(bad)


@pytest.mark.parametrize("name", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_shipped_recipes_load(name):
    recipe = load_recipe(RECIPES / name)
    objectives = [p.objective for p in recipe.phases]
    if "scratch-base" in name:  # a base pretrained from scratch (a study's `base:`): MLM in every phase
        assert set(objectives) == {"mlm"}
    else:  # a CLM phase (the first, or after a head warm-up), the MLM decay last
        assert "clm" in objectives[:2] and objectives[-1] == "mlm"
    recipe.grad_accumulation()


def test_errors_name_the_field(tmp_path):
    with pytest.raises(DetourError, match=r"phases\.1\.mask_rate|phases\.1: .*mask_rate"):
        load_recipe(RECIPES / "tiny-modernbert.yaml", ["phases.1.mask_rate=null"])
    with pytest.raises(DetourError, match=r"phases\.0\.tokens"):
        load_recipe(RECIPES / "tiny-modernbert.yaml", ["phases.0.tokens=lots"])
    with pytest.raises(DetourError, match=r"optimizer\.lrr"):
        load_recipe(RECIPES / "tiny-modernbert.yaml", ["optimizer.lrr=1"])
    with pytest.raises(DetourError, match="recipe not found"):
        load_recipe(tmp_path / "nope.yaml")


def test_overrides_and_budget_plan():
    recipe = load_recipe(RECIPES / "tiny-modernbert.yaml", ["phases.0.tokens=10000", "batch.global_sequences=4",
                                                            "batch.micro_batch=2", "data.seq_len=128"])
    plan = recipe.plan()
    assert plan[0]["tokens"] == 10000 and plan[0]["tokens_per_step"] == 512
    assert plan[0]["steps"] == 20 and plan[0]["last_step_tokens"] == 10000 - 19 * 512
    assert recipe.grad_accumulation() == 2


def test_batch_must_divide():
    recipe = load_recipe(RECIPES / "tiny-modernbert.yaml", ["batch.global_sequences=6", "batch.micro_batch=4"])
    with pytest.raises(DetourError, match="micro_batch"):
        recipe.grad_accumulation()


def test_baseline_twin_differs_in_phase_one_objective_only():
    recipe = load_recipe(RECIPES / "tiny-modernbert.yaml")
    twin = baseline_of(recipe)
    assert twin.phases[0].objective == "mlm" and twin.phases[0].mask_rate == recipe.baseline_mask_rate
    assert [p.name for p in twin.phases] == ["mlm30", "decay"]  # named for what it is; the decay keeps its name
    a, b = recipe.model_dump(), twin.model_dump()
    a.pop("name"), b.pop("name")
    a["phases"][0].update(objective=None, mask_rate=None, name=None)
    b["phases"][0].update(objective=None, mask_rate=None, name=None)
    assert a == b


def test_the_twin_renames_what_refers_to_a_replaced_phase():
    recipe = load_recipe(RECIPES / "tiny-modernbert.yaml", ["baseline_mask_rate=0.4", "checkpoint.export_phases=[clm, decay]",
                                                            "checkpoint.export_every_tokens=1k"])
    twin = baseline_of(recipe)
    assert [p.name for p in twin.phases] == ["mlm40", "decay"]
    assert twin.checkpoint.export_phases == ["mlm40", "decay"]
    named = load_recipe(RECIPES / "tiny-modernbert.yaml", ["phases.0.name=long"])
    assert [p.name for p in baseline_of(named).phases] == ["long", "decay"]  # a name that does not say clm is kept


def test_a_batch_that_does_not_split_says_which_micro_batch_does(tiny_recipe):
    from detour.errors import DetourError

    recipe = tiny_recipe("batch.global_sequences=8", "batch.micro_batch=8")
    with pytest.raises(DetourError, match=r"8 sequences per step do not split into micro_batch=8 x 2 process\(es\); "
                                          r"e\.g\. --set batch\.micro_batch=4"):
        recipe.grad_accumulation(2)
    assert recipe.grad_accumulation(1) == 1
