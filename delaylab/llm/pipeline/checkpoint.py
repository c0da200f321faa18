"""Flush-free pipeline checkpoints: each stage saves at its own update, no barrier.

Stage ``s`` writes ``ckpt/step_K/stage_s.pt`` (atomically) right after its update ``K-1``:
all its weight slots (for 2BW ``V_{K-1}`` and ``V_K``), optimizer state (EF buffer
included), LR scheduler, RNG, and the loop state of the last stage. The stages reach that
point at different times; step ``K`` is *complete* once every stage's file exists. A resumed
run starts every stage at group ``K`` with a fresh warm-up: the microbatches that were in
flight are recomputed from the saved versions and the data, which are pure functions of
``(seed, microbatch)``, so the resumed run equals the uninterrupted one (the 2BW paper's
fork restarts the same way). Each stage keeps its last two files.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from delaylab.errors import ConfigError
from delaylab._io import save_torch

_STEP = re.compile(r"^step_(\d+)$")


def stage_path(root: Path, step: int, stage: int) -> Path:
    return Path(root) / f"step_{step:07d}" / f"stage_{stage}.pt"


def save_stage(root: Path, step: int, stage: int, state: dict, keep: int = 2) -> Path:
    """Write stage ``stage``'s checkpoint of ``step`` atomically; drop its older ones beyond ``keep``."""
    path = stage_path(root, step, stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_torch(state, path)
    mine = sorted(s for s in steps_on_disk(root) if stage_path(root, s, stage).is_file())
    for old in mine[:-keep]:
        stage_path(root, old, stage).unlink(missing_ok=True)
        try:
            stage_path(root, old, stage).parent.rmdir()  # the last stage to leave removes it
        except OSError:
            pass
    return path


def steps_on_disk(root: Path) -> list[int]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _STEP.match(p.name)))


def latest_complete(root: Path, stages: int) -> int | None:
    """The newest step that every stage has saved, or ``None``."""
    done = [s for s in steps_on_disk(root) if all(stage_path(root, s, i).is_file() for i in range(stages))]
    return done[-1] if done else None


def load_stage(root: Path, step: int, stage: int) -> dict:
    path = stage_path(root, step, stage)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:
        raise ConfigError(f"{path}: not a pipeline checkpoint ({type(err).__name__})") from None
