"""Imported in the spawned ranks of test_preempt's data-parallel run: ``train``'s replicas, with rank 0
sending SIGTERM to the launcher (its parent process) during update call ``CALL``: a signal that lands
mid-run, at a moment the test knows, whatever the machine's load."""

import os
import signal

from delaylab.llm.run import trainer

CALL = 3


def replicas_signalling(jobs):
    if int(os.environ.get("RANK", "0")) == 0:  # one signal: a second one would end the run at once
        step = trainer.Trainer.step

        def step_with_signal(self, *args, **kw):
            if self.calls == CALL:
                os.kill(os.getppid(), signal.SIGTERM)
            return step(self, *args, **kw)

        trainer.Trainer.step = step_with_signal
    return trainer._replicas(jobs)
