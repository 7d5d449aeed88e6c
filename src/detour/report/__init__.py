"""The report stage: `detour report RUN_DIR` writes report.md and a self-contained report.html from a study or twins folder."""
