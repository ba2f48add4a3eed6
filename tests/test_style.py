"""House rules that a reviewer would otherwise have to remember (shared/STYLE.md)."""

import re
import subprocess
import sys

from tests.conftest import ROOT

LIBRARY_DIRS = ("modeling", "data_prep", "training")


def python_files(*dirs):
    for d in dirs:
        yield from sorted((ROOT / d).glob("*.py"))


def test_flags_only_in_entrypoints():
    offenders = []
    for path in python_files(*LIBRARY_DIRS):
        text = path.read_text()
        reads_flags = re.search(r"flags\.FLAGS|from absl import .*flags|import absl\.flags", text)
        if reads_flags and "app.run(" not in text:
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"library modules read absl flags (pass plain values down): {offenders}"


def test_entrypoints_open_with_an_example_command():
    scripts = [p for p in ROOT.glob("*.py")] + [
        p for p in python_files(*LIBRARY_DIRS) if "app.run(" in p.read_text()
    ]
    assert scripts
    for path in scripts:
        head = path.read_text().split('"""')[1] if path.read_text().startswith('"""') else ""
        assert "python " in head, f"{path.name}: module docstring needs one example command"


def test_no_pickle_loading():
    for path in python_files(*LIBRARY_DIRS):
        text = path.read_text()
        assert not re.search(r"pickle\.loads?\(|np\.load\([^)]*allow_pickle=True", text), path


def test_ruff_check_and_format_are_clean():
    for args in (["check", "."], ["format", "--check", "."]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]
