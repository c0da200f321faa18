"""The distributed layer both engines use, on torch's own machinery (one of each):

- :mod:`~delaylab.llm.distributed.world`: the process group (one start, one world-size check)
  and the collectives whose failure names the peer (:class:`~.world.PeerFailure`);
- :mod:`~delaylab.llm.distributed.mesh`: the one ``(dp, pp)`` device mesh (the simulator is ``P = 1``);
- :mod:`~delaylab.llm.distributed.launch`: the one launcher (torch's elastic agent, as torchrun),
  its failure type :class:`~.launch.RunFailed` and the one rank-failure report;
- :mod:`~delaylab.llm.distributed.wrap`: the parallelize step (DDP / FSDP2 for the simulator, the
  pipeline's gradient average at update time, and why they are two).
"""
