"""PipeDream-2BW and the synchronous schedules on torch.distributed (see docs/pipeline.md).

- :mod:`~delaylab.llm.pipeline.schedules`: the schedules as pure per-stage action lists.
- :mod:`~delaylab.llm.pipeline.simulator`: an event-driven replay of them with per-action costs.
- :mod:`~delaylab.llm.pipeline.timeline`: batch time and bubble fraction from either source.
- ``stages``, ``p2p``, ``executor``, ``checkpoint``, ``engine``, ``launch``: the multi-process
  engine (these import torch); ``profile``: per-stage costs measured on one device.
"""

from delaylab.llm.pipeline.schedules import SCHEDULES, Action, Schedule, check_config
from delaylab.llm.pipeline.simulator import Costs, predict, simulate
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
