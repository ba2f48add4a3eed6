"""XLNet's segment recurrence in pretraining: stream batches (row j continues row j), the
SegmentMemory a training step reads and leaves (equal to the model given that memory by hand,
on one device and Mirrored over two CPUs), run_pretraining --mem_len saving and resuming it;
and the release's two-segment records (data_prep/xlnet_data.py, create_lm_data --reuse_len)
with their targets and masks. The model's memory against transformers:
tests/test_xlnet_convert.py."""

import dataclasses
import json
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_prep import lm_data, permutation, spiece, xlnet_data
from data_prep.errors import InputError
from modeling import xlnet
from modeling.losses import masked_lm_sums
from tests import helpers, test_permutation
from tests.conftest import ROOT
from tests.test_xlnet import TINY, tiny_pretrainer
from training import optimization, plm_tasks
from training.trainer import EXTRA_COLUMNS, Trainer, slice_for_replica

S, P, B, MEM_LEN = 4, 2, 4, 6


def numbered_blocks(tmp_path, count, files=3, length=S):
    """`count` blocks, block n all n, written round-robin over `files` shards (block n in file
    n mod files, as create_lm_data.py writes them)."""
    paths = [str(tmp_path / f"lm-{i:05d}-of-{files:05d}.tfrecord") for i in range(files)]
    lm_data.write_lm_tfrecords([np.full(length, n, np.int32) for n in range(count)], paths)
    return paths


def test_stream_batches_continue_every_row_across_shards_and_epochs(tmp_path):
    """23 blocks over 3 files, 2 shards of 2 rows: 4 streams of 5 consecutive blocks (the last 3
    dropped); shard k's row j at batch t is block (2k + j) x 5 + t, and every stream starts over
    after 5 batches. Fewer blocks than streams are refused, naming the file."""
    files = numbered_blocks(tmp_path, 23)
    assert [int(b[0]) for b in lm_data.corpus_order(files).map(
        lambda r: tf.io.parse_single_example(r, lm_data.lm_feature_spec(S))["input_ids"])
    ] == list(range(23))  # fmt: skip
    for shard in (0, 1):
        batches = lm_data.stream_dataset(files, 2, S, num_shards=2, shard_index=shard).take(7)
        rows = [b["input_ids"].numpy()[:, 0].tolist() for b in batches]
        base = 10 * shard
        want = [[base + t % 5, base + 5 + t % 5] for t in range(7)]
        assert rows == want
    with pytest.raises(InputError, match=r"lm-00000-of-00003.*at least 24 blocks.*found 23"):
        lm_data.stream_dataset(files, 12, S, num_shards=2)


def pretrainer_with(weights):
    """The tiny XLNetPretrainer without dropout, holding `weights` (built in the caller's
    strategy scope)."""
    model = xlnet.XLNetPretrainer(xlnet.XLNetConfig(**TINY, dropout=0.0, dropatt=0.0))
    model.build()
    model.set_weights(weights)
    return model


def random_batches(count):
    """`count` permutation-LM batches of random (B, S) blocks, batch t drawn with seed (1, t)."""
    rng = np.random.default_rng(0)
    return [
        permutation.permutation_lm_features(rng.integers(0, 29, (B, S)), [1, t], P)
        for t in range(count)
    ]


def loss_sum(model, batch, mems=None) -> float:
    """The permutation-LM loss sum of `batch` by the model itself, given `mems` by hand."""
    inputs = {k: batch[k] for k in plm_tasks.PLM_INPUTS} | ({"mems": mems} if mems else {})
    logits = model(inputs)["plm_logits"]
    sums = masked_lm_sums(logits, batch["target_ids"], batch["target_weights"])
    return float(sums["loss_sum"])


def memory_steps(strategy, weights, batches):
    """Three training-mode passes of the permutation-LM task with a SegmentMemory under
    `strategy` (no update): each step's summed loss, and the memory after each."""
    with strategy.scope():
        model = pretrainer_with(weights)
        memory = plm_tasks.SegmentMemory(model.config, B, MEM_LEN)
        task = plm_tasks.permutation_lm_task(model, memory)

    @tf.function
    def step(batch):
        sums = strategy.run(lambda b: task.sums_fn(b, training=True)["loss_sum"], (batch,))
        return strategy.reduce("sum", sums, axis=None)

    losses, states = [], []
    for batch in batches:
        losses.append(float(step(slice_for_replica(strategy, batch))))
        states.append((memory.states.numpy(), int(memory.filled.numpy())))
    return losses, states


def test_training_steps_read_the_memory_the_step_before_left():
    """S = 4, a memory of 6: the first step reads an empty memory (the same loss as no memory),
    the second the first block's layer inputs (4 slots filled), the third the last 6 of both
    (xlnet.cache_mems), each equal to the model given that memory by hand; Mirrored over two
    CPUs (2 rows a replica, gathered) equals one device."""
    model = tiny_pretrainer()
    weights = model.get_weights()
    batches = random_batches(3)
    sums, states = memory_steps(tf.distribute.OneDeviceStrategy("/cpu:0"), weights, batches)
    assert [filled for _, filled in states] == [4, 6, 6]
    mems, want = None, []
    for batch in batches:
        want.append(loss_sum(model, batch, mems))
        inputs = {k: batch[k] for k in plm_tasks.PLM_INPUTS} | ({"mems": mems} if mems else {})
        mems = xlnet.cache_mems(mems, model.encoder(inputs)["encoder_outputs"], MEM_LEN)
    np.testing.assert_allclose(sums, want, rtol=1e-5)
    np.testing.assert_allclose(states[-1][0], np.stack(mems), atol=1e-6)
    assert abs(sums[1] - loss_sum(model, batches[1])) > 1e-3  # the memory is read
    mirrored, mirrored_states = memory_steps(helpers.mirrored_strategy(), weights, batches)
    np.testing.assert_allclose(mirrored, sums, rtol=1e-5)
    np.testing.assert_allclose(mirrored_states[-1][0], states[-1][0], atol=1e-6)


def test_evaluation_carries_its_own_memory_emptied_before_each_evaluation():
    """With an eval memory, eval steps read the memory earlier eval batches left (the second
    batch's loss is the training path's second), the training memory untouched; eval_start
    empties it, so an evaluation repeated gives the same losses."""
    model = tiny_pretrainer()
    batches = random_batches(2)
    train, evaluation = (plm_tasks.SegmentMemory(model.config, B, MEM_LEN) for _ in range(2))
    task = plm_tasks.permutation_lm_task(model, train, evaluation)

    def losses(training):
        return [float(task.sums_fn(b, training=training)["loss_sum"]) for b in batches]

    first = losses(False)
    assert int(train.filled.numpy()) == 0 and int(evaluation.filled.numpy()) == MEM_LEN
    task.eval_start()
    np.testing.assert_allclose(losses(False), first, rtol=1e-6)
    np.testing.assert_allclose(losses(True), first, rtol=1e-6)  # dropout off: the same path
    assert abs(first[1] - loss_sum(model, batches[1])) > 1e-3  # the memory is read


def trained_with_memory(strategy, weights, files, use_xla=False):
    """Three Trainer steps (AdamW, updates applied) with a SegmentMemory on stream batches of
    `files`: the rows, the weights and the memory after."""
    with strategy.scope():
        model = pretrainer_with(weights)
        task = plm_tasks.permutation_lm_task(
            model, plm_tasks.SegmentMemory(model.config, B, MEM_LEN)
        )
        opt = optimization.create_optimizer(1e-2, 10, 1)
        opt.build(model.trainable_variables)
    fit = Trainer(strategy, task, opt, use_xla=use_xla)
    data = permutation.permutation_lm_dataset(files, B, S, P, True, streams=True)
    rows = fit.train_steps(iter(data), 3)
    return rows, model.get_weights(), task.state[0].numpy()


@pytest.mark.parametrize("where", ["xla", "mirrored"])
def test_trainer_steps_with_memory_equal_one_device(tmp_path, where):
    """Whole training steps with the memory (read, updated, gathered over replicas, updates
    applied): the whole step under XLA, and Mirrored over two CPUs, give the one-device rows,
    weights and memory."""
    files = numbered_blocks(tmp_path, 20)  # 5 streams' worth: each row's blocks continue
    weights = tiny_pretrainer().get_weights()
    one = trained_with_memory(tf.distribute.OneDeviceStrategy("/cpu:0"), weights, files)
    if where == "xla":
        other = trained_with_memory(
            tf.distribute.OneDeviceStrategy("/cpu:0"), weights, files, use_xla=True
        )
    else:
        other = trained_with_memory(helpers.mirrored_strategy(), weights, files)
    # The FLOPs column aside: each replica also computes the per-batch relative-position terms.
    flops_column = len(other[0][0]) - len(EXTRA_COLUMNS) - 1
    keep = np.arange(len(one[0][0])) != flops_column
    np.testing.assert_allclose(other[0][:, keep], one[0][:, keep], rtol=1e-5, atol=1e-6)
    for a, b in zip(other[1], one[1]):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(other[2], one[2], atol=1e-5)
    assert np.abs(one[2]).max(axis=-1).all()  # every slot filled after 3 steps of 4


def test_pretraining_with_memory_resumes_where_an_uninterrupted_run_is(tmp_path):
    """run_pretraining --mem_len on stream batches, 4 steps saved every 2; a copy of its folder
    without ckpt-4 (a run killed after step 2's save) resumes to the same losses and memory bit
    for bit (the memory is in the checkpoint: without it step 3 would read an empty one); the
    run settings refuse another --mem_len; --mem_len is refused for BERT and with gradient
    accumulation (as XLNet always is: its task has no denominators_fn)."""
    rng = np.random.default_rng(0)
    data = [str(tmp_path / f"lm-{i:05d}-of-00002.tfrecord") for i in range(2)]
    lm_data.write_lm_tfrecords([rng.integers(5, 29, 8) for _ in range(40)], data)
    config = tmp_path / "xlnet_config.json"
    config.write_text(json.dumps(TINY))
    args = [
        f"--bert_config_file={config}", f"--input_file={tmp_path}/lm-*", "--max_seq_length=8",
        "--max_predictions_per_seq=3", "--train_batch_size=4", "--eval_batch_size=4",
        "--num_warmup_steps=1", "--save_checkpoints_steps=2", "--iterations_per_loop=2",
        "--max_eval_steps=1", "--do_train", "--mem_len=12", "--num_train_steps=4",
    ]  # fmt: skip

    def run(out, *more):
        return helpers.run_main("run_pretraining.py", [*args, f"--output_dir={out}", *more])

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    r = run(whole)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "a memory of 12 (streams)" in r.stderr
    shutil.copytree(whole, parts)
    for path in parts.glob("ckpt-4.*"):
        path.unlink()
    r = run(parts)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {parts / 'ckpt-2'} at step 2" in r.stderr

    def losses(out):
        return [row["plm_loss"] for row in map(json.loads, open(out / "train_log.jsonl"))]

    def memory(out):
        reader = tf.train.load_checkpoint(str(out / "ckpt-4"))
        state, filled = (
            reader.get_tensor(f"task_state/{i}/.ATTRIBUTES/VARIABLE_VALUE") for i in (0, 1)
        )
        return state, int(filled)

    assert len(losses(whole)) == 4 and losses(parts) == losses(whole)
    (kept, filled), (want, _) = memory(parts), memory(whole)
    assert kept.shape == (2, 4, 12, 12) and filled == 12 and np.abs(kept).max(axis=-1).all()
    np.testing.assert_array_equal(kept, want)
    r = run(parts, "--mem_len=8")
    assert r.returncode == 1 and "--mem_len was 12 and is now 8" in r.stderr
    r = run(tmp_path / "accumulated", "--gradient_accumulation_steps=2")
    assert r.returncode == 1 and "--gradient_accumulation_steps" in r.stderr
    bert_config = tmp_path / "bert_config.json"
    bert_config.write_text(helpers.tiny_config().to_json_string())
    r = run(tmp_path / "bert", f"--bert_config_file={bert_config}")
    assert r.returncode == 1 and "--mem_len: XLNet's permutation LM only" in r.stderr


@pytest.mark.parametrize("split", ["gradient_accumulation_steps", "parallel_micro_batches"])
def test_a_task_that_carries_state_refuses_split_batches(split):
    """Each part of a split batch would move the memory: the Trainer refuses, even for a task
    that could split its batches (a denominators_fn)."""
    model = tiny_pretrainer()
    task = plm_tasks.permutation_lm_task(model, plm_tasks.SegmentMemory(model.config, B, 3))
    task = dataclasses.replace(task, denominators_fn=lambda batch: {})
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with pytest.raises(ValueError, match="carries state from step to step"):
        Trainer(strategy, task, keras.optimizers.Adam(), **{split: 2})


SEP, CLS, EOD = 90, 91, 92


def sentences_corpus(rng, documents=12):
    """Documents of 2-5 sentences of 1-6 ids each, every id distinct: an id tells its place."""
    counter = iter(range(100, 10**6))
    return [
        [[next(counter) for _ in range(rng.integers(1, 7))] for _ in range(rng.integers(2, 6))]
        for _ in range(documents)
    ]


def test_sentence_stream_flips_at_sentences_and_glues_eod_to_the_last():
    ids, sentence_ids = xlnet_data.sentence_stream([[[1, 2], [3]], [[4, 5, 6]]], EOD)
    assert ids.tolist() == [1, 2, 3, EOD, 4, 5, 6, EOD]
    assert sentence_ids.tolist() == [True, True, False, False, True, True, True, True]


def test_two_segment_records_follow_the_release_layout():
    """Record t: the stream's ids from t x R, then A (the ids from t x R + R), <sep>, B
    (consecutive ids from a sentence start: label 1 the sentence right after A's, whose right
    end may be cut to fit; label 0 one elsewhere), <sep>, <cls>; segment ids 0 .. 0 1 .. 1 2.
    Both labels occur; the same seed gives the same records, another seed others."""
    rng = np.random.default_rng(0)
    ids, sentence_ids = xlnet_data.sentence_stream(sentences_corpus(rng, 40), EOD)
    seq_len, reuse = 16, 5
    records = list(xlnet_data.two_segment_records(ids, sentence_ids, seq_len, reuse, SEP, CLS, 3))
    assert len(records) > 20
    where = {int(v): i for i, v in enumerate(ids) if v != EOD}
    starts = {i for i in range(1, len(ids)) if sentence_ids[i] != sentence_ids[i - 1]}
    labels = []
    for t, r in enumerate(records):
        x, seg = r["input_ids"], r["segment_ids"]
        assert len(x) == len(seg) == seq_len and r["reuse_len"].tolist() == [reuse]
        assert x[:reuse].tolist() == ids[t * reuse : t * reuse + reuse].tolist()
        seps = np.flatnonzero(x == SEP)
        assert len(seps) == 2 and seps[1] == seq_len - 2 and x[-1] == CLS
        a, b = x[reuse : seps[0]], x[seps[0] + 1 : seps[1]]
        assert seg.tolist() == [0] * (seps[0] + 1) + [1] * (len(b) + 1) + [2]
        assert len(a) >= 1 and a.tolist() == ids[t * reuse + reuse :][: len(a)].tolist()
        label = int(r["next_sentence_labels"][0])
        labels.append(label)
        b_start = where[int(b[0])]  # B starts at a sentence, so not at an <eod>
        assert b[1:].tolist() == ids[b_start + 1 : b_start + len(b)].tolist()
        assert b_start in starts or b_start == 0
        if label == 1:  # a sentence start after A's, within the segments' room
            a_start = t * reuse + reuse
            assert a_start + len(a) <= b_start <= a_start + seq_len - reuse - 3
    assert 0 < sum(labels) < len(labels)
    again = list(xlnet_data.two_segment_records(ids, sentence_ids, seq_len, reuse, SEP, CLS, 3))
    other = list(xlnet_data.two_segment_records(ids, sentence_ids, seq_len, reuse, SEP, CLS, 4))
    same = [np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(records, again)]
    assert all(same)
    assert not all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(records, other))
    with pytest.raises(ValueError, match="reuse_len"):
        next(xlnet_data.two_segment_records(ids, sentence_ids, seq_len, 13, SEP, CLS, 3))


def test_two_segment_targets_and_masks():
    """P - P // 2 targets in the reused part, P // 2 in the rest, none at <sep> or <cls>; no
    reused position sees one after the reused part (both streams); the rest sees the reused
    context; segment ids go with the features."""
    rng = np.random.default_rng(1)
    ids, sentence_ids = xlnet_data.sentence_stream(sentences_corpus(rng, 30), EOD)
    seq_len, reuse, p = 16, 6, 5
    records = list(xlnet_data.two_segment_records(ids, sentence_ids, seq_len, reuse, SEP, CLS, 0))
    batch = {k: np.stack([r[k] for r in records[:8]]) for k in ("input_ids", "segment_ids")}
    out = permutation.two_segment_features(
        batch["input_ids"], batch["segment_ids"], [5, 0], p, reuse
    )
    positions = np.asarray(out["target_mapping"]).argmax(-1)  # (B, P)
    assert ((positions < reuse).sum(1) == p - p // 2).all()
    targets = np.take_along_axis(batch["input_ids"], positions, 1)
    assert not np.isin(targets, [SEP, CLS]).any()
    np.testing.assert_array_equal(out["target_ids"], targets)
    np.testing.assert_array_equal(out["segment_ids"], batch["segment_ids"])
    hidden = np.asarray(out["perm_mask"])  # 1: i may not see j
    assert (hidden[:, :reuse, reuse:] == 1).all()
    is_target = np.zeros(batch["input_ids"].shape, bool)
    np.put_along_axis(is_target, positions, True, 1)
    for row in range(8):
        context = np.flatnonzero(~is_target[row])
        reused_context = context[context < reuse]
        assert (hidden[row][np.ix_(np.arange(reuse, seq_len), reused_context)] == 0).all()
    # Another seed draws other targets.
    other = permutation.two_segment_features(
        batch["input_ids"], batch["segment_ids"], [6, 0], p, reuse
    )
    assert not np.array_equal(other["target_mapping"], out["target_mapping"])


def test_two_segment_span_targets_walk_each_part_apart():
    """With word starts: P - P // 2 targets in the reused part and P // 2 in the rest, never at
    <sep> or <cls> though they count as word starts here; the spans start at word starts (half
    the ids are, and nearly all runs of targets start at one where uniform draws would start
    half); the same seed gives the same targets."""
    rng = np.random.default_rng(2)
    ids, sentence_ids = xlnet_data.sentence_stream(sentences_corpus(rng, 300), EOD)
    seq_len, reuse, p = 200, 96, 8
    records = list(xlnet_data.two_segment_records(ids, sentence_ids, seq_len, reuse, SEP, CLS, 0))
    batch = {k: np.stack([r[k] for r in records[:16]]) for k in ("input_ids", "segment_ids")}
    table = rng.random(int(ids.max()) + 1) < 0.5
    table[[SEP, CLS]] = True
    word_start = table[batch["input_ids"]]

    def targets(seed, starts=word_start):
        return permutation.two_segment_targets(
            batch["segment_ids"], seed, p, reuse, starts, mask_alpha=6, mask_beta=1
        ).numpy()

    is_target = targets([4, 0])
    assert (is_target[:, :reuse].sum(1) == p - p // 2).all()
    assert (is_target[:, reuse:].sum(1) == p // 2).all()
    assert not np.isin(batch["input_ids"][is_target], [SEP, CLS]).any()
    at_word = [word_start[row, start] for row, mask in enumerate(is_target)
               for start, _ in test_permutation.runs(mask)]  # fmt: skip
    assert np.mean(at_word) > 0.9, np.mean(at_word)
    np.testing.assert_array_equal(targets([4, 0]), is_target)
    assert (targets([4, 1]) != is_target).any()
    out = permutation.two_segment_features(
        batch["input_ids"], batch["segment_ids"], [4, 0], p, reuse, word_start
    )
    chosen = np.asarray(out["target_mapping"]).argmax(-1)
    want = np.stack([np.flatnonzero(row) for row in targets(permutation.fold([4, 0], 1))])
    np.testing.assert_array_equal(chosen, want)


def test_two_segment_records_pretrain_with_memory_end_to_end(tmp_path):
    """create_lm_data.py --reuse_len with an XLNet spiece.model writes the release's records
    (record t + 1 starts with record t's segment A, as far as the reused part reaches), and
    run_pretraining trains on them with --mem_len (segment ids read, only the reused part
    cached); blocks mixed in, span prediction and too many targets are refused."""
    model = ROOT / "tests" / "fixtures" / "xlnet_tiny" / "spiece.model"
    corpus = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    words = "the cat sat on a mat while birds sang over green hills and rivers".split()
    corpus.write_text("\n\n".join(
        "\n".join(" ".join(rng.choice(words, rng.integers(3, 9))) + "." for _ in range(4))
        for _ in range(30)
    ) + "\n")  # fmt: skip
    records = [str(tmp_path / f"xl-{i:05d}-of-00002.tfrecord") for i in range(2)]
    r = helpers.run_main("data_prep/create_lm_data.py", [
        f"--input_file={corpus}", f"--output_file={','.join(records)}", f"--vocab_file={model}",
        "--block_size=24", "--reuse_len=8", "--num_workers=1",
    ])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "two-segment records (reuse_len 8) of 24 ids" in r.stdout
    spec = xlnet_data.feature_spec(24)
    read = [
        {k: v.numpy() for k, v in tf.io.parse_single_example(x, spec).items()}
        for x in lm_data.corpus_order(records)
    ]
    assert len(read) > 40
    pieces = spiece.SentencePieceTokenizer(model)
    sep, cls = pieces.vocab["<sep>"], pieces.vocab["<cls>"]
    for before, after in zip(read, read[1:]):
        a_len = int(np.flatnonzero(before["input_ids"] == sep)[0]) - 8
        n = min(8, a_len)
        assert after["input_ids"][:n].tolist() == before["input_ids"][8 : 8 + n].tolist()
        assert before["input_ids"][-1] == cls and before["segment_ids"][-1] == 2
    config = tmp_path / "xlnet_config.json"
    config.write_text(json.dumps(dict(TINY, n_token=300)))
    args = [
        f"--bert_config_file={config}", f"--input_file={tmp_path}/xl-*", "--max_seq_length=24",
        "--max_predictions_per_seq=4", "--train_batch_size=4", "--eval_batch_size=4",
        "--num_warmup_steps=1", "--save_checkpoints_steps=3", "--iterations_per_loop=3",
        "--max_eval_steps=1", "--do_train", "--do_eval", "--mem_len=12", "--num_train_steps=3",
    ]  # fmt: skip
    out = tmp_path / "out"
    r = helpers.run_main("run_pretraining.py", [*args, f"--output_dir={out}"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "two-segment records (reuse_len 8) of 24, 4 predicted each" in r.stderr
    reader = tf.train.load_checkpoint(str(out / "ckpt-3"))
    assert reader.get_tensor("task_state/1/.ATTRIBUTES/VARIABLE_VALUE") == 12  # 3 x 8, cut
    assert "perplexity" in (out / "eval_results.txt").read_text()
    blocks = tmp_path / "xl-blocks.tfrecord"
    lm_data.write_lm_tfrecords([np.arange(24) % 50 for _ in range(4)], [str(blocks)])
    r = helpers.run_main("run_pretraining.py", [*args, f"--output_dir={tmp_path / 'mixed'}"])
    assert r.returncode == 1 and "two-segment records, reuse_len 8" in r.stderr
    blocks.unlink()
    r = helpers.run_main("run_pretraining.py", [*args, f"--output_dir={tmp_path / 'p'}",
                                                "--max_predictions_per_seq=17"])  # fmt: skip
    assert r.returncode == 1 and "predict 9 of the reused part's 8 positions" in r.stderr
    spans = ["--xlnet_span_prediction", f"--vocab_file={model}", "--num_train_steps=1"]
    r = helpers.run_main("run_pretraining.py", [*args, f"--output_dir={tmp_path / 's'}", *spans])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "two-segment records (reuse_len 8) of 24, 4 predicted each (spans)" in r.stderr


def test_the_memory_lets_a_block_copy_the_one_before(tmp_path):
    """A corpus of random 16-id blocks each followed by its copy: with --mem_len=16 the model
    predicts the copies from the memory (held-out accuracy near the half of the targets that
    are copies, the other half at chance); without a memory it stays at chance (1 in 45)."""
    rng = np.random.default_rng(0)

    def pairs(count):
        return [b for b in rng.integers(5, 50, (count, 16)).astype(np.int32) for b in (b, b)]

    train, heldout = str(tmp_path / "train.tfrecord"), str(tmp_path / "heldout.tfrecord")
    lm_data.write_lm_tfrecords(pairs(600), [train])
    lm_data.write_lm_tfrecords(pairs(64), [heldout])
    config = tmp_path / "xlnet_config.json"
    config.write_text(json.dumps(dict(TINY, d_model=64, d_head=16, n_head=4, d_inner=128,
                                      n_token=50)))  # fmt: skip
    accuracy = {}
    for arm, more in (("plain", []), ("memory", ["--mem_len=16"])):
        out = tmp_path / arm
        r = helpers.run_main("run_pretraining.py", [
            f"--bert_config_file={config}", f"--input_file={train}",
            f"--eval_input_file={heldout}", f"--output_dir={out}", "--do_train", "--do_eval",
            "--max_seq_length=16", "--max_predictions_per_seq=4", "--train_batch_size=16",
            "--eval_batch_size=16", "--num_train_steps=400", "--num_warmup_steps=40",
            "--learning_rate=3e-3", "--max_eval_steps=8", "--save_checkpoints_steps=400",
            "--iterations_per_loop=100", *more,
        ])  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        lines = (out / "eval_results.txt").read_text().splitlines()
        accuracy[arm] = float(dict(line.split(" = ") for line in lines)["plm_accuracy"])
    # 400 steps gave 0.021 and 0.520 (the 64th session)
    assert accuracy["plain"] < 0.1 and accuracy["memory"] > 0.35
