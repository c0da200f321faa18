"""The one interpreter of a stage's action list: weight slots, forward/backward, messages, updates.

All schedules run through :meth:`StageExecutor.run`; they differ only in the action list.

Weight versions (see ``schedules.py``): a stage with delay ``tau`` keeps ``tau + 1`` copies of
its module ("slots"); version ``v`` lives in slot ``v mod (tau + 1)``. A forward runs on the
slot its action names, and autograd keeps references to exactly those tensors, so the
backward uses the stashed version without any ``.data`` swapping, and the gradient
accumulates into that slot's ``.grad``. Update ``k`` (gradient of group ``k``, taken on
``V_{k - tau}``, applied to ``V_k``):

1. the target slot ``(k + 1) mod (tau + 1)`` is the one holding ``V_{k - tau}`` and ``g_k``;
   no microbatch in flight reads it any more (the schedule guarantees it, ``M >= P-1`` for
   2BW), so its weights are overwritten with ``V_k`` (gradients untouched);
2. the optimizer is re-targeted to that slot's tensors (``delaylab.llm.pipeline.retarget`` moves
   every level's per-parameter state), steps, and the slot now holds ``V_{k+1}``.

So the optimizer state follows the newest weights, and ``V_{k+1} = V_k - u_k(g_k(V_{k-tau}))``
is computed with the same tensor ops as ``delaylab.optim.Delayed`` in one process.

Data parallel (``dp_group``): each of the stage's ``D`` replicas runs the same action list on its
``1/D`` of every microbatch; before step 2 the replicas average ``g_k``
(:class:`~delaylab.llm.distributed.wrap.GradientAverage`, which says why not DDP), so every replica
applies the update of the full microbatches and their weights and optimizer state stay identical.
The last stage averages each group's loss over the replicas too.
"""

from __future__ import annotations

import copy
import math
import time
from typing import Callable

import torch
from torch import nn

from delaylab.llm.distributed.world import all_reduce, mean
from delaylab.llm.distributed.wrap import GradientAverage
from delaylab.llm.model import eager_blocks, lm_loss
from delaylab.llm.pipeline.p2p import P2P
from delaylab.llm.pipeline.schedules import Action, Schedule
from delaylab.llm.pipeline.stages import Stage
from delaylab.llm.pipeline.timeline import Event
from delaylab.errors import ConfigError, Diverged, overflow_is_divergence
from delaylab.llm.pipeline.retarget import retarget


class StageExecutor:
    """One stage of a pipeline run.

    ``make_optimizer(module, tau)`` builds the stage's optimizer on a slot; ``lr_lambda(k)``
    is the LR multiplier of update ``k``; ``batch(n)`` returns microbatch ``n``'s
    ``(inputs, targets)`` on the device; ``on_update(executor, k, loss)`` is called after update ``k``
    (``loss``: group ``k``'s mean training loss on the last stage, else ``None``).
    ``seed_for(n)``, if given, seeds torch's RNG before forward ``n`` (dropout), so the
    masks depend on the microbatch and stage only and a resumed run draws the same ones.
    ``events`` (the stage's timeline) covers the first ``record_updates`` updates' actions.
    ``sync_timing`` (CUDA): ``"step"`` fences the device once per update, at the end of its ``U``
    event, so the time per batch (update end to update end) is the device's while the host keeps
    queueing work ahead within a step; the ``F``/``B`` times are then the host's (when the work
    was queued), so a stage's idle fraction is not measured. ``"action"`` fences before and
    after every action (three host syncs each: per-action costs for the cost model, at the price
    of a pessimistic time per batch); ``False`` never (the CPU, where the host's clock is the
    compute's).
    """

    def __init__(
        self,
        stage: Stage,
        schedule: Schedule,
        p2p: P2P,
        *,
        make_optimizer: Callable[[nn.Module, int], torch.optim.Optimizer],
        lr_lambda: Callable[[int], float],
        batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
        amp=None,
        on_update: Callable[["StageExecutor", int, float | None], None] | None = None,
        seed_for: Callable[[int], int] | None = None,
        sync_timing: str | bool = False,
        record_updates: int = 100,
        tied_group=None,
        dp_group=None,
        gate: Callable[[int], bool] | None = None,
    ):
        self.stage, self.schedule, self.p2p = stage, schedule, p2p
        self.gate = gate  # before a group's first action: may this stage run it? (a stop request)
        self.index = stage.index
        self.tau = schedule.delay(self.index)
        self.slots: list[Stage] = [stage] + [copy.deepcopy(stage) for _ in range(self.tau)]
        self._dtype = next(stage.parameters()).dtype  # what the stage computes in (messages may be narrower)
        home = self.slots[schedule.start % len(self.slots)]  # holds V_start
        self.opt = make_optimizer(home, self.tau)
        names = {id(p): name for name, p in home.named_parameters()}
        self._order = [names[id(p)] for g in self.opt.param_groups for p in g["params"]]
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda)
        self.batch, self.amp, self.on_update, self.seed_for = batch, amp, on_update, seed_for
        self.sync_timing, self.record_updates = sync_timing, record_updates
        if sync_timing not in (False, "step", "action"):
            raise ConfigError(f"sync_timing is False, 'step' or 'action', got {sync_timing!r}")
        self.events: list[Event] = []
        self._stash: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._loss_sum: dict[int, torch.Tensor] = {}
        self._losses: dict[int, float] = {}  # group -> mean loss of its full microbatches (last stage)
        self.max_in_flight = 0
        self.activation_bytes = 0  # what autograd keeps of one microbatch's forward
        self._measured = False
        # Tied embeddings: this stage's name of the shared matrix, whose gradient is summed with
        # the other holder's (the first or the last stage) over ``tied_group`` before each update.
        self.tied_group = tied_group
        self._tied_name = stage.tied_name() if tied_group is not None else None
        # Data parallel: this stage's replicas; None with one replica (nothing to average).
        self.dp_group = dp_group
        self._average = GradientAverage(dp_group) if dp_group is not None else None

    # -- the interpreter ------------------------------------------------------------------------
    def run(self) -> None:
        acts = self._actions()
        a = next(acts)
        pending = self.p2p.post(None, _recv_of(a))
        record_until = self.schedule.start + self.record_updates
        each = self.sync_timing == "action"
        while a is not None:
            ready = self._clock(each)
            received = self.p2p.wait(pending) if pending is not None else None
            start = self._clock(each)
            with overflow_is_divergence(str(a)):
                out = self._compute(a, received)
            nxt = next(acts, None)
            send = (out, a.send, a.op, a.n) if a.send is not None else None
            pending = self.p2p.post(send, _recv_of(nxt) if nxt is not None else None)
            if (a.n if a.op == "U" else self.schedule.group(a.n)) < record_until:
                # "step": one fence per update, at its end, where the time per batch is read
                self.events.append(Event(self.index, a.op, a.n, ready, start, self._clock(each or a.op == "U")))
            a = nxt
        self.p2p.flush()

    def _actions(self):
        """The stage's action list, asking the gate before each group's first action; once it says
        no, the actions of that group and every later one are skipped (the list of a run that ends
        there: every dependency of an action is in its own or an earlier group)."""
        entered, stop = self.schedule.start, None
        for a in self.schedule.iter_actions(self.index):
            g = a.n if a.op == "U" else self.schedule.group(a.n)
            if stop is None and g > entered and self.gate is not None:
                if not self.gate(g):
                    stop = getattr(self.gate, "stop", None) or g
                entered = g
            if stop is None or g < stop:
                yield a

    def _compute(self, a: Action, received: torch.Tensor | None) -> torch.Tensor | None:
        if a.op == "F":
            return self._forward(a, received)
        if a.op == "B":
            return self._backward(a, received)
        self._update(a.n)
        return None

    def _forward(self, a: Action, received):
        slot = self.slots[a.version % len(self.slots)]
        data = self.batch(a.n) if self.stage.first or self.stage.last else None
        # A message on a narrower wire (bf16 under autocast) continues in the stage's own dtype:
        # the residual stream stays float32 as in one process (a no-op when the two agree).
        x = data[0] if self.stage.first else received.to(self._dtype).requires_grad_(True)
        if self.seed_for is not None:
            torch.manual_seed(self.seed_for(a.n))
        with self._amp(), self._measuring(slot):
            out = slot(x)
            if self.stage.last:
                loss = lm_loss(out, data[1])
        if self.stage.last:
            k = self.schedule.group(a.n)
            self._loss_sum[k] = self._loss_sum.get(k, 0.0) + loss.detach()
            # The same op as the single-process trainer's gradient accumulation: loss / M.
            self._stash[a.n] = (x, loss / self.schedule.microbatches)
        else:
            self._stash[a.n] = (x, out)
        self.max_in_flight = max(self.max_in_flight, len(self._stash))
        return None if self.stage.last else out.detach().to(self.p2p.dtype)  # autocast output (bf16) on the wire dtype

    def _backward(self, a: Action, received):
        x, out = self._stash.pop(a.n)
        M = self.schedule.microbatches
        if self.stage.last and a.n % M == M - 1:
            # The group's loss is complete: check it before its last gradient leaves this
            # stage, so no stage can apply the update (one host sync per batch).
            k = self.schedule.group(a.n)
            loss = self._group_loss(k)  # the same on every replica: they all stop here together
            if not math.isfinite(loss):
                raise Diverged(f"loss is {loss} at update {k}")
        if self.stage.last:
            out.backward()
        else:
            out.backward(received.to(out.dtype))
        return x.grad.to(self.p2p.dtype) if a.send is not None else None

    def _group_loss(self, k: int) -> float:
        """Group ``k``'s mean loss (last stage), over the full microbatches: averaged over replicas."""
        total = self._loss_sum.pop(k)
        if self.dp_group is not None:
            total = mean(total.reshape(1), self.dp_group, f"averaging the loss of update {k}")[0]
        self._losses[k] = float(total) / self.schedule.microbatches
        return self._losses[k]

    def _update(self, k: int) -> None:
        loss = self._losses.pop(k) if self.stage.last else None
        n = len(self.slots)
        target = self.slots[(k + 1) % n]  # holds V_{k-tau} and g_k
        if n > 1:
            base = self.slots[k % n]  # holds V_k
            with torch.no_grad():
                torch._foreach_copy_(list(target.parameters()), list(base.parameters()))
            params = dict(target.named_parameters())
            retarget(self.opt, [params[name] for name in self._order])
        if self._average is not None:
            self._average(target, k)
        if self.tied_group is not None:
            # After the replica average: every holder then sums the same two averaged matrices.
            grad = dict(target.named_parameters())[self._tied_name].grad
            all_reduce(grad, self.tied_group, f"summing the tied embedding's gradient of update {k}")
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        if self.on_update is not None:
            self.on_update(self, k, loss)

    def _measuring(self, slot: nn.Module):
        """On the first forward, add up the bytes autograd saves for the backward (weights aside)."""
        import contextlib

        if self._measured:
            return contextlib.nullcontext()
        self._measured = True
        weights = {p.untyped_storage().data_ptr() for p in slot.parameters()}
        seen: dict[int, int] = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in weights:
                seen[storage.data_ptr()] = storage.nbytes()
            return t

        @contextlib.contextmanager
        def measure():
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                yield
            self.activation_bytes = sum(seen.values())

        return measure()

    def memory(self) -> dict[str, int]:
        """Bytes this stage holds at its peak: weight slots, one set of gradients, optimizer
        state, and the activations of the most microbatches it had in flight."""
        def tensor_bytes(obj) -> int:
            if isinstance(obj, torch.Tensor):
                return obj.nbytes
            if isinstance(obj, dict):
                return sum(tensor_bytes(v) for v in obj.values())
            if isinstance(obj, (list, tuple)):
                return sum(tensor_bytes(v) for v in obj)
            return 0

        out = {
            "weights": sum(p.nbytes for slot in self.slots for p in slot.parameters()),
            "grads": sum(p.nbytes for p in self.stage.parameters()),
            "optimizer": tensor_bytes(self.opt.state_dict()),
            "activations": self.max_in_flight * self.activation_bytes if self._measured else None,
            "dp_buffer": self._average.nbytes if self._average is not None else 0,
        }
        out["total"] = sum(v for v in out.values() if v is not None)
        return out

    # -- after training -----------------------------------------------------------------------
    @property
    def newest(self) -> Stage:
        """The slot holding the weights after the last update (``V_steps``)."""
        return self.slots[self.schedule.steps % len(self.slots)]

    @torch.no_grad()
    def evaluate(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float | None:
        """Mean loss of the newest weights over ``batches`` (returned on the last stage)."""
        model, s, last = self.newest, self.index, self.stage.last
        model.eval()
        losses = []
        for i, (x, y) in enumerate(batches):
            h = x if self.stage.first else self.p2p.wait(self.p2p.post(None, (s - 1, "F", -1 - i))).to(self._dtype)
            with self._amp(), eager_blocks(model):  # no second compilation under --compile
                out = model(h)
                if last:
                    losses.append(lm_loss(out, y).item())
            if not last:
                self.p2p.post((out.to(self.p2p.dtype), s + 1, "F", -1 - i), None)
        self.p2p.flush()
        model.train()
        if not (last and losses):
            return None
        local = sum(losses) / len(losses)  # this replica's slices
        if self.dp_group is None:
            return local
        device = next(model.parameters()).device
        return float(mean(torch.tensor([local], dtype=torch.float64, device=device), self.dp_group,
                          "averaging the validation loss")[0])

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "slots": [slot.state_dict() for slot in self.slots],
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
        }

    def load_state_dict(self, sd: dict) -> None:
        if len(sd["slots"]) != len(self.slots):
            raise ConfigError(f"checkpoint has {len(sd['slots'])} weight slots, this stage keeps {len(self.slots)}")
        for slot, state in zip(self.slots, sd["slots"]):
            slot.load_state_dict(state)
        self.opt.load_state_dict(sd["optimizer"])
        self.sched.load_state_dict(sd["scheduler"])

    # -- helpers --------------------------------------------------------------------------------
    def _amp(self):
        import contextlib

        return self.amp() if self.amp is not None else contextlib.nullcontext()

    def _clock(self, fence: bool = False) -> float:
        """The host's clock; with ``fence`` (and a ``sync_timing``) after the device's queue has drained."""
        if fence and self.sync_timing:
            torch.cuda.synchronize()
        return time.perf_counter()


def _recv_of(a: Action) -> tuple[int, str, int] | None:
    return (a.recv, a.op, a.n) if a.recv is not None else None


class TorchScheduleExecutor(StageExecutor):
    """The baseline: torch's own ``ScheduleGPipe`` / ``Schedule1F1B`` on the same stage.

    Same module, data, optimizer, LR schedule and loss scaling (``loss / M``, with torch's
    ``scale_grads=False``); only the schedule runtime is torch's. It flushes inside every
    ``step()`` and the optimizer runs after it, which is exactly synchronous training. Its
    timeline holds one ``U`` event per batch (torch's runtime exposes no per-action clock).
    """

    def __init__(self, stage: Stage, schedule: Schedule, p2p: P2P, *, torch_schedule: str, **kw):
        if schedule.delay(stage.index) != 0:
            raise ConfigError("torch's schedules are synchronous: build them on a gpipe/1f1b Schedule")
        super().__init__(stage, schedule, p2p, **kw)
        self.torch_schedule = torch_schedule

    def run(self) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        sch, st = self.schedule, self.stage
        M = sch.microbatches
        device = next(st.parameters()).device
        cls = {"torch-1f1b": Schedule1F1B, "torch-gpipe": ScheduleGPipe}[self.torch_schedule]
        runner = cls(PipelineStage(st, st.index, st.stages, device, group=self.p2p.group), M,
                     loss_fn=lambda out, y: lm_loss(out, y) / M, scale_grads=False)
        for b in sch.updates():
            if self.gate is not None and not self.gate(b):  # a stop request: every stage stops before b
                break
            t0 = self._clock()  # unfenced: the previous step's end was, so the device is idle here
            data = [self.batch(n) for n in range(b * M, (b + 1) * M)] if st.first or st.last else None
            with self._amp():
                if st.first and st.last:
                    raise ConfigError("torch's schedules need at least 2 stages")
                if st.first:
                    runner.step(torch.cat([x for x, _ in data]))
                elif st.last:
                    losses: list[torch.Tensor] = []
                    runner.step(target=torch.cat([y for _, y in data]), losses=losses)
                    self._loss_sum[b] = sum(loss.detach() for loss in losses) * M
                    loss = self._group_loss(b)
                    if not math.isfinite(loss):  # too late to stop the others
                        raise Diverged(f"loss is {loss} at update {b}")
                else:
                    runner.step()
            self._update(b)
            if b < sch.start + self.record_updates:
                self.events.append(Event(self.index, "U", b, t0, t0, self._clock(fence=True)))
