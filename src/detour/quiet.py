"""transformers' own progress bars and load reports, silenced inside detour's verbs.

    python -c "from detour.quiet import quiet_transformers; \
from transformers import AutoModel; from detour.paths import minilm_path; \
exec('with quiet_transformers(): AutoModel.from_pretrained(minilm_path())')"

detour shows its own progress and says in its own words what a load did (a fresh MLM head, a
dropped pooler); a tqdm bar per export or a LOAD REPORT table per model only fills logs.
"""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def quiet_transformers():
    """Bars off and only errors logged inside; the previous settings restored exactly on exit.

    Usable as a decorator. A caller that had silenced the bars keeps them silent.
    """
    from transformers.utils import logging as hf_logging

    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        else:
            hf_logging.disable_progress_bar()
