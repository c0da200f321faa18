"""``DelayedCheckpointManager``: torchtitan's DCP checkpointer that drains an asynchronous pipeline first.

Under ``Schedule2BW`` a batch is always in flight between ``step()`` calls: its activations sit on
the stages and its gradient is not applied yet. A checkpoint taken then would drop that batch, and
the end of training would never apply the last gradient. This manager, which delaylab's configs use
in place of torchtitan's, drains the pipe before a save is due, before a validation step (whose
forward runs on the live weights: ``Schedule2BW.eval``) and after the last step (whether or not
checkpointing is enabled): it applies the gradients in flight as torchtitan's train step applies
one (clip over the pipeline, optimizer step, LR step), so the checkpoint holds one weight version and
the next call starts a new warm-up. A run resumed from it equals the uninterrupted run, which drained
at the same step. With the simulated delay (``DelayedOptimizersContainer``) the queue is saved as it
is, and only the end of training applies the gradients still queued, as the drained pipeline does:
``steps`` calls make ``steps`` updates under either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchtitan.components.checkpoint import CheckpointManager

__all__ = ["DelayedCheckpointManager"]


class DelayedCheckpointManager(CheckpointManager):
    """torchtitan's ``CheckpointManager`` plus the drain of an asynchronous schedule (see the module)."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        pass

    def __init__(self, config: Config, *, states: dict, optimizers, lr_schedulers, model_parts, **kwargs) -> None:
        # Kept before torchtitan's __init__, which returns early when checkpointing is disabled.
        self._trainer = states.get("train_state")
        self._optimizers, self._lr_schedulers, self._parts = optimizers, lr_schedulers, model_parts
        super().__init__(config, states=states, optimizers=optimizers, lr_schedulers=lr_schedulers,
                         model_parts=model_parts, **kwargs)

    def save(self, curr_step: int, last_step: bool = False) -> bool:
        """Called by the Trainer after every step, before its validation."""
        if last_step:
            self.drain()
        elif (self.enable and self._should_save(curr_step, last_step)) or self._validates(curr_step):
            self.drain(queued=False)  # the simulated delay's queue is in the checkpoint as it is
        return super().save(curr_step, last_step)

    def _validates(self, step: int) -> bool:
        """Whether the Trainer validates after this step: Schedule2BW.eval() needs an empty pipe."""
        trainer = self._trainer
        validator = getattr(trainer, "validator", None)
        return bool(trainer.config.validator.enable and validator is not None and validator.should_validate(step))

    def drain(self, queued: bool = True) -> int:
        """Apply every gradient still in flight: the asynchronous schedule's and, with ``queued``,
        the simulated delay queue's. Returns the updates that made on this rank."""
        from delaylab.integrations.torchtitan.optimizer import SCHEDULE_ATTR, DelayedOptimizersContainer

        schedules = {id(s): s for m in self._parts if (s := getattr(m, SCHEDULE_ATTR, None)) is not None}
        if schedules:
            return self._drain_pipeline(list(schedules.values()))
        updates = 0
        if queued and isinstance(self._optimizers, DelayedOptimizersContainer):
            # Every rank holds the same queue (data parallel replicas step alike): no collective here.
            # The queued gradients were clipped when they were taken.
            while self._optimizers.flush():
                self._lr_schedulers.step()
                updates += 1
            self._optimizers.zero_grad()
        return updates

    def _drain_pipeline(self, schedules) -> int:
        from torchtitan.distributed import utils as dist_utils

        trainer = self._trainer
        pp = trainer.parallel_dims.get_optional_mesh("pp")
        # Every stage runs the same number of rounds: the clip below reduces over the pipeline.
        rounds = torch.tensor(max(s.in_flight for s in schedules), device=trainer.device)
        if pp is not None:
            torch.distributed.all_reduce(rounds, op=torch.distributed.ReduceOp.MAX, group=pp.get_group())
        self._optimizers.zero_grad()  # the gradient the last step applied
        updates = 0
        for _ in range(int(rounds)):
            for s in schedules:
                s.flush()
            dist_utils.clip_grad_norm_([p for m in self._parts for p in m.parameters()],
                                       trainer.config.training.max_norm, foreach=True, pp_mesh=pp,
                                       ep_enabled=trainer.parallel_dims.ep_enabled)
            self._optimizers.step()
            updates += int(any(s.released for s in schedules))
            self._lr_schedulers.step()
            self._optimizers.zero_grad()
        return updates
