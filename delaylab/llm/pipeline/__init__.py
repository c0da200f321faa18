"""PipeDream-2BW and the synchronous schedules on torch.distributed (see docs/pipeline.md).

- :mod:`~delaylab.llm.pipeline.schedules`: the schedules as pure per-stage action lists.
- :mod:`~delaylab.llm.pipeline.cost_model`: the timing cost model, an event-driven replay of them
  with per-action costs; :mod:`~delaylab.llm.pipeline.measure_costs`: those costs measured per
  stage on one device.
- :mod:`~delaylab.llm.pipeline.timeline`: batch time and bubble fraction from either source.
- ``stages``, ``p2p``, ``executor``, ``retarget``: the pieces a pipeline rank runs (these import
  torch); the rank itself is :mod:`delaylab.llm.run.rank`.
"""

from delaylab.llm.pipeline.cost_model import Costs, predict, simulate
from delaylab.llm.pipeline.schedules import SCHEDULES, Action, Schedule, check_config
from delaylab.llm.pipeline.timeline import Event, Timeline, plot_timeline

__all__ = [
    "SCHEDULES",
    "Action",
    "Costs",
    "Event",
    "Schedule",
    "Timeline",
    "check_config",
    "plot_timeline",
    "predict",
    "simulate",
]
