"""One llm run: its folder, the two engines' run loops and what they share.

- :mod:`~delaylab.llm.run.folder`: the run folder of a training run (``TrainFolder``, on
  :class:`delaylab.run_folder.RunFolder`);
- :mod:`~delaylab.llm.run.setup`: device, process group and mesh, data, seeded model, optimizers,
  run folder and resume, and the one accounting of tokens and logged steps;
- :mod:`~delaylab.llm.run.trainer`: the single-process simulator (``Trainer``, ``train``; its
  data-parallel form ``train_replicas``);
- :mod:`~delaylab.llm.run.rank`: one rank of the pipeline (``run_rank``; ``train_pipeline`` and
  ``run_jobs`` start them).

The checkpoints are :mod:`delaylab.llm.checkpoint`'s.
"""
