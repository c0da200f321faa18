"""GPT pretraining under a gradient delay: ``model`` (GPT in stages), ``data`` (corpora, batches),
``train`` (the trainer: sync / delayed / mitigations through ``delaylab.optim.Delayed``), ``sweep``."""
