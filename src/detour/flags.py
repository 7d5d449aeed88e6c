"""Command-line overrides held to the rules of the file field they override.

    python -c "from detour.flags import positive_int; print(positive_int('3'))"

`--lr -1` or `--epochs 0` on the command line must fail as the same value in a task spec or a
recipe does, naming the flag, before any model loads: argparse calls these types while it parses,
so a bad value exits 2 with `argument --lr: ...`. `spec_field(Model, "field")` reads the field's
type and bounds from the pydantic model itself, so the flag and the file cannot drift apart.
"""

from __future__ import annotations

import argparse
import math
from typing import Annotated, Any, Callable


def spec_field(model: type, field: str, where: str) -> Callable[[str], Any]:
    """An argparse type accepting what `model.field` accepts (None aside); `where` names the field
    in messages, e.g. "training.lr of a task spec"."""
    from pydantic import TypeAdapter, ValidationError

    info = model.model_fields[field]
    annotation = info.annotation
    args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
    if args and type(None) in getattr(annotation, "__args__", ()):
        annotation = args[0]  # `float | None`: on the command line, absent is the None
    adapter = TypeAdapter(Annotated[annotation, *info.metadata])

    def parse(text: str):
        try:
            value = adapter.validate_strings(text)
        except ValidationError as exc:
            said = exc.errors()[0]["msg"].replace("Input should be", "must be")
            raise argparse.ArgumentTypeError(f"{said}, got {text!r} "
                                             f"(the rule of {where})") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        return value

    parse.__name__ = annotation.__name__  # argparse says "invalid int value" for a non-number
    return parse


def positive_int(text: str) -> int:
    """An argparse type for counts and sizes: 1 or more."""
    return _whole_number(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    """An argparse type for indices such as a first seed: 0 or more."""
    return _whole_number(text, 0, "0 or more")


def _whole_number(text: str, low: int, rule: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be {rule}, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type for rates and learning rates: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text!r}")
    return value
