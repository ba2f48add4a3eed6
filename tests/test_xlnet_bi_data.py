"""XLNet's bidirectional data (the release's bi_data): the corpus read backward
(lm_data.backward_documents), records forward then backward with their flags
(lm_data.bidirectional, create_lm_data.py --bi_data), stream batches half forward and half
backward, span targets walked in reading order on backward rows, and run_pretraining --bi_data.
The model's backward rows against transformers: tests/test_xlnet_convert.py."""

import json

import numpy as np
import pytest
import tensorflow as tf

from data_prep import lm_data, permutation, spiece, xlnet_data
from data_prep.errors import InputError
from data_prep.pretraining_shards import write_round_robin
from tests import helpers
from tests.conftest import ROOT
from tests.test_xlnet import TINY

S = 4
SPIECE = ROOT / "tests" / "fixtures" / "xlnet_tiny" / "spiece.model"


def test_the_corpus_read_backward_and_the_records_in_both_directions():
    """Documents last to first, each one's ids reversed (sentences last to first, each
    reversed); bidirectional puts the forward records first, flagged 0, then the backward, 1."""
    assert list(lm_data.backward_documents([[1, 2, 3], [4, 5]])) == [[5, 4], [3, 2, 1]]
    sentences = [[[1, 2], [3]], [[4, 5, 6]]]
    assert list(lm_data.backward_documents(sentences)) == [[[6, 5, 4]], [[3], [2, 1]]]
    # With the separator after each document, the stream is the forward one read backward, but
    # for where the separators sit: each still ends its document in the reading direction.
    forward = np.concatenate([[*d, 0] for d in [[1, 2, 3], [4, 5]]])
    backward = np.concatenate([[*d, 0] for d in lm_data.backward_documents([[1, 2, 3], [4, 5]])])
    assert backward.tolist() == [5, 4, 0, 3, 2, 1, 0] and forward[::-1].tolist()[1:] == [
        5, 4, 0, 3, 2, 1,
    ]  # fmt: skip
    records = list(lm_data.bidirectional([{"input_ids": [1]}] * 2, [{"input_ids": [2]}] * 3))
    assert [int(r[lm_data.BACKWARD][0]) for r in records] == [0, 0, 1, 1, 1]
    assert [r["input_ids"] for r in records] == [[1], [1], [2], [2], [2]]


def bi_blocks(tmp_path, forward, backward, files=3, name="bi"):
    """`forward` blocks all n (n = 0, 1, ...) then `backward` blocks all 100 + n, with their
    flags, round-robin over `files` shards as create_lm_data.py --bi_data writes them."""
    paths = [str(tmp_path / f"{name}-{i:05d}-of-{files:05d}.tfrecord") for i in range(files)]
    records = lm_data.bidirectional(
        ({"input_ids": np.full(S, n, np.int32)} for n in range(forward)),
        ({"input_ids": np.full(S, 100 + n, np.int32)} for n in range(backward)),
    )
    assert write_round_robin(records, lm_data.serialize_records, paths, 7) == forward + backward
    return paths


def test_bi_data_stream_batches_are_half_forward_half_backward_streams(tmp_path):
    """21 forward and 23 backward blocks, 2 shards of 4 rows: each direction makes 4 streams of
    min(21, 23) // 4 = 5 blocks; shard k's rows are its 2 forward streams, then its 2 backward
    ones, each continuing its row and starting over after 5 batches; the rows carry their flags.
    An odd batch, too few blocks each way and a forward record after a backward one are
    refused, naming the file."""
    files = bi_blocks(tmp_path, 21, 23)
    spec = lm_data.lm_feature_spec(S) | {lm_data.BACKWARD: tf.io.FixedLenFeature([1], tf.int64)}
    for shard in (0, 1):
        batches = lm_data.stream_dataset(files, 4, S, 2, shard, spec, bi_data=True).take(7)
        rows = [(b["input_ids"].numpy()[:, 0].tolist(), b["backward"].numpy()[:, 0].tolist())
                for b in batches]  # fmt: skip
        base = 10 * shard
        want = [[base + t % 5, base + 5 + t % 5, 100 + base + t % 5, 105 + base + t % 5]
                for t in range(7)]  # fmt: skip
        assert rows == [(w, [0, 0, 1, 1]) for w in want]
    with pytest.raises(ValueError, match="even batch size"):
        lm_data.stream_dataset(files, 3, S, spec=spec, bi_data=True)
    with pytest.raises(InputError, match=r"bi-00000.*at least 22 blocks each way.*21 forward"):
        lm_data.stream_dataset(files, 44, S, spec=spec, bi_data=True)
    mixed = [str(tmp_path / "mixed.tfrecord")]
    records = [*lm_data.bidirectional([{"input_ids": np.zeros(S, np.int32)}] * 2, [])]
    records += [*lm_data.bidirectional([], [{"input_ids": np.ones(S, np.int32)}] * 2)]
    write_round_robin(records[::-1], lm_data.serialize_records, mixed, 7)
    with pytest.raises(InputError, match="mixed.tfrecord: expected forward records, then back"):
        lm_data.stream_dataset(mixed, 2, S, spec=spec, bi_data=True)


def test_backward_rows_walk_their_spans_in_reading_order():
    """A backward row (the forward row's ids reversed) gets the forward row's spans reversed:
    each starts at a word start in reading order and covers its word's pieces after it."""
    rng = np.random.default_rng(3)
    word_start = rng.random((1, 300)) < 0.5
    spans = tf.function(permutation.span_targets)
    forward = spans(word_start, 30, [2, 5], backward=[0]).numpy()
    backward = spans(word_start[:, ::-1], 30, [2, 5], backward=[1]).numpy()
    np.testing.assert_array_equal(backward, forward[:, ::-1])
    # Walked as is, the backward row's spans would start elsewhere.
    as_is = spans(word_start[:, ::-1], 30, [2, 5]).numpy()
    assert (as_is != backward).any()


def stream_of_records(paths, seq_len, reuse_len=0, bi_data=True):
    """The records of `paths` in corpus order, as dicts of numpy arrays."""
    spec = xlnet_data.feature_spec(seq_len) if reuse_len else lm_data.lm_feature_spec(seq_len)
    if bi_data:
        spec[lm_data.BACKWARD] = tf.io.FixedLenFeature([1], tf.int64)
    return [
        {k: v.numpy() for k, v in tf.io.parse_single_example(x, spec).items()}
        for x in lm_data.corpus_order(paths)
    ]


def corpus(tmp_path, documents=30):
    """A corpus file of `documents` documents of 4 sentences of random words, and their texts."""
    rng = np.random.default_rng(0)
    words = "the cat sat on a mat while birds sang over green hills and rivers".split()
    docs = [
        "\n".join(" ".join(rng.choice(words, rng.integers(3, 9))) + "." for _ in range(4))
        for _ in range(documents)
    ]
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(docs) + "\n")
    return path, docs


def test_create_lm_data_bi_data_writes_the_corpus_then_the_corpus_backward(tmp_path):
    """Blocks: the forward records are the plain blocks of the corpus (flag 0), the backward
    ones (flag 1) the blocks of its documents last to first, each one's pieces reversed and
    followed by <eod>. Two-segment records: the backward ones are the release's records of the
    backward stream (the reused part continues the record before, in reading order)."""
    path, docs = corpus(tmp_path)
    pieces = spiece.SentencePieceTokenizer(SPIECE, False)
    eod = pieces.vocab["<eod>"]
    ids = [pieces.encode(d) for d in docs]
    plain = [str(tmp_path / "plain.tfrecord")]
    bi = [str(tmp_path / f"bi-{i}.tfrecord") for i in range(2)]
    common = [f"--input_file={path}", f"--vocab_file={SPIECE}", "--block_size=24",
              "--num_workers=1"]  # fmt: skip
    for out, extra in ((plain, []), (bi, ["--bi_data"])):
        r = helpers.run_main("data_prep/create_lm_data.py",
                             [*common, f"--output_file={','.join(out)}", *extra])  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
    assert "blocks, forward then backward (bi_data), of 24 ids" in r.stdout
    read = stream_of_records(bi, 24)
    flags = [int(x["backward"][0]) for x in read]
    n = flags.count(0)
    assert flags == [0] * n + [1] * (len(read) - n) and n > 10
    forward = [x["input_ids"] for x in read[:n]]
    plain_blocks = [x["input_ids"] for x in stream_of_records(plain, 24, bi_data=False)]
    np.testing.assert_array_equal(forward, plain_blocks)
    stream = np.concatenate([[*d[::-1], eod] for d in ids[::-1]])
    want = stream[: (len(stream) // 24) * 24].reshape(-1, 24)
    np.testing.assert_array_equal([x["input_ids"] for x in read[n:]], want)
    assert lm_data.check_lm_files(bi, 24, xlnet=True) == lm_data.LMKind(0, True)
    with pytest.raises(InputError, match=r"bi-0.tfrecord: expected language-model blocks.*bi_d"):
        lm_data.check_lm_files(bi, 24)  # GPT and ELMo do not read them
    with pytest.raises(InputError, match=r"records like .*plain.tfrecord's \(blocks\)"):
        lm_data.check_lm_files(plain + bi, 24, xlnet=True)

    two = [str(tmp_path / f"two-{i}.tfrecord") for i in range(2)]
    r = helpers.run_main("data_prep/create_lm_data.py", [
        *common, f"--output_file={','.join(two)}", "--reuse_len=8", "--bi_data",
    ])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    read = stream_of_records(two, 24, reuse_len=8)
    flags = [int(x["backward"][0]) for x in read]
    n = flags.count(0)
    assert flags == [0] * n + [1] * (len(read) - n) and 10 < n < len(read) - 10
    sep = pieces.vocab["<sep>"]
    first = read[n]["input_ids"]
    reversed_last = np.concatenate([pieces.encode(s)[::-1] for s in docs[-1].split("\n")[::-1]])
    np.testing.assert_array_equal(first[:8], reversed_last[:8])
    for before, after in zip(read[n:], read[n + 1 :]):  # reused parts continue, in reading order
        a_len = int(np.flatnonzero(before["input_ids"] == sep)[0]) - 8
        k = min(8, a_len)
        assert after["input_ids"][:k].tolist() == before["input_ids"][8 : 8 + k].tolist()
    assert lm_data.check_lm_files(two, 24, xlnet=True) == lm_data.LMKind(8, True)


def test_pretraining_with_bi_data_end_to_end(tmp_path):
    """run_pretraining --bi_data trains on create_lm_data --bi_data's two-segment records with
    memory and span targets, and on its blocks without memory; records and flag must agree, and
    batch sizes be even."""
    path, _ = corpus(tmp_path)
    two = [str(tmp_path / f"two-{i}.tfrecord") for i in range(2)]
    r = helpers.run_main("data_prep/create_lm_data.py", [
        f"--input_file={path}", f"--vocab_file={SPIECE}", "--block_size=24", "--num_workers=1",
        f"--output_file={','.join(two)}", "--reuse_len=8", "--bi_data",
    ])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    config = tmp_path / "xlnet_config.json"
    config.write_text(json.dumps(dict(TINY, n_token=300)))
    args = [
        f"--bert_config_file={config}", f"--input_file={tmp_path}/two-*", "--max_seq_length=24",
        "--max_predictions_per_seq=4", "--train_batch_size=4", "--eval_batch_size=4",
        "--num_warmup_steps=1", "--save_checkpoints_steps=2", "--iterations_per_loop=2",
        "--max_eval_steps=1", "--do_train", "--do_eval", "--num_train_steps=2",
    ]  # fmt: skip
    bi = ["--bi_data", "--mem_len=12", "--xlnet_span_prediction", f"--vocab_file={SPIECE}"]
    r = helpers.run_main("run_pretraining.py", [*args, f"--output_dir={tmp_path / 'o'}", *bi])
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        "two-segment records (reuse_len 8) of 24, 4 predicted each (spans), half backward "
        "(bi_data), a memory of 12 (streams)"
    ) in r.stderr
    recorded = json.loads((tmp_path / "o" / "run_settings.json").read_text())
    assert recorded["bi_data"] is True
    assert "perplexity" in (tmp_path / "o" / "eval_results.txt").read_text()
    r = helpers.run_main("run_pretraining.py", [*args, f"--output_dir={tmp_path / 'p'}"])
    assert r.returncode == 1 and "--bi_data=False: the records are two-segment" in r.stderr
    assert "give --bi_data" in r.stderr
    r = helpers.run_main("run_pretraining.py", [*args, f"--output_dir={tmp_path / 'q'}", *bi,
                                                "--train_batch_size=3"])  # fmt: skip
    assert r.returncode == 1 and "--train_batch_size=3: expected even" in r.stderr
    blocks = tmp_path / "blocks.tfrecord"
    lm_data.write_lm_tfrecords([np.arange(24) % 50 for _ in range(8)], [str(blocks)])
    r = helpers.run_main(
        "run_pretraining.py",
        [*args, f"--input_file={blocks}", f"--output_dir={tmp_path / 'r'}", "--bi_data"],
    )
    assert r.returncode == 1 and "make them with create_lm_data.py --bi_data" in r.stderr


def test_the_backward_flags_reach_the_model_through_the_task(tmp_path):
    """permutation_lm_dataset over bidirectional streams gives each row its flag, and the
    permutation-LM task hands the flags to the model: its loss is the model's with them, not
    the one with every row forward (random ids and weights of a visible size: at the 0.02
    initialization the position terms barely move the logits)."""
    from modeling import xlnet
    from modeling.losses import masked_lm_sums
    from training import plm_tasks

    rng = np.random.default_rng(0)
    files = [str(tmp_path / "bi.tfrecord")]
    blocks = [{"input_ids": rng.integers(0, 110, S).astype(np.int32)} for _ in range(16)]
    records = lm_data.bidirectional(blocks[:8], blocks[8:])
    write_round_robin(records, lm_data.serialize_records, files, 7)
    ds = permutation.permutation_lm_dataset(
        files, 4, S, 2, is_training=False, streams=True, bi_data=True
    )
    batch = next(iter(ds))
    assert batch["backward"].numpy().tolist() == [0, 0, 1, 1]
    config = xlnet.XLNetConfig(**dict(TINY, n_token=110, dropout=0.0, dropatt=0.0))
    model = xlnet.XLNetPretrainer(config)
    model.build()
    model.set_weights([rng.normal(0, 0.5, w.shape) for w in model.get_weights()])
    task = plm_tasks.permutation_lm_task(model)
    got = float(task.sums_fn(batch, training=False)["loss_sum"])

    def by_hand(backward):
        inputs = {k: batch[k] for k in plm_tasks.PLM_INPUTS} | {"backward": backward}
        logits = model(inputs)["plm_logits"]
        return float(
            masked_lm_sums(logits, batch["target_ids"], batch["target_weights"])["loss_sum"]
        )

    assert got == pytest.approx(by_hand(batch["backward"]), abs=1e-5)
    assert abs(got - by_hand(tf.zeros(4, tf.int32))) > 1e-4
