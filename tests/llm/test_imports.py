"""The direction of imports under delaylab/llm (DESIGN.md), read from the source with ast: every
import statement counts, the ones inside functions too."""

import ast
from pathlib import Path

import pytest

import delaylab

LLM = Path(delaylab.__file__).parent / "llm"

RULES = {
    "": ("delaylab.commands", "delaylab.cli"),  # nothing under llm imports the command line
    "pipeline": ("delaylab.llm.run",),  # the pipeline package imports nothing of the run stack above it
    "distributed": ("delaylab.llm.run", "delaylab.llm.pipeline"),  # the distributed layer is below both
}


def imported(path: Path) -> set[str]:
    """Every module an import statement in ``path`` names (``from a.b import c``: ``a.b`` and ``a.b.c``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def offenders(folder: Path, banned: tuple[str, ...]) -> list[str]:
    return [f"{p.relative_to(folder)} imports {name}" for p in sorted(folder.rglob("*.py"))
            for name in sorted(imported(p)) if any(name == b or name.startswith(b + ".") for b in banned)]


@pytest.mark.parametrize("folder", sorted(RULES))
def test_imports_run_one_way(folder):
    assert (LLM / folder).is_dir() and len(list((LLM / folder).rglob("*.py"))) >= 3
    assert offenders(LLM / folder, RULES[folder]) == []


@pytest.mark.parametrize("folder", sorted(RULES))
def test_the_check_catches_a_planted_import(folder, tmp_path):
    banned = RULES[folder][-1]
    (tmp_path / "planted.py").write_text(f"import os\n\n\ndef f():\n    from {banned} import x\n")
    assert offenders(tmp_path, RULES[folder]) == [f"planted.py imports {banned}", f"planted.py imports {banned}.x"]
