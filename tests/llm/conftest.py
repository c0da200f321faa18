import pytest

from delaylab.llm.data import load_dataset
from delaylab.llm.config import Config


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """The built-in corpus, tokenized once per test session into a temporary cache."""
    return load_dataset(cache_dir=tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def quick():
    """A Config that runs in well under a second per few steps."""

    def make(**kw):
        base = dict(preset="tiny", batch_size=4, block_size=32, steps=8, eval_every=4, eval_batches=2,
                    log_every=2, ckpt_every=0, threads=1, progress=False)
        return Config.from_dict({**base, **kw})

    return make
