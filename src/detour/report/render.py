"""Assemble the report and write it: figures, then report.md, then a self-contained report.html.

    python -c "from detour.report.render import write_report; print(write_report('runs/study'))"

The markdown is the report; the HTML is the same text rendered by markdown-it (the parser `rich`
already brings), with inline CSS and every figure embedded as a base64 PNG data URI, so the file
opens anywhere with no network, no external CSS or JS. Writes OUT/report-figures/*.png (so
report.md shows them), OUT/report.md, and OUT/report.html last, each atomically: if report.html
exists, the report is complete.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from detour.errors import NoSpaceError
from detour.io import atomic_write, ensure_output_dir, is_disk_full, no_space, write_text
from detour.lock import folder_lock
from detour.report import analyses, sections
from detour.report.collect import Study, collect, synthetic_reasons
from detour.report.page import FIGURES_DIR, Page
from detour.report.tables import results_table, significance_rows

FIGURE_NAMES = ("curves", "validation", "results", "cka", "trajectory", "transplant", "drift", "needle")

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #1d1d1f; line-height: 1.45; }
h1 { border-bottom: 2px solid #444; padding-bottom: .2em; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: .15em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .9em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; vertical-align: top; }
th { background: #f2f2f2; }
img { max-width: 100%; border: 1px solid #eee; }
code { background: #f4f4f4; padding: 0 .2em; }
.synthetic { background: #b00020; color: white; font-weight: bold; font-size: 1.15em; padding: .8em 1em;
             border-radius: 4px; margin: 1em 0; }
.notrun { background: #fff6db; border-left: 4px solid #e0a800; padding: .5em .8em; }
"""


def banner(s: Study) -> str | None:
    reasons = synthetic_reasons(s)
    if not reasons:
        return None
    return (f"SYNTHETIC DATA: {'; '.join(reasons)}. Generated text exercises the pipeline; no number in this "
            "report is evidence about real text.")


def not_run_line(s: Study) -> str:
    return f"Not run: {'; '.join(s.missing)}." if s.missing else "Not run: nothing (every section has its inputs)."


def build(s: Study) -> tuple[str, Page]:
    """(title, page body) of the report."""
    page = Page()
    what = "study" if s.layout == "study" else "twins run"
    intro = f"Report of the {what} in `{s.root}`"
    if s.description:
        intro += f": {s.description.strip().rstrip('.')}"
    page.para(intro + ".")
    page.para(f"Arms: {', '.join(f'{a.name} ({a.role})' for a in s.arms.values())}. Scale: {sections.scale_line(s)}.")
    page.lines.append(f"**{not_run_line(s)}**")
    page.lines.append("")
    table = results_table(s)
    sig = significance_rows(s, table)
    scale = sections.scale_line(s)
    sections.design(page, s)
    sections.curves(page, s)
    sections.validation(page, s)
    sections.results(page, s, table, sig)
    sections.freeze(page, s, table, sig)
    for section in (analyses.cka, analyses.trajectory, analyses.transplant, analyses.drift, analyses.needle):
        section(page, s, scale)
    return f"detour report: {s.name}", page


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def markdown_text(title: str, page: Page, warning: str | None) -> str:
    head = [f"# {title}", ""]
    if warning:
        head += [f"> **{warning}**", ""]
    return "\n".join(head) + "\n" + page.markdown()


def html_text(title: str, page: Page, warning: str | None, images: dict[str, bytes]) -> str:
    """The page as one HTML file: markdown rendered without raw HTML, figures as data URIs."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    uris = {f"{FIGURES_DIR}/{name}": "data:image/png;base64," + base64.b64encode(data).decode("ascii")
            for name, data in images.items()}

    def image(renderer, tokens, idx, options, env):
        token = tokens[idx]
        src = token.attrGet("src")
        if src in uris:
            token.attrSet("src", uris[src])
        return renderer.image(tokens, idx, options, env)

    md.add_render_rule("image", image)
    body = md.render(page.markdown())
    body = body.replace("<p><strong>Not run:", '<p class="notrun"><strong>Not run:', 1)
    top = f'<div class="synthetic" role="alert">{html.escape(warning)}</div>\n' if warning else ""
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{CSS}</style>\n</head>\n<body>\n<h1>{html.escape(title)}</h1>\n{top}{body}</body>\n</html>\n")


def write_report(run_dir: str | Path, out: str | Path | None = None) -> dict:
    """Write report.md, its figures and report.html for a study or twins folder; returns the paths written."""
    s = collect(run_dir)  # a bad folder fails here, before anything is written
    existed = Path(out if out is not None else run_dir).exists()
    out = ensure_output_dir(Path(out) if out is not None else Path(run_dir), "--out")
    # One writer per folder: a report into a study folder is refused while that study runs (the
    # study's own report step already holds the lock, and takes it again).
    with folder_lock(out, remove_if_empty=not existed):
        try:
            return _write(s, out)
        except (OSError, RuntimeError, ValueError) as exc:
            if not is_disk_full(exc):
                raise
            raise NoSpaceError(no_space(f"the report into {out}", out, exc,
                                        after="files already there are whole (each is written atomically); free "
                                              "space, then rerun the same command")) from None


def _write(s, out: Path) -> dict:
    title, page = build(s)
    warning = banner(s)
    images = {name: _png(fig) for name, fig in page.figures.items()}
    fig_dir = out / FIGURES_DIR
    written = []
    for name, data in images.items():
        atomic_write(fig_dir / name, lambda tmp, data=data: Path(tmp).write_bytes(data))
        written.append(fig_dir / name)
    for stale in FIGURE_NAMES:  # a figure of a section that no longer has inputs would mislead beside the .md
        path = fig_dir / f"{stale}.png"
        if f"{stale}.png" not in images and path.is_file():
            path.unlink()
    write_text(out / "report.md", markdown_text(title, page, warning))
    write_text(out / "report.html", html_text(title, page, warning, images))
    return {"markdown": out / "report.md", "html": out / "report.html", "figures": written}
