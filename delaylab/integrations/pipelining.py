"""PipeDream-2BW and PipeDream as ``torch.distributed.pipelining`` schedules.

torch's schedules fill and drain the pipe inside every ``step()``, so the optimizer step that
follows sees the gradient of the weights it just used: synchronous training. These keep the
pipe full *across* ``step()`` calls instead, on torch's own :class:`PipelineStage` objects, and
are used exactly like ``Schedule1F1B`` (one ``step(*args, target=..., losses=...)`` per batch,
then the caller's unmodified ``optimizer.step()``)::

    schedule = Schedule2BW(stage, n_microbatches=M, loss_fn=loss_fn)
    for x, y in batches:
        schedule.step(x, target=y, losses=losses)   # F(batch k), B(batches k-1, k) interleaved
        optimizer.step()                            # applies batch k-1's gradient
        optimizer.zero_grad()
    while schedule.flush():                         # the end of training, or a checkpoint
        optimizer.step()
        optimizer.zero_grad()

**Order.** Every stage runs one continuous 1F1B stream of microbatches ``n = kM + j`` (``M``
per batch): stage ``s`` keeps ``w_s = P-1-s`` forwards ahead of its backwards, so after
``F(n)`` comes ``B(n - w_s)``. Call ``k`` runs the ``M`` forwards of batch ``k`` and the
backwards that follow them (the last ``w_s`` of batch ``k-1``, the first ``M - w_s`` of batch
``k``): no warm-up, drain or barrier between calls, so the only bubble is the one warm-up at
the start (and one cool-down at :meth:`flush`). The sends and receives are torch's
``Schedule1F1B`` pattern (a forward's send fused with the next backward's receive and the
other way round), carried over the call boundary.

**Weight versions.** Batch ``k``'s forwards, its losses and its backwards run on a copy of the
weights taken when call ``k`` starts: the stage module's parameters are swapped for the copy
(torch's ``_reparametrize_module``, what ``torch.func.functional_call`` uses) around each of
them, so the optimizer may change the live weights between calls while batch ``k`` is in flight.
Whatever reaches the stage module during those ops reaches the copy: a loss function that
applies a submodule of the stage itself (torchtitan's ``ChunkedLossWrapper`` runs ``lm_head``
and its backward inside the loss), an activation checkpoint's recompute during the backward,
and the loss that torch's shape inference calls on uninitialized outputs (on a throwaway copy).
A gradient that still reaches a live weight during a call (a loss function holding the weight
tensor itself) is an error, not a silent undelayed update.
After call ``k`` each stage moves the gradient of batch ``k - d_s`` into ``p.grad`` (divided
by ``M`` with ``scale_grads``) and the caller's ``optimizer.step()`` applies it:

* ``Schedule2BW``: ``d_s = 1`` on every stage (PipeDream-2BW, Narayanan et al. 2021): update
  ``k`` applies batch ``k``'s gradient taken at the weights of update ``k-1``, which is
  ``delaylab.optim.Delayed(delay=1)`` with ``M`` accumulated microbatches. Needs ``M >= P-1``.
  The first call leaves no gradient (every ``p.grad`` is None: torch optimizers skip such a
  step; index LR schedules by updates, see :attr:`released`). With ``zero_fill=True`` such a
  call leaves zeros instead, on the parameters' device, for a trainer that reduces the gradient
  norm over the pipeline before it steps (torchtitan: the norm of an empty list is a CPU tensor,
  which NCCL refuses); its optimizer must then skip the call when ``released`` is False.
* ``SchedulePipeDream``: ``d_s = P-1-s`` (the original PipeDream with weight stashing, one
  batch per pipeline unit): ``Delayed(delay=[P-1, ..., 0])``, one param group per stage.

Memory per stage: the live weights, one copy per batch in flight (two during a call for 2BW),
the gradient buffers of the batches waiting to be applied, and ``w_s + 1`` activations, as in
1F1B. Stages must hold plain modules (no FSDP/DDP wrap: their hooks expect the live weights).
``eval()`` runs GPipe's forward on the live weights once the pipe is empty (after :meth:`flush`). These classes use private helpers of torch's pipelining
(``_batch_p2p``, ``_initialize_stage``), read in torch 2.13.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable

import torch
from torch.distributed.pipelining.schedules import (
    _TARGET_CHUNK_SPEC,
    PipelineScheduleSingle,
    _batch_p2p,
    _split_tensor,
    _wait_batch_p2p,
)
from torch.distributed.pipelining.stage import _PipelineStageBase
from torch.nn.utils.stateless import _reparametrize_module

from delaylab.errors import ConfigError

__all__ = ["Schedule2BW", "SchedulePipeDream", "SCHEDULES"]


class _AsyncSchedule(PipelineScheduleSingle):
    """One stage's flush-free 1F1B stream; the gradient of batch ``b`` is released after call ``b + delay``."""

    def __init__(
        self,
        stage,
        n_microbatches: int,
        loss_fn: Callable | None = None,
        args_chunk_spec=None,
        kwargs_chunk_spec=None,
        output_merge_spec=None,
        scale_grads: bool = True,
        *,
        delay: int,
        zero_fill: bool = False,
    ):
        name = type(self).__name__
        if not isinstance(stage, _PipelineStageBase):
            raise TypeError(f"{name} runs one stage per rank: pass its PipelineStage, got {type(stage).__name__} "
                            "(several stages per rank are not supported)")
        if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, int) or n_microbatches < 1:
            raise ConfigError(f"{name}: n_microbatches must be an integer >= 1, got {n_microbatches!r}")
        if loss_fn is None:
            raise ConfigError(f"{name} trains: it needs a loss_fn")
        super().__init__(stage, n_microbatches, loss_fn, args_chunk_spec, kwargs_chunk_spec, output_merge_spec,
                         scale_grads)
        for wrapper in ("FSDPModule", "DistributedDataParallel"):  # their hooks run the live weights
            if any(c.__name__ == wrapper for c in type(stage.submod).__mro__):
                raise ConfigError(f"{name} needs a plain module per stage, not a {wrapper}")
        M, w = n_microbatches, stage.num_stages - 1 - stage.stage_index
        # Batch b's last backward follows F(bM + M-1 + w), which call b + ceil(w/M) runs.
        if delay < -(-w // M):
            raise ConfigError(f"stage {stage.stage_index} of {stage.num_stages} with {M} microbatches per batch "
                              f"finishes a batch's backward {-(-w // M)} calls later; its delay {delay} is shorter")
        self.delay, self._lead, self.zero_fill = delay, w, zero_fill
        # Chunk ids of the stage's receive buffers and caches: microbatch n uses n % ring; at most
        # w + 1 microbatches are between their forward and backward, and one more is being received.
        self._ring = w + 2
        self._calls = 0  # step() calls so far (= batches given)
        self._next_bwd = 0  # the next microbatch to run backward
        self._pending: list = []  # sends of the last op, fused with the next op's receives
        self._pending_forward = False  # whether they are a forward's (the next stage needs them now)
        self._in_flight: list = []  # sends fired alone, waited before the next ones
        self._inputs: dict[int, tuple] = {}  # n -> (args, kwargs, target, loss_kwargs)
        self._losses: dict[int, torch.Tensor] = {}  # n -> loss until its backward (last stage)
        self._call_losses: list[torch.Tensor] = []  # this call's losses, detached (last stage)
        self._versions: dict[int, dict[str, torch.Tensor]] = {}  # batch -> its weight copy
        self._backwards: dict[int, int] = {}  # batch -> backwards done
        self._unreleased: list[int] = []  # batches whose gradient is not in p.grad yet, oldest first
        self.released = False  # whether the last step()/flush() left a gradient in p.grad
        self._guarded: list[int] = []  # ids of the live parameters that carry the guard hook
        self._in_call = False  # whether a step()/flush() is running (the guard is armed)
        self._leaks: list[str] = []  # live weights that a gradient reached during this call

    # -- the public calls ---------------------------------------------------------------------
    def step(self, *args, target=None, losses: list | None = None, return_outputs: bool = True,
             loss_kwargs: dict[str, Any] | None = None, arg_mbs: list | None = None, kwarg_mbs: list | None = None,
             target_mbs: list | None = None, **kwargs):
        """One batch: ``step(*args, target=..., losses=...)`` as torch's schedules (the batch is split
        into ``n_microbatches`` along dim 0), or already split as torchtitan 0.3.0's trainer passes it
        (``arg_mbs=``, ``kwarg_mbs=``, ``target_mbs=``). ``losses`` gets this batch's losses (last stage).
        Afterwards ``p.grad`` holds batch ``k - delay``'s gradient, or None while the pipe fills."""
        if not self._has_backward:
            raise RuntimeError(f"{type(self).__name__}.step() trains; eval() is the forward-only pass")
        if not torch.is_grad_enabled():
            raise RuntimeError("step() needs gradients enabled; it cannot run under torch.no_grad()")
        if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
            self._check_batch(args, kwargs, target)
            arg_mbs, kwarg_mbs = self._split_inputs(args, kwargs)
            if target is not None:
                target_mbs = list(_split_tensor(target, _TARGET_CHUNK_SPEC, self._n_microbatches))
        elif args or kwargs or target is not None:
            raise TypeError("pass either a whole batch (args, target=) or microbatches (arg_mbs=, target_mbs=)")
        arg_mbs, kwarg_mbs = self._check_inputs(arg_mbs, kwarg_mbs, target_mbs, losses)
        stage, M = self._stage, self._n_microbatches
        with self._call():
            stage.has_backward = True
            stage.output_chunks.clear()
            if not self._stage_forward_initialized:
                self._initialize_ring(arg_mbs[0], kwarg_mbs[0], target_mbs[0] if target_mbs else None, loss_kwargs)
            k = self._calls
            self._versions[k] = self._copy_of_weights()
            self._backwards[k] = 0
            self._unreleased.append(k)
            for j in range(M):
                n = k * M + j
                self._inputs[n] = (arg_mbs[j], kwarg_mbs[j], target_mbs[j] if target_mbs else None, loss_kwargs)
                self._forward(n, return_outputs)
                if self._next_bwd <= n - self._lead:
                    self._backward(self._next_bwd)
            self._calls += 1
            if self._pending_forward:  # the call ended with a forward: the next stage needs it in this call
                self._fire_pending()
            # A backward's sends wait for the first receive of the next call (the 1F1B pairing).
            if stage.is_last and losses is not None:
                losses.clear()
                losses.extend(self._call_losses)
            self._call_losses = []
            self._release(lambda b: b <= k - self.delay)
        if stage.is_last and return_outputs:
            return self._merge_outputs(stage.output_chunks)
        return None

    def flush(self) -> bool:
        """Drain the pipe (run the backwards still in flight) and move the oldest gradient not yet
        applied into ``p.grad``; True if there was one. Call it, then ``optimizer.step()``, until it
        returns False: at the end of training, or before a checkpoint that must hold one weight
        version. The next :meth:`step` starts a new warm-up (the pipe restarts from these weights)."""
        with self._call():
            while self._next_bwd < self._calls * self._n_microbatches:
                self._backward(self._next_bwd)
            self._fire_pending()
            _wait_batch_p2p(self._in_flight)
            self._in_flight = []
            return self._release(lambda b: True, at_most=1)

    @property
    def in_flight(self) -> int:
        """Batches given to :meth:`step` whose gradient has not been released yet."""
        return len(self._unreleased)

    def eval(self, *args, target=None, losses: list | None = None, loss_kwargs: dict[str, Any] | None = None,
             arg_mbs: list | None = None, kwarg_mbs: list | None = None, target_mbs: list | None = None, **kwargs):
        """Forward only, on the live weights, one microbatch after another through the stages (GPipe's
        forward): validation. The pipe must be empty (:meth:`flush` until False; delaylab's torchtitan
        checkpointer drains before a validation step); torchtitan's validator calls it under no_grad.
        ``losses`` gets the batch's losses (last stage)."""
        if not self._stage_forward_initialized:
            raise RuntimeError(f"{type(self).__name__}.eval() runs after the first training step")
        if self.in_flight or self._next_bwd < self._calls * self._n_microbatches:
            raise RuntimeError(f"{type(self).__name__}.eval() needs an empty pipe: call flush() until it returns "
                               "False first (a batch in flight would be evaluated on other weights)")
        if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
            self._check_batch(args, kwargs, target)
            arg_mbs, kwarg_mbs = self._split_inputs(args, kwargs)
            if target is not None:
                target_mbs = list(_split_tensor(target, _TARGET_CHUNK_SPEC, self._n_microbatches))
        elif args or kwargs or target is not None:
            raise TypeError("pass either a whole batch (args, target=) or microbatches (arg_mbs=, target_mbs=)")
        arg_mbs, kwarg_mbs = self._check_inputs(arg_mbs, kwarg_mbs, target_mbs, losses)
        stage, out = self._stage, []
        for j in range(self._n_microbatches):
            c = (self._calls * self._n_microbatches + j) % self._ring  # a free slot: nothing is in flight
            _wait_batch_p2p(_batch_p2p(stage.get_fwd_recv_ops(c)))
            with torch.no_grad():
                output = stage.forward_one_chunk(c, arg_mbs[j], kwarg_mbs[j], save_forward_output=False)
                if stage.is_last:
                    out.append(self._compute_loss(output, target_mbs[j] if target_mbs else None, loss_kwargs))
            _wait_batch_p2p(_batch_p2p(stage.get_fwd_send_ops(c)))
            stage.fwd_cache.pop(c, None)  # nothing will run backward on it
        if stage.is_last and losses is not None:
            losses.clear()
            losses.extend(out)
        return None

    def _step_microbatches(self, *args, **kwargs):  # abstract in torch; step() above is the loop
        raise NotImplementedError("call step()")

    # -- weight versions, and the guard on the live weights ---------------------------------------
    def _copy_of_weights(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone().requires_grad_(p.requires_grad)
                for name, p in self._stage.submod.named_parameters()}

    @contextmanager
    def _weights(self, weights: dict[str, torch.Tensor]):
        """The stage module computes with ``weights`` (a version) instead of its live parameters."""
        with _reparametrize_module(self._stage.submod, weights):
            yield

    @contextmanager
    def _call(self):
        """A step()/flush(): the guard is armed; a gradient that reached a live weight raises after it."""
        self._arm_guard()
        self._in_call, self._leaks = True, []
        try:
            yield
        finally:
            self._in_call = False
        if self._leaks:
            raise RuntimeError(
                f"{type(self).__name__}: a gradient reached the live weight {self._leaks[0]!r} of stage "
                f"{self._stage.stage_index} during a call; it would be applied undelayed. Something computes with "
                "the weight tensor itself, not through the stage module (a loss function holding it?)")

    def _arm_guard(self) -> None:
        named = [(n, p) for n, p in self._stage.submod.named_parameters() if p.requires_grad]
        if [id(p) for _, p in named] == self._guarded:
            return
        # The parameters were replaced (torchtitan materializes them after building the schedule).
        for handle in getattr(self, "_guard_handles", []):
            handle.remove()
        self._guard_handles = [p.register_post_accumulate_grad_hook(self._guard(n)) for n, p in named]
        self._guarded = [id(p) for _, p in named]

    def _guard(self, name: str):
        def hook(_param):  # raising inside autograd would reach the caller wrapped in torch's message
            if self._in_call:
                self._leaks.append(name)
        return hook

    # -- one microbatch ---------------------------------------------------------------------------
    def _check_batch(self, args: tuple, kwargs: dict, target) -> None:
        """A whole batch must split into ``M`` equal microbatches along dim 0 (torch's default spec)."""
        if self._args_chunk_spec is not None or self._kwargs_chunk_spec is not None:
            return  # the caller chose how to split
        M = self._n_microbatches
        for what, t in [*((f"argument {i}", a) for i, a in enumerate(args)),
                        *((f"argument {k!r}", v) for k, v in kwargs.items()), ("target", target)]:
            if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] % M:
                raise ConfigError(f"{type(self).__name__}: {what} has a batch of {t.shape[0]}, which does not split "
                                  f"into {M} equal microbatches (n_microbatches)")

    def _initialize_ring(self, args, kwargs, target, loss_kwargs) -> None:
        """torch's stage set-up (p2p warm-up, shape inference), with ``ring`` receive buffers, on a
        throwaway copy of the weights: torch's backward shape inference calls the loss function on
        uninitialized outputs, and a loss that runs a backward itself would leave garbage in p.grad."""
        M = self._n_microbatches
        self._n_microbatches = self._ring
        try:
            with self._weights(self._copy_of_weights()):
                self._initialize_stage(args, kwargs, target, loss_kwargs)
        finally:
            self._n_microbatches = M

    def _exchange(self, recvs: list) -> None:
        """The last op's sends and this op's receives: together (and waited) when there are both,
        as ``Schedule1F1B`` pairs them; sends alone are waited before the next ones are fired."""
        sends, self._pending, self._pending_forward = self._pending, [], False
        if sends and recvs:
            _wait_batch_p2p(_batch_p2p(sends + recvs))
            return
        if sends:
            self._fire(sends)
        if recvs:
            _wait_batch_p2p(_batch_p2p(recvs))

    def _fire(self, sends: list) -> None:
        _wait_batch_p2p(self._in_flight)
        self._in_flight = _batch_p2p(sends)

    def _fire_pending(self) -> None:
        sends, self._pending, self._pending_forward = self._pending, [], False
        if sends:
            self._fire(sends)

    def _forward(self, n: int, return_outputs: bool) -> None:
        stage, c = self._stage, n % self._ring
        self._exchange(stage.get_fwd_recv_ops(c))
        args, kwargs, target, loss_kwargs = self._inputs[n]
        with self._weights(self._versions[n // self._n_microbatches]):
            output = stage.forward_one_chunk(c, args, kwargs, save_forward_output=return_outputs)
            if stage.is_last:
                self._losses[n] = loss = self._compute_loss(output, target, loss_kwargs)
                self._call_losses.append(loss.detach())
        self._pending, self._pending_forward = stage.get_fwd_send_ops(c), True

    def _backward(self, n: int) -> None:
        stage, c, b = self._stage, n % self._ring, n // self._n_microbatches
        self._exchange(stage.get_bwd_recv_ops(c))
        loss = self._losses.pop(n) if stage.is_last else None
        with self._weights(self._versions[b]):  # an activation checkpoint recomputes on the batch's weights
            stage.backward_one_chunk(c, loss=loss, last_backward=False)
        self._pending, self._pending_forward = stage.get_bwd_send_ops(c), False
        for info in stage.args_recv_info[c]:  # the receive buffer is reused: do not accumulate into it
            if not info.is_root_arg and info.buffer is not None:
                info.buffer.grad = None
        del self._inputs[n]
        self._next_bwd += 1
        self._backwards[b] += 1
        if self._backwards[b] == self._n_microbatches:  # the weight copy is free; its gradient stays
            self._versions[b] = {name: t.grad for name, t in self._versions[b].items()}

    def _release(self, due: Callable[[int], bool], at_most: int | None = None) -> bool:
        """Move the gradients of the due batches (oldest first) into ``p.grad``."""
        out = []
        while self._unreleased and due(self._unreleased[0]) and (at_most is None or len(out) < at_most):
            b = self._unreleased.pop(0)
            if self._backwards.pop(b) != self._n_microbatches:
                raise RuntimeError(f"batch {b}'s backward is not complete when its gradient is due")
            out.append(self._versions.pop(b))
        for grads in out:
            for name, p in self._stage.submod.named_parameters():
                g = grads.get(name)
                if g is None:
                    continue
                if self.scale_grads:
                    g = g.div_(self._n_microbatches)
                p.grad = g if p.grad is None else p.grad.add_(g)
        if not out and self.zero_fill:  # nothing due: zeros on the device, for a norm reduced over the pipe
            for p in self._stage.submod.parameters():
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
        self.released = bool(out)
        return self.released


class Schedule2BW(_AsyncSchedule):
    """PipeDream-2BW: every stage applies batch ``k-1``'s gradient after call ``k`` (see the module)."""

    def __init__(self, stage, n_microbatches: int, loss_fn: Callable | None = None, args_chunk_spec=None,
                 kwargs_chunk_spec=None, output_merge_spec=None, scale_grads: bool = True, *, zero_fill: bool = False):
        P = getattr(stage, "num_stages", 1)  # a stage that is not one is refused below
        if isinstance(n_microbatches, int) and 1 <= n_microbatches < P - 1:
            raise ConfigError(f"Schedule2BW with {P} stages needs n_microbatches >= {P - 1} (two weight versions "
                              f"suffice only then), got {n_microbatches}")
        super().__init__(stage, n_microbatches, loss_fn, args_chunk_spec, kwargs_chunk_spec, output_merge_spec,
                         scale_grads, delay=1, zero_fill=zero_fill)


class SchedulePipeDream(_AsyncSchedule):
    """PipeDream with weight stashing: stage ``s`` applies batch ``k - (P-1-s)``'s gradient after call ``k``."""

    def __init__(self, stage, n_microbatches: int = 1, loss_fn: Callable | None = None, args_chunk_spec=None,
                 kwargs_chunk_spec=None, output_merge_spec=None, scale_grads: bool = True, *, zero_fill: bool = False):
        if n_microbatches != 1:
            raise ConfigError("SchedulePipeDream updates after every pipeline unit: use n_microbatches=1 "
                              "(the whole batch is the unit)")
        delay = stage.num_stages - 1 - stage.stage_index if isinstance(stage, _PipelineStageBase) else 0
        super().__init__(stage, n_microbatches, loss_fn, args_chunk_spec, kwargs_chunk_spec, output_merge_spec,
                         scale_grads, delay=delay, zero_fill=zero_fill)


SCHEDULES = {"2BW": Schedule2BW, "PipeDream": SchedulePipeDream}
