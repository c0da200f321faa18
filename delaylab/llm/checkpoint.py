"""One checkpoint layout for every engine: ``RUN/ckpt/``, folders of ``torch.distributed.checkpoint``.

::

    ckpt/step_0000040/stage_0/          the state after update 40 of stage 0: a DCP folder
    ckpt/step_0000040/stage_1/          (.metadata, __0_0.distcp), one part per pipeline stage
    ckpt/step_0000050/stage_0.pending/  a part being written, or written and not yet good: never read

The simulator is one stage (``stage_0`` holds the whole run, at ``D`` replicas too); a pipeline of
``P`` stages has ``P`` parts per step, and each stage writes its own at its own update: no flush, no
barrier across stages. Step ``K`` is *complete* once every stage's part is in place; a resume starts
every stage from the newest complete step and drops what is newer (:meth:`Checkpoints.drop_after`).
Each stage keeps its last :data:`KEEP` parts.

A stage's data-parallel replicas hold the same state and write its part together, as one DCP save
over the stage's ``dp`` group: group rank 0 writes the replicated tensors and the rest, FSDP2's
shards are written by their owners. The part goes *beside* its place (``stage_s.pending``) and group
rank 0 renames it into place once it is good (:meth:`Checkpoints.commit`), so a kill during a write
leaves the last good part readable. When is a part good? The pipeline's at once; the simulator's
once a finite loss has been computed at its weights (the next call, or the final evaluation), so a
diverged run keeps its last good checkpoint and never the weights that blew up.

A part is a dict: ``format``, ``step``, ``stage``, ``config``, ``rng`` (:func:`rng_state`),
``loop`` (the run folder's state, from the rank that writes the folder) and the engine's state.
Loading needs no template: the structure is in the part (a pytree spec beside the tensors).
The layouts of delaylab 0.1.0 (``ckpt.pt``; a DCP folder ``ckpt/``; ``ckpt/step_K/stage_s.pt``),
format 1, are refused with one line.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._pytree import keystr, tree_flatten_with_path, tree_unflatten, treespec_dumps, treespec_loads

from delaylab.errors import ConfigError, MissingFile, WriteFailed

FORMAT = 2
ROOT = "ckpt"
MARKS = (ROOT, "ckpt.pt")  # names whose presence means a folder holds a run (ckpt.pt: format 1)
KEEP = 2
PAUSE_AT = "DELAYLAB_CHECKPOINT_PAUSE_AT"  # step K: the save of K stops mid-write (the kill-during-write test)
_STEP = re.compile(r"^step_(\d+)$")
_META = "meta"


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:07d}"


def part_path(root: Path, step: int, stage: int) -> Path:
    return step_dir(root, step) / f"stage_{stage}"


def steps_on_disk(root: Path) -> list[int]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _STEP.match(p.name)))


def check_format(root: Path) -> None:
    """A one-line error for a run folder whose checkpoints are in delaylab 0.1.0's layout (format 1)."""
    root = Path(root)
    old = [(root.parent / "ckpt.pt", "one file per run"), (root / ".metadata", "one DCP folder per run")]
    old += [(p, "one file per stage") for p in sorted(root.glob("step_*/stage_*.pt"))[:1]]
    for path, what in old:
        if path.exists():
            raise ConfigError(f"{path}: a checkpoint in format 1 (delaylab 0.1.0 up to commit 514494e, {what}); "
                              f"this delaylab reads format {FORMAT} (ckpt/step_K/stage_s/): finish that run with "
                              f"the version that started it, or start a new one")


def latest_complete(root: Path, stages: int) -> int | None:
    """The newest step that every stage has in place, or ``None``."""
    check_format(root)
    done = [k for k in steps_on_disk(root) if all(part_path(root, k, s).is_dir() for s in range(stages))]
    return done[-1] if done else None


def require_latest(root: Path, stages: int) -> int:
    """The newest complete step in ``root``, or a one-line error."""
    step = latest_complete(root, stages)
    if step is None:
        what = "checkpoint" if stages == 1 else "complete pipeline checkpoint"
        raise MissingFile(f"no {what} to resume in {root}")
    return step


def load_part(root: Path, step: int, stage: int, mesh=None, group=None) -> dict:
    """Stage ``stage``'s part of ``step``, tensors on the CPU (FSDP2 shards as DTensors on ``mesh``,
    whole without one); every member of ``group`` (the stage's replicas) must call it alike."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    path = part_path(root, step, stage)
    try:
        part = _load(path, mesh, group)
    except (Exception, CheckpointException) as err:  # a damaged or foreign folder
        raise ConfigError(f"{path}: not a delaylab checkpoint ({type(err).__name__}){_older(root, step)}") from None
    _check_part(path, part)
    return part


def _check_part(path: Path, part) -> None:
    if not isinstance(part, dict) or part.get("format") != FORMAT:
        found = part.get("format", "?") if isinstance(part, dict) else "?"
        raise ConfigError(f"{path}: checkpoint format {found}; this delaylab reads format {FORMAT}")


def _older(root: Path, step: int) -> str:
    """The way out of a damaged step: the hint to remove it (when an older complete step exists)."""
    return f"; remove {step_dir(root, step)} to resume from an older step" if len(steps_on_disk(root)) > 1 else ""


def verify(root: Path, step: int, stages: int) -> None:
    """Raise (one line) unless every stage's part of ``step`` is readable: its index, the small entry
    holding the structure (format, config) and data files as long as the index says. Cheap (no tensor
    is read): what a launcher checks before any process starts. DCP keeps no checksums, so a flipped
    byte inside a tensor is not seen."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    for stage in range(stages):
        path = part_path(root, step, stage)
        try:
            if not (path / ".metadata").is_file():
                raise FileNotFoundError(path / ".metadata")
            reader = dcp.FileSystemReader(str(path))
            index = reader.read_metadata().storage_data
            for info in index.values():
                file = path / info.relative_path
                if file.stat().st_size < info.offset + info.length:
                    raise EOFError(f"{info.relative_path} is {file.stat().st_size} bytes, its index needs "
                                   f"{info.offset + info.length}")
            meta = {_META: io.BytesIO()}
            with _quiet():
                dcp.load(meta, storage_reader=reader, no_dist=True)
            meta[_META].seek(0)
            info = torch.load(meta[_META], weights_only=True)
            # the part without its tensors: the structure and the plain values
            skeleton = tree_unflatten([k[1] if k[0] == "value" else None for k in info["kinds"]],
                                      treespec_loads(info["spec"]))
        except (Exception, CheckpointException) as err:
            detail = str(err) if isinstance(err, EOFError) else type(err).__name__
            raise ConfigError(f"{path}: damaged checkpoint ({detail}){_older(root, step)}") from None
        _check_part(path, skeleton)


def read(out: str | os.PathLike, stage: int = 0, stages: int = 1) -> dict:
    """Stage ``stage``'s part of the newest complete checkpoint of the run in ``out``, read in this
    process (a sharded run's tensors whole): the simulator's ``read(out)["model"]`` is its weights."""
    root = Path(out) / ROOT
    return load_part(root, require_latest(root, stages), stage)


def rng_state(device: torch.device) -> dict:
    """Torch's RNG state (and this rank's CUDA device's), as bytes."""
    state = {"torch": torch.get_rng_state().numpy().tobytes()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device).numpy().tobytes()
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(state["cuda"]), dtype=torch.uint8), device)


class Checkpoints:
    """Stage ``stage``'s checkpoints in ``out/ckpt`` (``out=None``: none are written).

    ``group``: the stage's data-parallel replicas (``None`` in one process); they call every
    method alike. ``stages``: how many parts make a step complete.
    """

    def __init__(self, out: str | os.PathLike | None, stages: int = 1, stage: int = 0, group=None):
        self.root = Path(out) / ROOT if out is not None else None
        self.stages, self.stage, self.group = stages, stage, group
        self.lead = group is None or dist.get_rank(group) == 0  # moves and removes folders
        self._pending: tuple[Path, Path] | None = None  # (written, its place)

    def save(self, step: int, state: dict) -> None:
        """Write ``state`` as this stage's part of ``step``, beside its place (see :meth:`commit`)."""
        if self.root is None:
            return
        from torch.distributed.checkpoint.api import CheckpointException

        place = part_path(self.root, step, self.stage)
        pending = place.with_name(place.name + ".pending")
        state = {**state, "format": FORMAT, "step": step, "stage": self.stage}
        try:
            _save(state, _writer(pending, step), self.group, self.lead)
        except (OSError, CheckpointException) as err:  # a full disk, a file-size limit, no permission
            if self.lead:  # what was written of it frees its room
                shutil.rmtree(pending, ignore_errors=True)
            kept = self.latest()
            raise WriteFailed(f"cannot write {pending}: {_why_not_written(err, pending)}; "
                              + (f"the last good checkpoint {kept} is kept" if kept else "no checkpoint was written"),
                              started=True) from None
        self._pending = (pending, place)

    def commit(self) -> None:
        """The written part is good: move it into place and drop this stage's parts beyond :data:`KEEP`."""
        if self._pending is None:
            return
        pending, place = self._pending
        self._pending = None
        if not self.lead:
            return
        os.replace(pending, place)
        mine = [k for k in steps_on_disk(self.root) if part_path(self.root, k, self.stage).is_dir()]
        for k in mine[:-KEEP]:
            self._remove(part_path(self.root, k, self.stage))

    def discard(self) -> None:
        """The written part is not good (its weights gave a NaN): forget it."""
        if self._pending is not None and self.lead:
            shutil.rmtree(self._pending[0], ignore_errors=True)
        self._pending = None

    def latest(self) -> Path | None:
        """The newest complete step's folder (what a resume would read), or ``None``."""
        step = latest_complete(self.root, self.stages) if self.root is not None else None
        return None if step is None else step_dir(self.root, step)

    def load(self, step: int, mesh=None) -> dict:
        """This stage's part of ``step`` (every replica of the stage calls it)."""
        return load_part(self.root, step, self.stage, mesh, self.group)

    def drop_after(self, step: int) -> None:
        """Before continuing from ``step``: drop this stage's newer parts and pending writes (a
        previous session's, never complete), so that no save meets one."""
        if not self.lead:
            return
        for k in steps_on_disk(self.root):
            place = part_path(self.root, k, self.stage)
            for stale in ([place] if k > step else []) + [place.with_name(place.name + ".pending")]:
                if stale.exists():
                    self._remove(stale)

    @staticmethod
    def _remove(path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)
        try:
            path.parent.rmdir()  # the last stage to leave a step removes its folder
        except OSError:
            pass


def _why_not_written(err: BaseException, folder: Path) -> str:
    """The reason a save failed, in words: the OSError inside DCP's wrapper when there is one (torch.save
    inside DCP loses it: its zip writer reports a short write as a position mismatch), else what the
    process may write (a file-size limit, the free space), else the error's first line."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(err, CheckpointException):  # the first failing rank's own exception
        err = next(iter(err.failures.values()))[0]
    while err is not None and not isinstance(err, OSError):
        err = err.__cause__ or err.__context__
    if err is not None:
        return f"{err.strerror or err}" + (f" ({Path(err.filename).name})" if err.filename else "")
    try:
        import resource  # POSIX

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            return f"a write failed under a file-size limit of {limit} bytes (ulimit -f)"
    except ImportError:
        pass
    place = next((p for p in (folder, *folder.parents) if p.exists()), Path("/"))
    return f"a write failed with {shutil.disk_usage(place).free} bytes free on its disk"


# -- a state as a DCP folder ---------------------------------------------------------------------
# A state (nested dicts, lists and tuples of tensors and plain values) is flattened with torch's
# pytree: tensors go to DCP under their path in the tree, everything else, with the tree's
# structure, into one entry written by torch.save (read back with weights_only=True).
def _writer(folder: Path, step: int):
    import torch.distributed.checkpoint as dcp

    writer = dcp.FileSystemWriter(str(folder))
    if os.environ.get(PAUSE_AT) == str(step):  # the data files written, the metadata not yet
        finish = writer.finish

        def paused(metadata, results):
            time.sleep(3600)
            return finish(metadata, results)

        writer.finish = paused
    return writer


def _save(state: dict, writer, group, lead: bool) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DTensor

    leaves, spec = tree_flatten_with_path(state)
    tensors, kinds = {}, []
    for path, leaf in leaves:
        key = keystr(path)
        if isinstance(leaf, DTensor):  # every rank writes its own shards
            tensors[key] = leaf
            kinds.append(("dtensor", key, tuple(leaf.shape), leaf.dtype))
        elif isinstance(leaf, torch.Tensor):  # replicated: the group's rank 0 writes it
            if lead:
                tensors[key] = leaf
            kinds.append(("tensor", key))
        else:
            kinds.append(("value", leaf))
    if lead:
        meta = io.BytesIO()
        torch.save({"spec": treespec_dumps(spec), "kinds": kinds}, meta)
        tensors[_META] = meta
    with _quiet():
        dcp.save(tensors, storage_writer=writer, process_group=group, no_dist=group is None)


def _load(folder: Path, mesh, group) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Shard, distribute_tensor

    if not (folder / ".metadata").is_file():
        raise FileNotFoundError(folder)
    reader = dcp.FileSystemReader(str(folder))
    meta = {_META: io.BytesIO()}
    with _quiet():
        dcp.load(meta, storage_reader=reader, process_group=group, no_dist=group is None)
    meta[_META].seek(0)
    info = torch.load(meta[_META], weights_only=True)
    shapes = reader.read_metadata().state_dict_metadata
    targets = {}
    for kind in info["kinds"]:
        if kind[0] == "tensor":
            m = shapes[kind[1]]
            targets[kind[1]] = torch.empty(m.size, dtype=m.properties.dtype)
        elif kind[0] == "dtensor":  # FSDP2 shards dim 0 over the dp mesh; no mesh: the whole tensor
            full = torch.empty(kind[2], dtype=kind[3])
            targets[kind[1]] = full if mesh is None else distribute_tensor(full, mesh, [Shard(0)])
    with _quiet():
        dcp.load(targets, storage_reader=dcp.FileSystemReader(str(folder)), process_group=group,
                 no_dist=group is None)
    leaves = [kind[1] if kind[0] == "value" else targets[kind[1]] for kind in info["kinds"]]
    return tree_unflatten(leaves, treespec_loads(info["spec"]))


@contextlib.contextmanager
def _quiet():
    """DCP warns on every save and load without a process group; one process is what is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
