"""delaylab: convergence theory and experiments for training under a one-step gradient delay.

Subpackages: ``optim`` (LMO maps, LMOMomentum, the Delayed wrapper, the optimizer factory),
``theory`` (sympy bounds, tuning, stability, assumption checks), ``toy`` (synthetic problems
and rate checks) and ``llm`` (GPT pretraining, the delay simulator and the 2BW pipeline).
"""

__version__ = "0.1.0"
