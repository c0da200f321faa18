"""A user's tokenizer.json (HF tokenizers format), built here by tokenizers' own BPE trainer."""

import json

import pytest

pytest.importorskip("tokenizers", reason="HF tokenizers is not installed (pip install -e '.[data]')")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from delaylab.cli import main  # noqa: E402
from delaylab.errors import ConfigError, MissingFile  # noqa: E402
from delaylab.llm.config import Config  # noqa: E402
from delaylab.llm.data import load_dataset  # noqa: E402
from delaylab.llm import checkpoint  # noqa: E402
from delaylab.llm.run.trainer import train  # noqa: E402

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A delayed gradient is the gradient of the weights one step ago.",
    "Error feedback applies the newest update twice and takes back the previous one.",
    "PipeDream keeps two weight versions per stage and never flushes the pipeline.",
]


def build_tokenizer(path, vocab_size: int, sentences=SENTENCES) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(sentences, trainer=trainer)
    tok.save(str(path))
    return tok


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(10):
        (folder / f"doc{i:02d}.txt").write_text(" ".join(SENTENCES[(i + j) % 4] for j in range(30)))
    return folder


def test_the_file_tokenizes_and_its_vocabulary_is_the_datasets(tmp_path, corpus):
    tok = build_tokenizer(tmp_path / "tokenizer.json", 320)
    ds = load_dataset(corpus, tokenizer=str(tmp_path / "tokenizer.json"), cache_dir=tmp_path / "cache")
    assert ds.vocab_size == tok.get_vocab_size() == 320
    first = (corpus / "doc00.txt").read_text()
    ids = tok.encode(first).ids
    assert ds.train[:len(ids)].tolist() == ids  # the first training document, as the file encodes it
    assert ds.tokenizer.decode(ds.train[:len(ids)]) == first


def test_the_cache_follows_the_files_content_not_its_name(tmp_path, corpus):
    path = tmp_path / "tokenizer.json"
    build_tokenizer(path, 300)
    a = load_dataset(corpus, tokenizer=str(path), cache_dir=tmp_path / "cache")
    build_tokenizer(path, 280, sentences=SENTENCES[::-1])  # same name, other tokenizer
    b = load_dataset(corpus, tokenizer=str(path), cache_dir=tmp_path / "cache")
    assert (a.vocab_size, b.vocab_size) == (300, 280)
    assert a.meta["tokenizer_sha256"] != b.meta["tokenizer_sha256"]
    assert load_dataset(corpus, tokenizer=str(path), cache_dir=tmp_path / "cache").meta == b.meta


def test_the_model_takes_the_tokenizers_vocabulary(tmp_path, corpus):
    build_tokenizer(tmp_path / "tokenizer.json", 310)
    cfg = Config.from_dict(dict(data=str(corpus), tokenizer=str(tmp_path / "tokenizer.json"), preset="tiny",
                                batch_size=2, block_size=16, steps=2, eval_batches=1, log_every=1, ckpt_every=0,
                                ckpt_final=True,
                                threads=1, progress=False))
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 2

    model = checkpoint.read(tmp_path / "run")["model"]
    assert model["head.lm_head.weight"].shape[0] == 310


def test_missing_damaged_and_unknown_tokenizers_fail_in_one_line(tmp_path, corpus):
    with pytest.raises(MissingFile, match="tokenizer file not found"):
        load_dataset(corpus, tokenizer=str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "1.0", "model": ')
    with pytest.raises(ConfigError, match="not a tokenizers JSON file") as err:
        load_dataset(corpus, tokenizer=str(bad))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="unknown tokenizer"):
        load_dataset(corpus, tokenizer="sentencepiece")
    with pytest.raises(MissingFile):
        Config.from_dict(dict(tokenizer=str(tmp_path / "nope.json"))).resolved()


def test_cli_missing_tokenizer_file_is_exit_2_one_line(tmp_path, capsys, corpus):
    out = tmp_path / "run"
    code = main(["llm", "train", "--data", str(corpus), "--tokenizer", str(tmp_path / "nope.json"),
                 "--steps", "2", "--out", str(out), "--json"])
    stdout, err = capsys.readouterr()
    assert code == 2 and stdout == "" and len(err.strip().splitlines()) == 1 and "nope.json" in err
    assert not out.exists()


def test_a_smollm_sized_vocabulary_is_kept_whole(tmp_path, corpus):
    """49152 ids (the SmolLM tokenizer's size, which the 135m/360m presets assume) stay uint16."""
    path = tmp_path / "tokenizer.json"
    tok = build_tokenizer(path, 320)
    spec = json.loads(path.read_text())
    extra = [{"id": 320 + i, "content": f"<extra_{i}>", "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in range(49152 - tok.get_vocab_size())]
    spec["added_tokens"] += extra
    path.write_text(json.dumps(spec))
    ds = load_dataset(corpus, tokenizer=str(path), cache_dir=tmp_path / "cache")
    assert ds.vocab_size == 49152 and ds.train.dtype.name == "uint16"
