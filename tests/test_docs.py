"""The docs a newcomer reads: a short README, the config reference generated from the fields' descriptions (and
current), and a tree dated by dates and commits, not by numbered work periods."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT


def test_the_readme_is_short():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150 and len(text.split()) <= 1500, (len(text.splitlines()), len(text.split()))
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        assert (ROOT / link).exists(), link


def test_the_config_reference_is_generated_and_current():
    proc = subprocess.run([sys.executable, "scripts/config_reference.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    from pipeline.config import Config

    text = (ROOT / "docs" / "config.md").read_text()
    for section, field in Config.model_fields.items():
        for key in field.annotation.model_fields:
            assert f"| `{key}` |" in text[text.index(f"## `{section}`"):], f"{section}.{key}"


def test_nothing_is_dated_by_numbered_work_periods():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = [f"{name}:{n}" for name in files if name.endswith((".py", ".md", ".yaml", "Makefile"))
             and (ROOT / name).exists()
             for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1)
             if re.search(r"\b[Ss]essions? \d", line) and name != "tests/test_docs.py"]
    assert not found, found[:20]
