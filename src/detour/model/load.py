"""The one loader of encoders and their configs: alias -> path -> config -> weights, with one dtype policy.

    python -c "from detour.model.load import load_mlm_model; from detour.paths import minilm_path; \
print(load_mlm_model(minilm_path())[0].config.model_type)"

Every verb loads through here: train, twins and doctor a masked LM (`load_mlm_model`), eval, needle
and the analyses a bare encoder (`load_encoder`), everyone a config (`load_config`); tokenizers
come from `detour.data.tokenize.load_tokenizer`. A reference is a hub name, a folder, or an alias
(`minilm-l6`). Weights load in fp32 unless the caller asks otherwise: detour trains and measures
in fp32 and autocasts to bf16 on CUDA, so a bf16 checkpoint is widened, never trained in bf16.
Errors are `DetourError`s that name the reference (`model REF: ...`); transformers' own bars and
load reports are silenced here, and what a load did is said once in detour's words.

One model class (`AutoModelForMaskedLM`) serves both training phases: the body is run with the
masks from `detour.model.masks`, and the MLM head (transform + decoder tied to the input
embeddings) is the next-token head in CLM. An encoder saved without an MLM head (the MiniLM
package, any `BertModel`) gets a fresh head, tied, and we say so once in plain words.

Attention (`model.attn_implementation`): sdpa and eager take dense packed-document masks; varlen
takes document boundaries only (`detour.model.varlen`, flash varlen on CUDA); auto is varlen for a
model that will run on CUDA, sdpa otherwise. sdpa runs as `detour.model.lean_attention.NAME`:
torch's sdpa, except where attention dropout sends it down its math path on the CPU, which the same
arithmetic replaces with a third of the memory (`hf_attention`, `user_attention`).
"""

from __future__ import annotations


import functools
import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.activations import gelu

from detour.data.tokenize import load_tokenizer
from detour.errors import DetourError
from detour.io import why_missing
from detour.model import lean_attention, varlen
from detour.paths import resolve_model_ref
from detour.quiet import quiet_transformers

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("modernbert", "bert", "roberta", "camembert", "xlm-roberta")
ROBERTA_LIKE = ("roberta", "camembert", "xlm-roberta")
# Tokenizer special tokens copied into the model config, so that objectives know what never to mask.
_SPECIAL_NAMES = ("pad", "cls", "sep", "mask", "bos", "eos", "unk")


def tiny_modernbert_config() -> dict:
    """The tiny ModernBERT (global and sliding layers) used by tests, demos and `detour doctor`."""
    return dict(
        model_type="modernbert",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=512,
        global_attn_every_n_layers=3,
        local_attention=8,
    )


ATTN_CHOICES = ("sdpa", "eager", "varlen", "auto")


def _attention_dropout(hf_config) -> tuple[str, float]:
    """(field, value) of the attention-probability dropout: ModernBERT's attention_dropout, the BERT family's
    attention_probs_dropout_prob."""
    for name in ("attention_dropout", "attention_probs_dropout_prob"):
        if getattr(hf_config, name, None) is not None:
            return name, float(getattr(hf_config, name))
    return "attention dropout", 0.0


def resolve_attn_implementation(choice: str, hf_config, device=None) -> str:
    """The transformers attention implementation for `model.attn_implementation` on this config and device.

    `device` is where the model will run (None: not known, so auto gives sdpa).
    """
    if choice not in ATTN_CHOICES:
        raise DetourError(f"model.attn_implementation: {choice!r} is not one of {', '.join(ATTN_CHOICES)}")
    if choice in ("sdpa", "eager"):
        return choice
    _check_type(hf_config.model_type, "model")  # every supported family runs varlen
    field, dropout = _attention_dropout(hf_config)
    on_cuda = torch.cuda.is_available() and device is not None and torch.device(device).type == "cuda"
    if choice == "auto":
        # the flash kernels need an Ampere or newer GPU, and have no attention dropout
        if on_cuda and torch.cuda.get_device_capability(torch.device(device)) >= (8, 0) and dropout == 0:
            return varlen.NAME
        if on_cuda and dropout > 0:
            log.info("model.attn_implementation auto: sdpa, since this %s model's %s is %g (varlen has no "
                     "attention dropout)", hf_config.model_type, field, dropout)
        return "sdpa"
    if dropout > 0:
        raise DetourError(
            f"model.attn_implementation: varlen has no attention dropout, but this {hf_config.model_type} model's "
            f"{field} is {dropout:g}; use sdpa (or auto), or build the model from model.config with {field}: 0")
    if not on_cuda:
        log.warning("model.attn_implementation varlen without a CUDA device: attention runs the exact "
                    "per-document CPU reference (slower than sdpa)")
    return varlen.NAME


def hf_attention(choice: str) -> str:
    """The name transformers runs for a resolved `model.attn_implementation`: sdpa is sdpa with the
    lean CPU path for attention dropout (`detour.model.lean_attention`: the same numbers, a third of
    the memory); the others are themselves."""
    return lean_attention.NAME if choice == "sdpa" else choice


def user_attention(name: str) -> str:
    """The `model.attn_implementation` a model's transformers attention name stands for."""
    return "sdpa" if name == lean_attention.NAME else name


def _check_type(model_type: str | None, where: str) -> str:
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise DetourError(
            f"{where}: model_type {model_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return model_type


# ---- the loaders: every config and every encoder detour reads comes through these two ----

def load_config(ref, *, what: str = "model", trust_remote_code: bool = False):
    """(local path or hub name, config) of a model reference; `what` names it in errors (`model.source`)."""
    path = resolve_model_ref(str(ref))
    if not Path(path).exists() and (Path(path).is_absolute() or path.startswith((".", "~")) or Path(path).is_symlink()):
        why = why_missing(path)
        raise DetourError(f"{what} {ref}: " + ("no such folder" if why == "no such file or folder" else why))
    try:
        with quiet_transformers():
            return path, AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        where = "a folder without a usable config.json" if Path(path).is_dir() else "not a folder here, nor a hub model"
        raise DetourError(f"{what} {ref}: {where} ({exc})") from exc


def load_encoder(ref, *, mlm_head: bool = False, config=None, dtype: torch.dtype = torch.float32,
                 attn_implementation: str | None = None, trust_remote_code: bool = False, name: str | None = None):
    """(model, loading info) from a model reference: the bare encoder (`AutoModel`), or with `mlm_head`
    the masked LM (`AutoModelForMaskedLM`), in `dtype`, on the CPU.

    `name` is how errors call the model (default: the reference); `attn_implementation` is a resolved
    `model.attn_implementation` (sdpa runs as `hf_attention` says). The loading info lists missing and unexpected keys: a head the checkpoint lacks is fresh, an
    MLM checkpoint read as a bare encoder drops its head (both expected; the callers say so).
    """
    path = resolve_model_ref(str(ref))
    options = {"dtype": dtype, "trust_remote_code": trust_remote_code, "output_loading_info": True}
    if config is not None:
        options["config"] = config
    if attn_implementation is not None:
        options["attn_implementation"] = hf_attention(attn_implementation)
    cls = AutoModelForMaskedLM if mlm_head else AutoModel
    try:
        with quiet_transformers():  # a load turns transformers' bars back on: its "Loading weights" bar per run
            model, info = cls.from_pretrained(path, **options)
    except (OSError, ValueError) as exc:
        kind = "a masked LM" if mlm_head else "an encoder"
        raise DetourError(f"model {name or ref}: cannot load {kind} from {path} ({exc})") from exc
    return model, info


def weights_hash(ref: str) -> str:
    """sha256 over a model folder's weight files (safetensors, else bin), in name order.

    Two exports of the same weights hash equal whatever their path; a hub name not on disk gets
    the name itself, marked, since there are no local bytes to hash.
    """
    path = Path(resolve_model_ref(ref))
    files = (sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))) if path.is_dir() else []
    if not files:
        return f"unhashed:{ref}"
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return "sha256:" + h.hexdigest()


def _special_ids_into_config(config, tokenizer) -> None:
    for name in _SPECIAL_NAMES:
        token_id = getattr(tokenizer, f"{name}_token_id", None)
        if token_id is not None:
            setattr(config, f"{name}_token_id", int(token_id))


def special_token_ids(tokenizer) -> list[int]:
    """Ids never to mask: every special token of the tokenizer, padding included."""
    ids = set(int(i) for i in tokenizer.all_special_ids)
    if tokenizer.pad_token_id is not None:
        ids.add(int(tokenizer.pad_token_id))
    return sorted(ids)


def config_special_ids(config) -> list[int]:
    """The special-token ids recorded in a model config (see `load_mlm_model`)."""
    ids = {getattr(config, f"{n}_token_id", None) for n in _SPECIAL_NAMES}
    return sorted(int(i) for i in ids if isinstance(i, int) and i >= 0)


# Read by model code from any config although a fresh config may not list them.
_GENERIC_CONFIG_KEYS = {"is_decoder", "add_cross_attention", "tie_word_embeddings", "output_hidden_states",
                        "output_attentions", "return_dict", "use_cache", "dtype", "torch_dtype", "architectures"}


def check_buildable(model_type: str, fields: dict, where: str = "model.config") -> None:
    """A config the architecture cannot be built from (a hidden size that is not a multiple of the
    heads, say) is an error before any data are read: the masked LM is built on the meta device,
    with no weights and no memory, and the architecture's own complaint is passed on naming the field."""
    _build_on_meta(model_type, json.dumps(fields, sort_keys=True, default=str), where)


@functools.lru_cache(maxsize=16)  # a study checks each arm against the same base config
def _build_on_meta(model_type: str, fields_json: str, where: str) -> None:
    try:
        hf_config = AutoConfig.for_model(model_type, **json.loads(fields_json))
        with torch.device("meta"):
            AutoModelForMaskedLM.from_config(hf_config)
    except (TypeError, ValueError, AssertionError) as exc:
        raise DetourError(f"{where}: {exc}") from None


def check_config_keys(model_type: str, fields: dict, where: str = "model.config") -> None:
    """Every key must be a field of the architecture's config class: a typo must not fall back to a default."""
    import difflib
    import inspect

    from transformers import CONFIG_MAPPING, PretrainedConfig

    cls = CONFIG_MAPPING[model_type]
    default = cls()
    known = set(default.to_dict()) | set(vars(default)) | set(getattr(cls, "attribute_map", {})) | _GENERIC_CONFIG_KEYS
    for klass in cls.__mro__:
        if not (isinstance(klass, type) and issubclass(klass, PretrainedConfig)):
            continue
        known |= set(inspect.signature(klass.__init__).parameters)
        # Legacy keys are read from **kwargs (ModernBERT's global_attn_every_n_layers, global_rope_theta):
        # the class's own source is the only place that lists them.
        try:
            known |= set(re.findall(r"kwargs\.(?:get|pop)\(\s*[\"'](\w+)[\"']", inspect.getsource(klass)))
        except (OSError, TypeError):
            pass
    unknown = sorted(k for k in fields if k not in known and k != "model_type")
    if unknown:
        hints = [f"{k} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(k, known, n=1)) else k
                 for k in unknown]
        raise DetourError(f"{where}: unknown key(s) for {cls.__name__}: {', '.join(hints)}")


def load_mlm_model(
    source: str | Path | None = None,
    *,
    config: dict | None = None,
    tokenizer: str | Path | None = None,
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
    seed: int | None = None,
    device: torch.device | str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """An fp32 `*ForMaskedLM` model and its tokenizer, from a hub name/folder or from a config dict.

    `attn_implementation` is one of ATTN_CHOICES; `device` (where the caller will move the model)
    decides "auto" and whether "varlen" can use its CUDA kernel. The model is returned on the CPU.
    """
    if (source is None) == (config is None):
        raise DetourError("model: give either a hub name/folder or an architecture config, not both")
    if config is not None:
        if tokenizer is None:
            raise DetourError("model.tokenizer: required when the model is built from a config")
        tok = load_tokenizer(tokenizer, trust_remote_code=trust_remote_code)
        fields = dict(config)
        model_type = _check_type(fields.pop("model_type", None), "model.config.model_type")
        check_config_keys(model_type, fields)
        fields["vocab_size"] = len(tok)
        for name in _SPECIAL_NAMES:
            token_id = getattr(tok, f"{name}_token_id", None)
            if token_id is not None:
                fields[f"{name}_token_id"] = int(token_id)
        # BERT-style tokenizers have no bos/eos: [CLS] and [SEP] play those parts.
        fields.setdefault("bos_token_id", fields.get("cls_token_id"))
        fields.setdefault("eos_token_id", fields.get("sep_token_id"))
        try:
            hf_config = AutoConfig.for_model(model_type, **fields)
        except (TypeError, ValueError) as exc:
            raise DetourError(f"model.config: {exc}") from exc
        attn_implementation = hf_attention(resolve_attn_implementation(attn_implementation, hf_config, device))
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            model = AutoModelForMaskedLM.from_config(
                hf_config, attn_implementation=attn_implementation, dtype=torch.float32
            )
    else:
        tok = load_tokenizer(tokenizer if tokenizer is not None else source, trust_remote_code=trust_remote_code)
        model = _load_pretrained(source, attn_implementation, trust_remote_code, seed, device)
    _special_ids_into_config(model.config, tok)
    model.never_mask_ids = special_token_ids(tok)  # added special tokens too; MLM never masks them
    model.config.is_decoder = False
    return model, tok


def _load_pretrained(source, attn_implementation, trust_remote_code, seed, device=None) -> PreTrainedModel:
    _, hf_config = load_config(source, trust_remote_code=trust_remote_code)
    _check_type(hf_config.model_type, f"model {source}")
    attn_implementation = resolve_attn_implementation(attn_implementation, hf_config, device)
    # transformers warns "newly initialized" about the head of a head-less checkpoint; we say it
    # once ourselves below, in words that match what happens (a fresh head, decoder tied).
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        model, info = load_encoder(source, mlm_head=True, config=hf_config, attn_implementation=attn_implementation,
                                   trust_remote_code=trust_remote_code)
    model.extra_export_weights = _unused_pretrained_weights(source, model, info.get("unexpected_keys", ()))
    missing = set(info.get("missing_keys", ()))
    head_names = {n for n, _ in model.named_parameters() if _is_head_param(model, n)}
    body_missing = sorted(k for k in missing if k not in head_names and not _is_head_param(model, k))
    if body_missing:
        raise DetourError(f"model {source}: encoder weights missing from the checkpoint: {body_missing[:5]}")
    model.fresh_mlm_head = bool(missing)  # the export's card says so, and turns the fill-mask widget off
    if missing:
        decoder = model.get_output_embeddings()
        if decoder.weight is not model.get_input_embeddings().weight:
            decoder.weight = model.get_input_embeddings().weight
        log.warning(
            "model %s has no MLM head: using a freshly initialised head (%d tensors) whose "
            "decoder is tied to the input embeddings.",
            source,
            len(missing),
        )
    return model


# Pretrained weights a masked LM does not use but other heads of the same encoder do: BERT's and
# RoBERTa's pooler (the CLS dense layer of AutoModelForSequenceClassification).
_KEPT_FOR_OTHER_HEADS = re.compile(r"(^|\.)pooler\.")


def _unused_pretrained_weights(source, model, unexpected) -> dict[str, torch.Tensor]:
    """The base checkpoint's pooler tensors, named as in the masked LM's namespace, for the exports.

    Continued pretraining does not train them, but dropping them would make every classification
    fine-tune of an export start from a random pooler where the base model had a pretrained one.
    """
    wanted = [k for k in unexpected if _KEPT_FOR_OTHER_HEADS.search(k)]
    files = sorted(Path(str(source)).glob("*.safetensors")) if Path(str(source)).is_dir() else []
    if not wanted or not files:
        return {}
    from safetensors import safe_open

    prefix = model.base_model_prefix + "."
    found = {}
    for file in files:
        with safe_open(str(file), "pt") as fh:
            for key in fh.keys():
                name = key if key.startswith(prefix) else prefix + key
                if name in wanted or key in wanted:
                    found[name] = fh.get_tensor(key).to(torch.float32).contiguous()
    return found


def family(model) -> str:
    """'modernbert', 'bert' or 'roberta' (RoBERTa, CamemBERT and XLM-R share one layout)."""
    model_type = _check_type(model.config.model_type, "model")
    return "roberta" if model_type in ROBERTA_LIKE else model_type


def encoder_body(model) -> nn.Module:
    """The encoder without its MLM head (`ModernBertModel`, `BertModel`, `RobertaModel`, ...)."""
    return model.base_model


def encoder_layers(model) -> tuple[str, nn.ModuleList]:
    """(dotted name, module list) of the encoder's transformer layers."""
    fam = family(model)
    prefix = model.base_model_prefix
    name = f"{prefix}.layers" if fam == "modernbert" else f"{prefix}.encoder.layer"
    return name, model.get_submodule(name)


def head_module_names(model) -> list[str]:
    """Top-level module names of the MLM head."""
    return {"modernbert": ["head", "decoder"], "bert": ["cls"], "roberta": ["lm_head"]}[family(model)]


def _is_head_param(model, name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in head_module_names(model))


def mlm_head_parts(model) -> tuple[Callable[[torch.Tensor], torch.Tensor], nn.Linear]:
    """(transform, decoder): logits = decoder(transform(last_hidden_state)), as the model's head does."""
    fam = family(model)
    if fam == "modernbert":
        return model.head, model.decoder
    if fam == "bert":
        return model.cls.predictions.transform, model.cls.predictions.decoder
    lm_head = model.lm_head

    def transform(h: torch.Tensor) -> torch.Tensor:  # RobertaLMHead.forward without the decoder
        return lm_head.layer_norm(gelu(lm_head.dense(h)))

    return transform, lm_head.decoder
