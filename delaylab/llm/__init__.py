"""GPT pretraining under a gradient delay: ``config`` (the one config), ``model`` (GPT in stages),
``data`` (corpora, batches), ``run`` (the simulator's trainer: sync / delayed / mitigations through
``delaylab.optim.Delayed``; the pipeline's rank; their shared setup), ``distributed`` (process group,
mesh, launcher, DDP / FSDP2), ``checkpoint`` (one ``ckpt/`` layout), ``pipeline``, ``sweep``."""
