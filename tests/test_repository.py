"""What a fresh clone holds: no large files, docs that link only inside the repository, the preset
table of docs/llm.md equal to the presets, and `make notebook` writing its executed copy outside
the tracked tree."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 2 * 1024 * 1024


def _tracked(*patterns: str) -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z", "--", *patterns], cwd=ROOT, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def test_no_tracked_file_over_2_mb():
    sizes = {p: (ROOT / p).stat().st_size for p in _tracked() if (ROOT / p).is_file()}
    big = {p: s for p, s in sizes.items() if s > MAX_BYTES}
    assert not big, f"tracked files over 2 MB: {big}"
    assert sizes, "git ls-files listed nothing"


# [text](target) and reference definitions "[label]: target"; code spans are stripped first.
_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|^\s*\[[^\]]+\]:\s*(\S+)", re.M)
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def outside_links(doc: Path, root: Path = ROOT) -> list[str]:
    """The links of a Markdown file that leave ``root``: a relative target resolving outside it, or
    any target (or, in prose or code, any path) into the ``shared/`` folder beside the checkout."""
    text = doc.read_text()
    bad = [m.group(0) for m in re.finditer(r"shared/reference\b|\.\./shared/", text)]
    for m in _LINK.finditer(_CODE.sub("", text)):
        target = (m.group(1) or m.group(2)).split("#")[0]
        if not target or re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # an anchor, http:, mailto:
            continue
        resolved = (root / target.lstrip("/")) if target.startswith("/") else (doc.parent / target)
        if not resolved.resolve().is_relative_to(root.resolve()):
            bad.append(target)
    return bad


def test_docs_link_only_inside_the_repository():
    docs = [ROOT / p for p in _tracked("README.md", "docs/*.md", "docs/**/*.md")]
    assert ROOT / "README.md" in docs and len(docs) > 5
    bad = {str(d.relative_to(ROOT)): b for d in docs if (b := outside_links(d))}
    assert not bad, f"links that leave the repository: {bad}"


def test_outside_links_catches_each_kind(tmp_path):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    doc = root / "docs" / "a.md"
    doc.write_text("[ok](b.md) [ok](../README.md#x) [web](https://x.org/a) [anchor](#y) `../../outside.md`\n")
    assert outside_links(doc, root) == []
    doc.write_text("[up](../../outside.md)\n[ref]: ../../../etc/passwd\nsee shared/reference/notes.md\n")
    assert sorted(outside_links(doc, root)) == sorted(["../../outside.md", "../../../etc/passwd",
                                                       "shared/reference"])


def _count(text: str) -> float:
    return float(text.rstrip("M")) * 1e6


def test_llm_preset_table_matches_the_presets():
    """Every preset has a row in docs/llm.md whose shape and parameter count are the model's (at
    the byte vocabulary for the CPU presets, at 49152 for the GPU ones, built on the meta device)."""
    import torch

    from delaylab.llm.model import GPT
    from delaylab.llm.model_config import PRESETS

    rows = {}
    for line in (ROOT / "docs" / "llm.md").read_text().splitlines():
        m = re.match(r"\| `(\w+)` \| (\d+) \| (\d+) \| (\d+)(?: \((\d+)\))? \| (GELU|SwiGLU) (\d+) \| (\d+) \| ([^|]+)\|",
                     line)
        if m:
            rows[m.group(1)] = m
    assert set(rows) == set(PRESETS)
    for name, cfg in PRESETS.items():
        m = rows[name]
        assert (int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(8))) == \
            (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.block_size), name
        assert int(m.group(5) or cfg.n_head) == cfg.kv_heads and int(m.group(7)) == cfg.hidden, name
        params = m.group(9)
        byte = "byte vocab" in params
        ctx = re.search(r"context (\d+)", params)
        kwargs = {"vocab_size": 256} if byte else {}
        if ctx:
            kwargs["block_size"] = int(ctx.group(1))
        from dataclasses import replace

        with torch.device("meta"):
            model = GPT(replace(cfg, **kwargs))
        total = sum(p.numel() for p in model.parameters())
        stated = re.findall(r"([\d.]+M)", params)
        if byte:
            digits = len(stated[0].rstrip("M").split(".")[-1])
            assert round(total / 1e6, digits) == float(stated[0].rstrip("M")), (name, total)
        else:  # "134.5M + 1.2M positions"
            positions = model.embed.pos.weight.numel()
            assert round((total - positions) / 1e6, 1) == _count(stated[0]) / 1e6, (name, total)
            assert round(positions / 1e6, 1) == _count(stated[1]) / 1e6, (name, positions)


def test_make_notebook_writes_outside_the_tracked_tree(tmp_path):
    """`make notebook` runs the tracked notebook and writes the executed copy under runs/ (ignored)."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    out = subprocess.run(["make", "-n", "notebook", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"jupyter-execute .*?--output=(\S+) (\S+\.ipynb)", out.replace("\\\n", " "))
    assert m, out
    written = Path(m.group(1) + ".ipynb")
    assert written.is_absolute() and written.is_relative_to(ROOT / "runs")
    assert (ROOT / "docs" / "notebooks" / m.group(2)).is_file()
    ignored = subprocess.run(["git", "check-ignore", "-q", str(written)], cwd=ROOT)
    assert ignored.returncode == 0, f"{written} is not ignored by git"


def test_every_install_hint_names_a_declared_extra():
    """delaylab is installed from its checkout, so a message that says `pip install 'delaylab[x]'`
    cannot work; each hint goes through errors.install_hint with an extra pyproject declares."""
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = []
    for path in (ROOT / "delaylab").rglob("*.py"):
        text = path.read_text()
        assert "pip install 'delaylab[" not in text, path
        named += re.findall(r"install_hint\(['\"](\w+)['\"]\)", text)
    assert named and set(named) <= extras, set(named) - extras
