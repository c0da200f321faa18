"""The paper's central ordering on a CI-size model: a one-step delay hurts AdamW far more than Muon.

Tiny preset (2 layers, d=64, context 64), 150 updates of batch 16, each optimizer at its best
sync lr of a small grid on this config (AdamW 3e-3 of {1e-3, 3e-3, 1e-2}; Muon 0.02, as good
as 0.04). Measured while writing this test (val loss, seeds 0 / 1): AdamW sync 2.566 / 2.586,
delayed 3.128 / 3.308 (gap +0.56 / +0.72: delayed AdamW stalls on the early plateau);
Muon sync 2.678 / 2.694, delayed 2.741 / 2.763 (gap +0.063 / +0.069). Only the ordering, with
a margin well inside those numbers, is asserted; EF's effect is too seed-dependent at this
size to assert.
"""

from delaylab.llm.run.trainer import train


def test_delay_gap_of_adamw_exceeds_muons(quick, corpus):
    def gap(optimizer, lr):
        runs = {mode: train(quick(optimizer=optimizer, lr=lr, delay=int(mode == "delayed"), steps=150, batch_size=16, block_size=64,
                                  eval_every=150, eval_batches=8, log_every=50), dataset=corpus)["val_loss"]
                for mode in ("sync", "delayed")}
        return runs["delayed"] - runs["sync"]

    adamw, muon = gap("adamw", 3e-3), gap("muon", 0.02)
    assert adamw > muon + 0.2, (adamw, muon)
    assert muon < 0.25, muon
