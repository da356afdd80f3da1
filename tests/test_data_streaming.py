"""The streaming SFT loader (train_sft.StreamingPackedStream): gzipped shards read as they are used,
the same samples as the in-memory loader, deterministic, resumable, and the task vocabulary."""

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from sft_helpers import TEXTS, math_fields, tiny_cfg

from rookworld_lib.chess import data
from rookworld_lib.chess.training import RecordReader, task_weights
from rookworld_lib.core import train_sft as sft
from rookworld_lib.core.tokenizer import EOT_ID, get_tokenizer

READER = RecordReader()  # the shards hold datagen records (compact layout)
HALF = task_weights()  # P: and A: samples with even odds, as every profile mixes them


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """The shipped val records, marked as a train split (SFT refuses val records in its training files), as
    gzipped shards of 100 (P: and A: in separate files, as datagen writes)."""
    d = tmp_path_factory.mktemp("shards")
    paths = []
    for task in ("P", "A"):
        recs = [{**r, "split": "train"} for r in data.load_split(task, "val")]
        name = data.data_file(task, "train").name
        for k in range(0, len(recs), 100):
            path = d / data.data_file_name(name, k // 100, compress=True)
            with gzip.open(path, "wt") as f:
                f.writelines(json.dumps(r) + "\n" for r in recs[k: k + 100])
            paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def val_shards(tmp_path_factory):
    """100 val records of each task, a gzipped shard each."""
    d = tmp_path_factory.mktemp("val_shards")
    paths = []
    for task in ("P", "A"):
        path = d / data.data_file_name(data.data_file(task, "val").name, 0, compress=True)
        with gzip.open(path, "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in data.load_split(task, "val")[:100])
        paths.append(str(path))
    return paths


def _samples(stream, n_batches, B=4, T=64) -> list[str]:
    """The texts a stream yields, cut at its EOTs (a partial first/last one dropped)."""
    tokens = torch.cat([stream.next_batch(B, T)[0].flatten() for _ in range(n_batches)]).tolist()
    enc, out, cur = get_tokenizer(), [], None
    for t in tokens:
        if t == EOT_ID:
            if cur is not None:
                out.append(enc.decode(cur))
            cur = []
        elif cur is not None:
            cur.append(t)
    return out


def test_stream_yields_the_same_samples_as_the_in_memory_loader(shards):
    texts = READER.load_texts(shards)
    assert list(READER.iter_texts(shards)) == texts
    # a buffer of one: each epoch is every sample once, the files in a seeded order
    n_batches = sum(len(t) for t in get_tokenizer().encode_batch(texts)) // 256 + len(texts) // 200 + 5
    epoch = _samples(sft.StreamingPackedStream(shards, reader=READER, seed=3, buffer=1), n_batches)
    assert Counter(epoch[:len(texts)]) == Counter(texts) and epoch[:len(texts)] != texts
    mixed = _samples(sft.StreamingPackedStream(shards, reader=READER, seed=3, task_weights=HALF, buffer=64), 150)
    assert set(mixed) <= set(texts)
    assert 0.4 < sum(t.startswith("P:") for t in mixed) / len(mixed) < 0.6


def test_stream_is_deterministic_given_the_seed_and_shuffles(shards):
    def first(seed, buffer=64):
        return _samples(sft.StreamingPackedStream(shards, reader=READER, seed=seed, buffer=buffer), 20)

    assert first(1) == first(1)
    assert first(1) != first(2)
    assert first(1) != first(1, buffer=1)  # the buffer shuffles within the files too


def test_a_shuffle_buffer_larger_than_the_data_holds_it_all_and_yields(shards):
    """--shuffle-buffer above the pool's size used to fill from epoch after epoch and never yield (memory
    growing, SIGTERM unheard): the buffer holds the whole pool, and draws from it from the second epoch on."""
    texts = READER.load_texts(shards)
    stream = sft.StreamingPackedStream(shards, reader=READER, seed=3, buffer=10**9)
    drawn = [next(stream._sources[0]) for _ in range(2 * len(texts))]
    assert set(drawn) <= set(texts) and len(set(drawn)) > len(texts) / 2  # the whole pool, sampled
    assert drawn[:len(texts)] != texts  # shuffled
    small = sft.StreamingPackedStream(shards, reader=READER, seed=3, buffer=64)  # within the data: as before
    assert len([next(small._sources[0]) for _ in range(len(texts))]) == len(texts)


def test_stream_resumes_at_its_position(shards):
    a = sft.StreamingPackedStream(shards, reader=READER, seed=5, task_weights=HALF, buffer=32)
    for _ in range(7):
        a.next_batch(3, 50)
    state = a.state_dict()
    expected = [a.next_batch(3, 50) for _ in range(5)]
    b = sft.StreamingPackedStream(shards, reader=READER, seed=5, task_weights=HALF, buffer=32)
    b.load_state_dict(state)
    for (x, y), (bx, by) in zip(expected, (b.next_batch(3, 50) for _ in range(5))):
        assert torch.equal(x, bx) and torch.equal(y, by)
    with pytest.raises(ValueError, match="differ from the data of the checkpoint"):
        sft.StreamingPackedStream(shards, reader=READER, seed=6, task_weights=HALF, buffer=32).load_state_dict(state)
    # the shuffle buffer's size orders a pool's samples: the same files under another buffer are other data
    with pytest.raises(ValueError, match="differ from the data of the checkpoint"):
        sft.StreamingPackedStream(shards, reader=READER, seed=5, task_weights=HALF, buffer=16).load_state_dict(state)


def test_a_stream_resumes_on_the_same_content_only_whatever_its_size_or_folder(shards, tmp_path):
    """The stream's checkpoint named each file by name and size: a file edited in place at the same size
    (lines in another order, a changed digit) resumed on other data. A byte-identical copy in another
    folder still resumes; content beyond the wholly hashed size is sampled in blocks, the size always counted."""
    import shutil

    plain = []
    for p in shards:  # plain JSON lines: an edit that keeps the order's bytes keeps the size
        plain.append(tmp_path / Path(p).name.removesuffix(".gz"))
        with gzip.open(p, "rb") as f:
            plain[-1].write_bytes(f.read())
    (tmp_path / "copy").mkdir()
    copies = [str(shutil.copy(p, tmp_path / "copy" / p.name)) for p in plain]
    a = sft.StreamingPackedStream(copies, reader=READER, seed=5, task_weights=HALF, buffer=32)
    a.next_batch(3, 50)
    state = a.state_dict()
    sft.StreamingPackedStream([str(p) for p in plain], reader=READER, seed=5, task_weights=HALF,
                              buffer=32).load_state_dict(state)  # the same bytes in another folder: resumes
    size = Path(copies[0]).stat().st_size
    Path(copies[0]).write_text("".join(Path(copies[0]).read_text().splitlines(keepends=True)[::-1]))
    assert Path(copies[0]).stat().st_size == size  # the same records in another order, the same size
    with pytest.raises(ValueError, match="differ from the data of the checkpoint"):
        sft.StreamingPackedStream(copies, reader=READER, seed=5, task_weights=HALF, buffer=32).load_state_dict(state)
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(200_000))
    before = sft._content_digest(big, whole=10_000, block=1_000, blocks=8)
    with open(big, "r+b") as f:  # one byte in the last block: sampled
        f.seek(199_999)
        f.write(b"x")
    assert sft._content_digest(big, whole=10_000, block=1_000, blocks=8) != before


def test_stream_task_vocabulary_is_the_in_memory_one(shards):
    in_memory = sft.PackedStream(READER.load_texts(shards), seed=0, task_weights=HALF)
    streamed = sft.StreamingPackedStream(shards, reader=READER, seed=0, task_weights=HALF)
    assert streamed.token_ids().tolist() == in_memory.token_ids().tolist()


def test_stream_names_a_bad_line_when_it_is_made_and_empty_pools(tmp_path, shards):
    """A bad line anywhere stops the stream as it is made: it was named where a draw first reached it,
    hours into a run, up to a checkpoint interval of steps lost, and its fix then changed the data the
    run's resume must find (refused)."""
    bad = tmp_path / "bad.jsonl.gz"
    recs = [{**r, "split": "train"} for r in data.load_split("P", "val")[:400]]
    with gzip.open(bad, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs[:-1])
        f.write(json.dumps({**recs[-1], "best": "a1a1"}) + "\n")
    with pytest.raises(data.DataFormatError, match=rf"{bad}:400: field 'best'"):
        sft.StreamingPackedStream([str(bad)], reader=READER, seed=0, buffer=1)
    out = tmp_path / "run"
    with pytest.raises(data.DataFormatError, match=rf"{bad}:400: field 'best'"):
        sft.train_sft(tiny_cfg(out, train_data=[str(bad)], stream=True, max_steps=2), reader=READER)
    assert not (out / "checkpoints").exists()
    with pytest.raises(ValueError, match="gives 'A' a share of 0.5, but the train data has no sample"):
        sft.StreamingPackedStream([shards[0]], reader=READER, seed=0, task_weights=HALF)


def test_sft_trains_from_a_stream_with_the_task_vocabulary_and_resumes(tmp_path, shards, val_shards):
    val = val_shards
    cfg = tiny_cfg(tmp_path / "run", train_data=shards, val_data=val, stream=True, shuffle_buffer=50, vocab="task",
                   eval_interval=3, max_steps=4, checkpoint_interval=2)
    first = sft.train_sft(cfg, reader=READER, until=2)
    assert first.step == 2
    resumed = sft.train_sft(cfg, reader=READER)  # continues from step 2: data position and vocabulary from the checkpoint
    straight = sft.train_sft(tiny_cfg(tmp_path / "straight", **{k: getattr(cfg, k) for k in (
        "train_data", "val_data", "stream", "shuffle_buffer", "vocab", "eval_interval", "max_steps",
        "checkpoint_interval")}), reader=READER)
    assert [r["step"] for r in resumed.history] == [3, 4]
    assert math_fields(resumed.history) == math_fields(straight.history[-2:])
    in_memory = sft.PackedStream(READER.load_texts(shards + val), seed=0, task_weights=HALF)
    assert sft.SFTTrainer(tiny_cfg(tmp_path / "v", train_data=shards, val_data=val, stream=True,
                                   vocab="task"), reader=READER).vocab.ids.tolist() == in_memory.token_ids().tolist()
    with pytest.raises(ValueError, match=r"^SFTConfig.eval_interval is 2, but a stream \(SFTConfig.stream\) holds no samples back for val"):
        sft.SFTTrainer(tiny_cfg(tmp_path / "w", train_data=shards, stream=True, eval_interval=2), reader=READER)


def test_a_truncated_gz_shard_raises_naming_the_file_after_its_whole_lines(tmp_path, shards):
    """A shard cut short (a copy interrupted mid-file): the records before the cut are read, then one
    DataFormatError names the file and gzip's own reason, where the streaming reader gets to it."""
    packed = Path(shards[0]).read_bytes()
    expected = [json.loads(line) for line in gzip.decompress(packed).splitlines()]
    cut = tmp_path / "policy_val-00000.jsonl.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(EOFError) as gz:  # gzip's verdict on the same bytes
        gzip.decompress(cut.read_bytes())
    read = []
    with pytest.raises(data.DataFormatError) as err:
        for path, lineno, rec in data.iter_records([cut]):
            read.append((path, lineno, rec))
    assert str(err.value) == f"{cut}: cannot read ({gz.value})"
    assert 0 < len(read) < len(expected)
    assert read == [(str(cut), n, rec) for n, rec in enumerate(expected[: len(read)], 1)]
    with pytest.raises(data.DataFormatError, match=f"^{cut}: cannot read "):
        list(READER.iter_texts([str(cut)]))  # what `rookworld sft --stream` reads through


TEXT_SAMPLES = TEXTS[:8]  # P: and A: samples of a seeded game, ~400 tokens


def _text_file(tmp_path, texts=TEXT_SAMPLES, name="texts.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def test_sft_stream_over_text_lines_packs_them_in_file_order(tmp_path):
    """`rookworld sft --stream` over a file of {"text": ...} lines (not records): with a shuffle buffer
    of one and one pool, the batches are EOT t0 EOT t1 ... in the file's order, as GPT-2 encodes them."""
    from rookworld_lib.chess import training

    argv = ["--train-data", _text_file(tmp_path), "--stream", "--shuffle-buffer", "1", "--policy-fraction", "none",
            "--eval-interval", "0", "--model", "tiny", "--model-overrides", "n_layer=1", "--model-overrides",
            "n_embd=32", "--model-overrides", "n_head=2", "--block-size", "32", "--batch-size", "4", "--device", "cpu",
            "--no-progress", "--no-export-hf", "--out", str(tmp_path / "run")]
    cfg, reader = training._sft_config_from_args(training.build_sft_parser().parse_args(argv))
    enc = get_tokenizer()
    tokens = [t for text in TEXT_SAMPLES for t in [EOT_ID, *enc.encode_ordinary(text)]]
    n = (len(tokens) - 1) // 128  # batches of 4 x 32 within the file's first pass
    assert n >= 3
    trainer = sft.SFTTrainer(cfg, reader=reader)
    try:
        assert isinstance(trainer.train_stream, sft.StreamingPackedStream)
        batches = [trainer.train_stream.next_batch(4, 32) for _ in range(n)]
    finally:
        trainer.close()
    for k, (x, y) in enumerate(batches):
        assert x.flatten().tolist() == tokens[128 * k: 128 * (k + 1)], k
        assert y.flatten().tolist() == tokens[128 * k + 1: 128 * (k + 1) + 1], k


def test_the_default_reader_of_text_files_gives_the_batches_of_the_same_texts_in_memory(tmp_path):
    """The core SFTTrainer without a reader reads {"text": ...} files: the same packed batches as the
    same texts handed over as train_texts."""
    path = _text_file(tmp_path)
    batches = []
    for name, kw in (("file", {}), ("texts", {"train_texts": TEXT_SAMPLES})):
        trainer = sft.SFTTrainer(tiny_cfg(tmp_path / name, train_data=(path,), task_weights=None, val_fraction=0.0, block_size=32,
                                          batch_size=4), **kw)
        try:
            assert trainer.train_stream.n_samples == len(TEXT_SAMPLES)
            batches.append([trainer.train_stream.next_batch(4, 32) for _ in range(2)])
        finally:
            trainer.close()
    for (x, y), (tx, ty) in zip(*batches):
        assert torch.equal(x, tx) and torch.equal(y, ty)


def test_a_streamed_val_file_without_one_of_the_tasks_is_measured_as_it_is(tmp_path):
    """stream=True: a val file that lacks a task of the training mix is read as one pool (no task_weights)
    instead of refusing the run."""
    p_only = [t for t in TEXTS if t.startswith("P:")]
    cfg = tiny_cfg(tmp_path / "run", train_data=(_text_file(tmp_path, TEXTS, "train.jsonl"),),
                   val_data=(_text_file(tmp_path, p_only, "val.jsonl"),), stream=True, eval_interval=2, eval_steps=1)
    trainer = sft.SFTTrainer(cfg)
    try:
        assert trainer.val_stream.task_weights is None
        assert trainer.evaluate() > 0
    finally:
        trainer.close()
