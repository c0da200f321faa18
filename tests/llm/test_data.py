import json

import numpy as np
import pytest
import torch

from delaylab.llm import data as D
from delaylab.llm.data import ByteTokenizer, load_dataset


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    return load_dataset(cache_dir=tmp_path_factory.mktemp("cache"))


def test_builtin_corpus_is_markup_free_plain_english(shakespeare):
    text = shakespeare.tokenizer.decode(shakespeare.train[:400_000])
    assert not set(text) & set("*_#\\")
    assert "THESEUS\nNow, fair Hippolyta, our nuptial hour\n" in text
    assert shakespeare.meta["n_docs"] == len(D.shakespeare_files()) >= 37


def test_split_holds_out_whole_documents(shakespeare):
    files = D.shakespeare_files()
    plays = [D.strip_play_markdown(f.read_text()) for f in files]
    held = [i for i in range(len(plays)) if (i + 1) // 10 > i // 10]  # every 10th play
    assert held == [9, 19, 29]
    tok = ByteTokenizer()
    want_val = np.concatenate([tok.encode(plays[i] + "\n\n") for i in held])
    want_train = np.concatenate([tok.encode(p + "\n\n") for i, p in enumerate(plays) if i not in held])
    assert np.array_equal(shakespeare.val, want_val)
    assert np.array_equal(shakespeare.train, want_train)
    assert shakespeare.meta["n_val_docs"] == 3


def test_batches_are_a_pure_function_of_seed_and_index(shakespeare, tmp_path):
    x, y = shakespeare.batch(5, 4, 32, seed=1)
    assert x.shape == y.shape == (4, 32) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    again = load_dataset(cache_dir=tmp_path)  # a fresh build and a fresh object
    for a, b in zip((x, y), again.batch(5, 4, 32, seed=1)):
        assert torch.equal(a, b)
    assert not torch.equal(x, shakespeare.batch(6, 4, 32, seed=1)[0])
    assert not torch.equal(x, shakespeare.batch(5, 4, 32, seed=2)[0])
    # each row is a real window of the training stream
    text = shakespeare.tokenizer.decode(shakespeare.train)
    for row in x:
        assert shakespeare.tokenizer.decode(row) in text


def test_validation_batches_are_fixed_and_from_the_val_split(shakespeare):
    a = shakespeare.val_batches(3, 4, 32)
    b = shakespeare.val_batches(3, 4, 32)
    assert len(a) == 3
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert torch.equal(a[0][0][0], torch.from_numpy(shakespeare.val[:32].astype(np.int64)))


def test_jsonl_and_text_files_cache_next_to_the_data(tmp_path, monkeypatch):
    docs = [f"document number {i}: " + "lorem ipsum " * (i + 3) for i in range(20)]
    src = tmp_path / "corpus"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs[:12]))
    for i, d in enumerate(docs[12:]):
        (src / f"b{i}.txt").write_text(d)
    ds = load_dataset(src, text_field="body")
    assert any((src / ".delaylab-cache").iterdir())
    tok = ByteTokenizer()
    assert np.array_equal(ds.val, np.concatenate([tok.encode(docs[i] + "\n\n") for i in (9, 19)]))
    # a second load reads the cache instead of tokenizing again
    monkeypatch.setattr(D, "_build", lambda *a: pytest.fail("rebuilt a cached dataset"))
    assert np.array_equal(load_dataset(src, text_field="body").train, ds.train)


def test_parquet_shards_and_a_missing_text_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    docs = [f"row {i} " * 10 for i in range(30)]
    pq.write_table(pa.table({"text": docs[:15], "id": list(range(15))}), tmp_path / "s0.parquet")
    pq.write_table(pa.table({"text": docs[15:], "id": list(range(15))}), tmp_path / "s1.parquet")
    ds = load_dataset(tmp_path)
    tok = ByteTokenizer()
    assert np.array_equal(ds.val, np.concatenate([tok.encode(docs[i] + "\n\n") for i in (9, 19, 29)]))
    pq.write_table(pa.table({"content": docs}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="no column 'text'"):
        load_dataset(tmp_path / "bad.parquet")


def test_single_document_holds_out_its_tail(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("abcdefghij" * 100)
    ds = load_dataset(path, val_fraction=0.2)
    assert len(ds.train) == 801 and len(ds.val) == 201  # 1000 chars + "\n\n", cut at 4/5
    assert ds.tokenizer.decode(ds.train[:10]) == "abcdefghij"


def test_bad_data_raises_one_line_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_dataset(tmp_path / "nope.txt")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty"):
        load_dataset(tmp_path / "empty.txt")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match="no text"):
        load_dataset(tmp_path / "blank.jsonl")
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(ValueError, match="unsupported"):
        load_dataset(tmp_path / "x.csv")
    with pytest.raises(ValueError, match="unknown tokenizer"):
        load_dataset(tokenizer="sentencepiece")
    short = tmp_path / "short.txt"
    short.write_text("tiny")
    with pytest.raises(ValueError, match="fewer than block_size"):
        load_dataset(short).batch(0, 2, 64)


def test_bpe_trained_locally_round_trips_and_splits_by_document(tmp_path):
    words = "the quick brown fox jumps over the lazy dog while kings and queens argue".split()
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(words, 200)) + f" ({i})" for i in range(10)]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    ds = load_dataset(path, tokenizer="bpe", vocab_size=300)
    assert ds.vocab_size == 300 and ds.train.dtype == np.uint16
    assert ds.tokenizer.decode(ds.val) == docs[9] + "\n\n"
    assert len(ds.train) < sum(len(d) + 2 for d in docs[:9])  # merges compress the bytes
    assert D.token_dtype(70_000) == np.uint32
