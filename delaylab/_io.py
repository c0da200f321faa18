"""Files every module writes: plain JSON (non-finite floats as null) and atomic saves.

Atomic means temp file + rename, so a crash never leaves half a file behind.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def jsonable(obj: Any) -> Any:
    """Plain-JSON version of ``obj``: numpy/torch scalars become numbers, non-finite floats null.

    JSON has no NaN or infinity; ``null`` is the honest encoding of "no finite value".
    """
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy / torch
        return jsonable(obj.tolist())
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    try:
        val = float(obj)
    except (TypeError, ValueError):
        return str(obj)
    return val if math.isfinite(val) else None


def dumps(obj: Any, **kw) -> str:
    return json.dumps(jsonable(obj), allow_nan=False, **kw)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON atomically (temp file + rename) so a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    _replace_with(tmp, path, lambda: tmp.write_text(dumps(obj, indent=2) + "\n"))


def save_torch(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` atomically (a checkpoint is either the old one or the new one)."""
    import torch

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    _replace_with(tmp, path, lambda: torch.save(obj, tmp))


def _replace_with(tmp: Path, path: Path, write) -> None:
    """``write()`` the temporary file, then rename it over ``path``; a failed write (a full disk)
    removes the temporary file and leaves ``path`` as it was."""
    try:
        write()
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename is None:  # a failed write() names no file
            err.filename = str(path)
        raise


def figure_path(path: str | os.PathLike) -> Path:
    """``path`` if its suffix names a format matplotlib writes (check it before the work), else a
    one-line error."""
    from matplotlib.backend_bases import FigureCanvasBase

    from delaylab.errors import ConfigError

    path = Path(path)
    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in formats:
        raise ConfigError(f"{path}: a figure needs a suffix matplotlib writes ({', '.join(sorted(formats))})")
    return path


def save_figure(fig: Any, path: str | os.PathLike, **kw) -> Path:
    """``fig.savefig(path)``, its folder made first; a path that takes no file is one line."""
    from delaylab.errors import WriteFailed, cannot_write

    path = figure_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, **kw)
    except OSError as err:
        raise WriteFailed(cannot_write(path, err)) from None
    return path
