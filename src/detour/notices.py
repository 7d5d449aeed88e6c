"""Warnings a user should read once: `WARNING: ...` on stderr, each distinct text once per process.

    python -c "from detour.notices import warn; warn('shown once'); warn('shown once')"

The task readers, the checks of task data and the training setup all warn through here, so a task
read again, or prepared for several models, does not repeat what it already said.
"""

from __future__ import annotations

import sys

_warned: set[str] = set()


def warn(text: str) -> None:
    """Print `WARNING: text` to stderr, once per process for the same text."""
    if text in _warned:
        return
    _warned.add(text)
    print(f"WARNING: {text}", file=sys.stderr)
