"""The one tokenizer loader, the tokenizer's fingerprint, and the separator policy of prepared corpora.

    python -m detour.data.tokenize <model name or folder>    # prints the fingerprint and policy

The fingerprint is a SHA-256 of the tokenizer's full serialised state: the backend
`tokenizer.json` (vocabulary, normaliser such as lower-casing, pre-tokeniser, post-processor,
added tokens) plus the special-tokens map. Training refuses data prepared with another tokenizer
by comparing this value with the one in the prepared manifest.
"""

from __future__ import annotations

import hashlib
import json
import sys

from detour.errors import DetourError


def load_tokenizer(name_or_path, *, trust_remote_code: bool = False):
    """A Hugging Face tokenizer from a hub name, a local folder or an alias (`minilm-l6`).

    Every tokenizer detour reads comes from here (prepare, train, eval, needle, the analyses):
    it sits below the model loader because `prepare` needs a tokenizer and no model.
    """
    from transformers import AutoTokenizer

    from detour.paths import resolve_model_ref
    from detour.quiet import quiet_transformers

    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(resolve_model_ref(str(name_or_path)),
                                                      trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises OSError, ValueError, EnvironmentError... for a bad name
        raise DetourError(f"cannot load tokenizer {name_or_path!r}: {type(exc).__name__}: {exc}") from None
    if isinstance(tokenizer, bool) or not callable(tokenizer):
        raise DetourError(f"{name_or_path!r} did not load as a tokenizer")
    return tokenizer


def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 of the tokenizer's serialised state; equal for the same tokenizer loaded twice."""
    state: dict = {"special_tokens": tokenizer.special_tokens_map}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend_state = json.loads(backend.to_str())
        # Truncation and padding are call-time settings, not part of what the tokenizer produces.
        backend_state.pop("truncation", None)
        backend_state.pop("padding", None)
        state["backend"] = backend_state
    else:
        state["vocab"] = sorted(tokenizer.get_vocab().items())
        state["init_kwargs"] = {k: v for k, v in tokenizer.init_kwargs.items() if isinstance(v, (str, int, bool))}
    blob = json.dumps(state, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def vocab_size(tokenizer) -> int:
    """One more than the largest id the tokenizer can emit (base vocabulary plus added tokens).

    Not just len(tokenizer): a vocabulary may have holes, and the shard dtype must hold the largest id.
    """
    return max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)


def separator_policy(tokenizer) -> dict:
    """How a document is delimited: the tokenizer's own special tokens around each document.

    Returns the template (e.g. "[CLS] ... [SEP]") and the ids it adds before and after the text.
    A tokenizer that adds no closing token (GPT-2 style) gets its EOS token appended so that
    documents never run into each other.
    """
    probe = "x"
    plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe, add_special_tokens=True)["input_ids"]
    n = len(plain)
    start = next((i for i in range(len(full) - n + 1) if full[i:i + n] == plain), None)
    if start is None:
        raise DetourError(f"tokenizer {tokenizer.name_or_path!r}: cannot locate text between its special tokens")
    prefix, suffix = full[:start], full[start + n:]
    append_eos = False
    if not suffix:
        if tokenizer.eos_token_id is None and tokenizer.sep_token_id is None:
            raise DetourError(f"tokenizer {tokenizer.name_or_path!r} adds no closing special token and has no "
                              "EOS/SEP token: documents could not be separated")
        suffix = [tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id]
        append_eos = True
    names = tokenizer.convert_ids_to_tokens(prefix) + ["..."] + tokenizer.convert_ids_to_tokens(suffix)
    return {
        "name": "tokenizer-special-tokens" + ("+eos" if append_eos else ""),
        "template": " ".join(names),
        "prefix_ids": [int(i) for i in prefix],
        "suffix_ids": [int(i) for i in suffix],
        "append_eos": append_eos,
        "description": "each document encoded with the tokenizer's own special tokens; documents concatenated as they are",
    }


if __name__ == "__main__":
    tok = load_tokenizer(sys.argv[1])
    print(json.dumps({"fingerprint": tokenizer_fingerprint(tok), "vocab_size": vocab_size(tok),
                      "separator_policy": separator_policy(tok)}, indent=2))
