"""delaylab inside other training stacks. Importing this package imports nothing heavy.

- :mod:`delaylab.integrations.pipelining`: ``Schedule2BW`` and ``SchedulePipeDream``, the
  asynchronous PipeDream schedules as ``torch.distributed.pipelining`` schedules over torch's
  own ``PipelineStage`` objects (imports torch).
- :mod:`delaylab.integrations.torchtitan`: the delay inside torchtitan: an optimizer container
  (delay queue, correctors, DCP state), an LR-scheduler container indexed by updates, a
  ``pipelining_fn`` that builds the schedules above and a ``config_registry`` (imports
  torchtitan, the ``titan`` extra, when one of its names is used). See docs/torchtitan.md.
"""
