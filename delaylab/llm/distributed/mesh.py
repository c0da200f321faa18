"""The one device mesh of every run: torch's ``init_device_mesh``, dims ``dp`` and ``pp``.

``D`` data-parallel replicas of a ``P``-stage pipeline take ``P * D`` ranks laid out row-major
on a ``(D, P)`` mesh: global rank ``r`` is stage ``s = r % P`` of replica ``d = r // P``. The
simulator is the ``P = 1`` case (its ``D`` replicas form the one ``dp`` group). Stage ``s``'s
replicas ``{s, P + s, ..., (D-1) P + s}`` form its ``dp`` group (they average gradients and save
the stage's checkpoint); replica ``d``'s stages ``{dP, ..., dP + P - 1}`` form its ``pp`` group
(they exchange activations and gradients). Under ``torchrun`` with ``G`` processes per node, a
``G`` that is a multiple of ``P`` puts whole replicas on each node: the pipeline's messages stay
inside a node and only the gradient all-reduces cross nodes. Every subgroup gets the run's
timeout (torch would give it the 30-minute default).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist


@dataclass
class Mesh:
    """This rank's place: replica ``d`` of ``D``, stage ``s`` of ``P``, and its groups."""

    D: int
    P: int
    d: int
    s: int
    dp_group: object  # this stage's replicas (size D)
    pp_group: object  # this replica's stages (size P)
    stage_ranks: list[int]  # global rank of each stage of this replica
    tied_group: object | None  # first and last stage of this replica (tied embeddings), else None
    device_mesh: object

    @property
    def rank(self) -> int:
        return self.stage_ranks[self.s]

    @property
    def dp_mesh(self):
        """The 1-D ``dp`` sub-mesh (what FSDP2 shards over)."""
        return self.device_mesh["dp"]



def place(rank: int, P: int, D: int) -> str:
    """Where global rank ``rank`` sits, naming only the dims the run has: ``stage s, replica d``."""
    s, d = rank % P, rank // P
    return ", ".join(([f"stage {s}"] if P > 1 else []) + ([f"replica {d}"] if D > 1 or P == 1 else []))


def _options(backend: str, timeout: timedelta):
    """Backend options that carry ``timeout`` (subgroups otherwise get torch's 30-minute default)."""
    opts = dist.ProcessGroupNCCL.Options() if backend == "nccl" else dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    return opts


def build_mesh(device_type: str, D: int, P: int, timeout_s: float, tied: bool = False) -> Mesh:
    """The ``(D, P)`` mesh on the started default group; every rank must call it alike.

    ``tied``: also one group per replica holding its first and last stage (the tied embedding's
    two holders sum their gradients there, as Megatron-LM's embedding group does).
    """
    from torch.distributed.device_mesh import init_device_mesh

    backend, timeout = dist.get_backend(), timedelta(seconds=timeout_s)
    override = {name: (backend, _options(backend, timeout)) for name in ("dp", "pp")}
    mesh = init_device_mesh(device_type, (D, P), mesh_dim_names=("dp", "pp"), backend_override=override)
    d, s = mesh.get_coordinate()
    ranks = mesh.mesh.tolist()  # ranks[d][s]: the global rank of stage s of replica d
    tied_group = None
    if tied and P > 1:  # a collective call: every rank creates every replica's group
        tied_group, _ = dist.new_subgroups_by_enumeration([[row[0], row[-1]] for row in ranks],
                                                          timeout=timeout, backend=backend)
    return Mesh(D, P, d, s, mesh.get_group("dp"), mesh.get_group("pp"), ranks[d], tied_group, mesh)
