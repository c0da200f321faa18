"""One llm run: its folder (:mod:`delaylab.llm.run.folder`) and what the engines share to run it."""
