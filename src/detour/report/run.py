"""`detour report`: report.md and a self-contained report.html from a study or twins folder.

    detour report runs/study
    detour report runs/tiny-twins --out runs/tiny-twins-report

RUN_DIR is a study folder (study.json, arms/<arm>/, twins.json, eval/, analysis/, needle/), the
folder of `detour twins --out DIR` (twins.json and DIR/<arm>/), or the folder of a study run at
several sizes (sizes/<size>/, each a study folder), for which it writes the capacity comparison
(detour.report.capacity). Sections appear for what exists;
one line lists what was not run. Figures go to OUT/report-figures/ (shown by report.md) and are
embedded in report.html; OUT defaults to RUN_DIR. What each section holds and which file it comes
from: docs/report.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                        help="a study folder (study.json) or a `detour twins` folder (twins.json)")
    parser.add_argument("--out", type=Path, help="where report.md, report.html and report-figures/ go (default RUN_DIR)")


def run(args: argparse.Namespace) -> int:
    from detour.report.capacity import is_sizes_folder, write_capacity_report
    from detour.report.render import write_report

    if is_sizes_folder(args.run_dir):  # a study run at several sizes: the comparison across them
        if args.out is not None:
            from detour.errors import DetourError

            raise DetourError("--out: the capacity comparison is written into its study folder; leave --out out")
        paths = write_capacity_report(args.run_dir)
    else:
        paths = write_report(args.run_dir, args.out)
    print(f"wrote {paths['markdown']}")
    print(f"wrote {paths['html']}")
    return 0
