"""A markdown page under construction: headings, paragraphs, tables and figures, plus number formats.

    python -c "from detour.report.page import Page; p = Page(); p.table(['a', 'b'], [[1, 2]]); print(p.markdown())"

The report is written once, as markdown; the HTML is rendered from that same text, so both say
exactly the same thing. Figures are kept as matplotlib Figures until the page is written.
"""

from __future__ import annotations

import math

FIGURES_DIR = "report-figures"


class Page:
    def __init__(self):
        self.lines: list[str] = []
        self.figures: dict[str, object] = {}  # file name (no folder) -> matplotlib Figure

    def heading(self, level: int, text: str) -> None:
        self.lines += [f"{'#' * level} {text}", ""]

    def para(self, text: str) -> None:
        self.lines += [text, ""]

    def bullets(self, items: list[str]) -> None:
        self.lines += [f"- {item}" for item in items] + [""]

    def table(self, header: list[str], rows: list[list]) -> None:
        self.lines.append("| " + " | ".join(_cell(h) for h in header) + " |")
        self.lines.append("|" + "|".join("---" for _ in header) + "|")
        for row in rows:
            self.lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
        self.lines.append("")

    def figure(self, name: str, fig, caption: str) -> None:
        """The figure (as FIGURES_DIR/name.png) and its caption below it; nothing when fig is None."""
        if fig is None:
            return
        self.figures[f"{name}.png"] = fig
        self.lines += [f"![{name}]({FIGURES_DIR}/{name}.png)", "", f"*Figure: {caption}*", ""]

    def markdown(self) -> str:
        return "\n".join(self.lines).rstrip() + "\n"


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def num(value, digits: int = 4) -> str:
    """A float with fixed decimals; '–' for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def pm(mean, std, digits: int = 2, scale: float = 1.0) -> str:
    if mean is None:
        return "–"
    return f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}" if std is not None else f"{scale * mean:.{digits}f}"


def tokens(n) -> str:
    """48000 -> '48k', 1919563 -> '1.92M', 10**10 -> '10B' (three significant digits)."""
    if n is None:
        return "–"
    for size, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "k")):
        if abs(n) >= size:
            return f"{n / size:.3g}{suffix}"
    return f"{int(n)}"


def count(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def p_value(p: float) -> str:
    """4 decimals, or 2 significant digits below 0.0001 (an exact sign-flip p can be far below that)."""
    return f"{p:.4f}" if p >= 1e-4 or p == 0 else f"{p:.1e}"
