"""torchtitan 0.3.0's own ``torchtitan.train.main()`` on a CPU: run this file as torchtitan's entry point.

    python tests/integrations/titan_cpu.py --module delaylab.integrations.torchtitan --config llama3_tiny_2bw
    python -m torch.distributed.run --nproc_per_node 2 tests/integrations/titan_cpu.py ... (gloo)

torchtitan assumes an accelerator (or NCCL) in four places that its flags do not reach; each shim
below replaces one of them and nothing else (the Trainer, its train step, the model, the optimizers,
the checkpointer and the entry point run unmodified):

1. ``torchtitan.tools.utils.device_type``: ``"cuda"`` when torch finds no accelerator, so the
   model is materialized on a CUDA device that is not there. Set to ``"cpu"`` (and its module to
   ``torch.cpu``) before any torchtitan module copies it.
2. The device memory monitor reads ``torch.cuda``'s allocator statistics (no CPU counterpart):
   one that reports nothing.
3. ``set_pg_timeouts`` (after the first step) calls ``barrier(device_ids=[current_device()])`` and
   ``synchronize()`` of the device module, which a gloo group on the CPU refuses: skipped.
4. FSDP2 (``dp_shard > 1``): torchtitan sets the gradient divide factor to 1, which FSDP2 turns
   into a reduce-scatter with ``PREMUL_SUM(1.0)``, an op gloo does not have. The same sum without
   the premultiplication by 1 (``set_force_sum_reduction_for_comms``): the same numbers.

``DELAYLAB_TITAN_DUMP=FILE`` (a test's probe): after training, each rank saves its model parts'
parameters (``{fqn: tensor}``) and what the optimizer container counted to ``FILE.<rank>``.
"""

from __future__ import annotations

import os
import sys


def apply_shims() -> None:
    import torch
    import torchtitan.tools.utils as utils

    utils.device_type, utils.device_module = "cpu", torch.cpu  # 1.

    import torchtitan.components.metrics as metrics
    import torchtitan.distributed.utils as dist_utils

    class NoMemoryMonitor:  # 2.
        device_name = "cpu"

        def get_peak_stats(self):
            return metrics.DeviceMemStats(0, 0, 0, 0, 0, 0)

        def reset_peak_stats(self):
            pass

    metrics.build_device_memory_monitor = NoMemoryMonitor
    dist_utils.set_pg_timeouts = lambda timeout, parallel_dims: None  # 3.

    import torchtitan.distributed.fsdp as fsdp

    divide = fsdp.disable_fsdp_gradient_division

    def divide_by_one_with_a_plain_sum(model):  # 4.
        divide(model)
        for module in model.modules():
            if isinstance(module, fsdp.FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    fsdp.disable_fsdp_gradient_division = divide_by_one_with_a_plain_sum


def _dump_after_training(path: str) -> None:
    """Wrap ``Trainer.train`` (and ``train_step``, to look at the first call) so that each rank saves
    its weights, the updates each optimizer counted and the live gradients left by the first call."""
    import torch
    from torchtitan.trainer import Trainer

    train, train_step = Trainer.train, Trainer.train_step
    first: dict = {}

    def train_step_and_look(self, data_iterator):
        out = train_step(self, data_iterator)
        if not first:  # after the first call's optimizer step: which parameters hold a nonzero gradient
            named = [(n, p) for m in self.model_parts for n, p in m.named_parameters()]
            first["params"] = len(named)
            first["with_gradient"] = [n for n, p in named if p.grad is not None and bool(p.grad.ne(0).any())]
        return out

    def train_and_dump(self):
        train(self)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        # full_tensor(): an FSDP2 shard's whole parameter (a collective every rank makes, in one order)
        weights = {fqn: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                   for m in self.model_parts for fqn, p in m.named_parameters()}
        counts = [d.group_updates for d in getattr(self.optimizers, "optimizers", [])
                  if hasattr(d, "group_updates")]
        torch.save({"weights": weights, "updates": counts, "step": self.step, "first_call": first},
                   f"{path}.{rank}")

    Trainer.train, Trainer.train_step = train_and_dump, train_step_and_look


def launch(config: str, out, *flags: str, ranks: int = 1, trains: bool = True, timeout: float = 300) -> dict:
    """Run ``torchtitan.train`` through this file on ``ranks`` gloo processes (torchrun, standalone);
    returns ``{"weights": {fqn: tensor} over all ranks, "updates": per rank, "first_call": per rank,
    "log": str}`` (only the log when it ``trains`` not, as a seed checkpoint's run). A failed run raises
    with the log's tail."""
    import subprocess
    from pathlib import Path

    import torch

    out = Path(out)
    dump = out / "dump.pt"
    env = {**os.environ, "DELAYLAB_TITAN_DUMP": str(dump), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", __file__,
           "--module", "delaylab.integrations.torchtitan", "--config", config, "--dump-folder", str(out), *flags]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    if proc.returncode:
        raise RuntimeError(f"torchtitan.train exited {proc.returncode}:\n{log[-4000:]}")
    result = {"weights": {}, "updates": [], "first_call": [], "log": log}
    for r in range(ranks if trains else 0):
        d = torch.load(f"{dump}.{r}")
        result["weights"].update(d["weights"])
        result["updates"].append(d["updates"])
        result["first_call"].append(d["first_call"])
    return result


def main() -> None:
    apply_shims()
    if os.environ.get("DELAYLAB_TITAN_DUMP"):
        _dump_after_training(os.environ["DELAYLAB_TITAN_DUMP"])
    import torchtitan.train

    torchtitan.train.main()


if __name__ == "__main__":
    sys.exit(main())
