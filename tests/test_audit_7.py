"""Issue #7 gaps closed by the audit (tests/claims/issue7_objectives.md): whole-word masked records
through the BERT record checks and tf.data pipeline with every word masked whole, and SpanBERT
on a BERT config (span masking + span boundary objective, no NSP) pretraining two steps and its
checkpoint fine-tuning a classifier, in process (the other objectives' smoke runs are subprocess
runs in test_run_pretraining.py)."""

import random

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_prep import features, glue, pretraining_data
from data_prep.tokenization import RESERVED_TOKENS, FullTokenizer
from modeling import bert, finetuning
from tests import helpers
from training import finetune_tasks, optimization, tasks, trainer

S, P, B = 13, 4, 3
# Words of several WordPieces, so that whole-word masking has pieces to keep together.
PIECES = ["the", "a", "dog", "cat", "runs", "play", "##ing", "##ed", "un", "##like", "##ly", "."]
SPECIAL = ("[CLS]", "[SEP]")
WORDS = ["the", "a", "dog", "cat", "runs", "playing", "played", "unlikely", "play", "."]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join([*RESERVED_TOKENS, *PIECES]) + "\n")
    return FullTokenizer(path)


def documents(tokenizer, objective, directory):
    """A small corpus (blank lines between documents) read as create_pretraining_data reads it."""
    rng = random.Random(4)
    lines = []
    for _ in range(9):
        for _ in range(rng.randint(2, 4)):
            lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))))
        lines.append("")
    path = directory / "corpus.txt"
    path.write_text("\n".join(lines) + "\n")
    return pretraining_data.read_documents([str(path)], tokenizer, objective)


def test_whole_word_records_feed_the_bert_pipeline_with_words_masked_whole(tmp_path, tokenizer):
    """--do_whole_word_mask records (NSP) pass run_pretraining's record checks, parse in its
    tf.data pipeline, and every masked piece's word is masked whole. Pretraining and fine-tuning
    on them is BERT's path (test_run_pretraining.py): the records differ only in which tokens
    are masked."""
    docs = documents(tokenizer, "nsp", tmp_path)
    instances = pretraining_data.create_training_instances(
        docs, tokenizer.vocab, S, 2, 0.1, 0.2, P, random.Random(1), do_whole_word_mask=True
    )
    path = str(tmp_path / "whole_word.tfrecord")
    pretraining_data.write_instances(instances, [path], S, P, tokenizer.vocab, num_logged=0)
    features.check_pretraining_files([path], S, P, sentence_pairs=True)
    batch = next(iter(features.pretraining_dataset([path], len(instances), S, P, False)))
    inverse = {v: k for k, v in tokenizer.vocab.items()}
    words_with_pieces = 0
    for row in range(len(instances)):
        n = int(batch["masked_lm_weights"][row].numpy().sum())
        positions = batch["masked_lm_positions"][row].numpy()[:n].tolist()
        original = batch["input_ids"][row].numpy().copy()
        original[positions] = batch["masked_lm_ids"][row].numpy()[:n]
        tokens = [inverse[int(t)] for t in original]
        for p in positions:  # the word around p: back to its first piece, on to its last
            # (A segment truncated at its front may start with a "##" piece: a word of its own.)
            first = p
            while tokens[first].startswith("##") and tokens[first - 1] not in SPECIAL:
                first -= 1
            last = p
            while last + 1 < len(tokens) and tokens[last + 1].startswith("##"):
                last += 1
            assert set(range(first, last + 1)) <= set(positions), (row, tokens, positions)
            words_with_pieces += last > first
    assert words_with_pieces > 0  # the property was exercised, not vacuous


def eager_step(task, optimizer, batch) -> dict:
    """One training step of a trainer.Task run eagerly (the Trainer compiles the same sums_fn and
    loss terms into a loop, which costs minutes of tracing on a loaded machine; it is tested in
    test_trainer.py). Returns the step's sums and its loss."""
    with tf.GradientTape() as tape:
        sums = task.sums_fn(batch, True)
        loss = 0.0
        for term in task.loss_terms:
            numerator, denominator, *weight = term
            loss += (weight[0] if weight else 1.0) * sums[numerator] / sums[denominator]
    variables = task.model.trainable_variables
    optimizer.apply(tape.gradient(loss, variables), variables)
    return {k: float(v) for k, v in sums.items()} | {"loss": float(loss)}


def test_spanbert_on_a_bert_config_pretrains_and_its_checkpoint_fine_tunes(tmp_path, tokenizer):
    """Span masking + the span boundary objective without NSP on a BERT config (the ALBERT
    variant runs end to end in test_run_pretraining.py): two steps on batches of run_pretraining's
    pipeline whose loss is L_MLM + L_SBO, then the checkpoint's encoder (not the MLM or SBO heads)
    starts a classifier that takes a training step."""
    docs = documents(tokenizer, "none", tmp_path)
    instances = pretraining_data.create_training_instances(
        docs, tokenizer.vocab, S, 2, 0.1, 0.2, P, random.Random(1),
        sentence_objective="none", masking_scheme="span",
    )  # fmt: skip
    path = str(tmp_path / "span.tfrecord")
    pretraining_data.write_instances(instances, [path], S, P, tokenizer.vocab, num_logged=0)
    # What run_pretraining checks first: these records fit --span_boundary_objective.
    features.check_pretraining_files([path], S, P, span_boundaries=True)

    config = helpers.tiny_config()
    keras.utils.set_random_seed(5)
    pre = bert.BertPretrainer(config, "none", True)
    pre.build()
    before = [w.numpy().copy() for w in pre.span_boundary_head.weights]
    opt = optimization.create_optimizer(1e-3, 2, 0)
    task = tasks.bert_pretraining_task(pre)
    assert {"span_boundary_loss", "masked_lm_loss"} <= set(task.metrics)
    assert not any("sentence" in k for k in task.metrics)
    data = features.pretraining_dataset([path], B, S, P, True, seed=2, span_boundaries=True)
    for batch in data.take(2):
        step = eager_step(task, opt, batch)
    mlm = step["mlm_loss_sum"] / step["mlm_weight"]
    sbo = step["sbo_loss_sum"] / step["sbo_weight"]
    assert np.isfinite(step["loss"]) and sbo > 0
    assert step["loss"] == pytest.approx(mlm + sbo, rel=1e-5)  # SpanBERT sec. 3.2
    assert any(
        not np.array_equal(a, w.numpy()) for a, w in zip(before, pre.span_boundary_head.weights)
    )  # the SBO head trained
    prefix = tf.train.Checkpoint(model=pre).save(str(tmp_path / "pretrain" / "ckpt"))

    task_spec = glue.get_task("sst-2")
    examples = [
        glue.Example(f"t:{i}", str(i), " ".join(random.Random(i).choices(WORDS, k=4)), None, y)
        for i, y in enumerate("011")
    ]
    encoded = glue.encode_examples(examples, task_spec, tokenizer, S)
    keras.utils.set_random_seed(6)
    model = finetuning.BertClassifier(config, 2)
    model.build()
    assert trainer.init_from_checkpoint(model, str(tmp_path / "pretrain")) == (prefix, "encoder")
    for a, b in zip(model.encoder.weights, pre.encoder.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    batch = {k: tf.constant(v) for k, v in encoded.features.items()}
    tuned = eager_step(
        finetune_tasks.classification_task(model), optimization.create_optimizer(1e-3, 1, 0), batch
    )
    assert np.isfinite(tuned["loss"]) and tuned["loss"] > 0
    assert not np.array_equal(model.encoder.weights[0].numpy(), pre.encoder.weights[0].numpy())


def test_an_electra_discriminator_fine_tunes_as_run_squads_span_model(tmp_path):
    """ELECTRA's pretraining checkpoint starts run_squad's model (modeling/span_qa.BertSpanQA,
    built from the ELECTRA config as run_squad builds it): its encoder gets the discriminator's
    weights, not the generator's, and a span QA training step runs (run_classifier and run_ner
    from ELECTRA checkpoints are tested in test_run_pretraining.py and test_tagging.py)."""
    from modeling import electra, span_qa
    from tests.test_electra import TINY as ELECTRA_TINY
    from training import squad_eval

    config = electra.ElectraConfig(**ELECTRA_TINY)
    keras.utils.set_random_seed(7)
    pre = electra.ElectraPretrainer(config)
    pre.build()
    prefix = tf.train.Checkpoint(model=pre).save(str(tmp_path / "electra" / "ckpt"))
    model = span_qa.BertSpanQA(config)
    model.build()
    assert trainer.init_from_checkpoint(model, str(tmp_path / "electra")) == (prefix, "encoder")
    for a, b in zip(model.encoder.weights, pre.encoder.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # The discriminator, not the (smaller) generator: the widths tell them apart.
    assert model.encoder.weights[-1].shape[-1] == config.hidden_size
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": tf.constant(rng.integers(5, config.vocab_size, (B, S)), tf.int32),
        "input_mask": tf.ones((B, S), tf.int32),
        "segment_ids": tf.constant([[0] * 5 + [1] * (S - 5)] * B, tf.int32),
        "start_positions": tf.constant([6, 7, 0], tf.int32),
        "end_positions": tf.constant([8, 7, 0], tf.int32),
    }
    task = squad_eval.span_qa_task(model)
    step = eager_step(task, optimization.create_optimizer(1e-3, 1, 0), batch)
    assert np.isfinite(step["loss"]) and step["count"] == B
    assert not np.array_equal(model.encoder.weights[0].numpy(), pre.encoder.weights[0].numpy())
