"""DistilBERT's pieces: the student's start from every other teacher layer, the compatibility
check, the soft-target and cosine losses against hand computations, and the task's weighting.
(The run_pretraining smoke run is in tests/test_run_pretraining.py.)"""

import math

import numpy as np
import pytest
import tensorflow as tf

from data_prep.errors import InputError
from modeling import bert, losses
from tests import helpers
from training import tasks, trainer


def built(config, seed):
    import keras

    keras.utils.set_random_seed(seed)
    model = bert.BertPretrainer(config, "none")
    model.build()
    return model


def test_student_starts_from_every_other_teacher_layer():
    assert bert.student_layer_sources(6, 12) == [0, 2, 4, 6, 8, 10]
    assert bert.student_layer_sources(3, 12) == [0, 4, 8]
    assert bert.student_layer_sources(3, 3) == [0, 1, 2]
    teacher = built(helpers.tiny_config(num_hidden_layers=5, initializer_range=0.5), 1)
    student = built(helpers.tiny_config(num_hidden_layers=2), 2)
    assert bert.init_student_from_teacher(student, teacher) == [0, 2]
    for i, j in enumerate([0, 2]):
        for a, b in zip(student.encoder.blocks[i].weights, teacher.encoder.blocks[j].weights):
            np.testing.assert_array_equal(a, b)
    for part in ("embeddings", "pooler"):
        for a, b in zip(
            getattr(student.encoder, part).weights, getattr(teacher.encoder, part).weights
        ):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(student.masked_lm.weights, teacher.masked_lm.weights):
        np.testing.assert_array_equal(a, b)
    # Layer 1 of the teacher is in no student layer.
    kernel = teacher.encoder.blocks[1].intermediate.kernel.numpy()
    assert not any(np.array_equal(b.intermediate.kernel, kernel) for b in student.encoder.blocks)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"vocab_size": 55},
            r"vocab_size=55 differs from the teacher's vocab_size=53.*set it to 53",
        ),
        ({"hidden_size": 15}, r"hidden_size=15 differs .*set it to 12"),
        ({"num_hidden_layers": 3}, r"num_hidden_layers=3 is more than the teacher's 2"),
        # A RoBERTa teacher's (positions from 2, epsilon 1e-5): the student keeps both.
        ({"position_offset": 0}, r"position_offset=0 differs .*set it to 2"),
        ({"layer_norm_eps": 1e-12}, r"layer_norm_eps=1e-12 differs .*set it to 1e-05"),
    ],
)
def test_student_that_cannot_learn_from_the_teacher_says_what_to_change(change, message):
    teacher = helpers.tiny_config(position_offset=2, layer_norm_eps=1e-5)
    student = helpers.tiny_config(**{"position_offset": 2, "layer_norm_eps": 1e-5, **change})
    with pytest.raises(InputError, match=f"student.json: {message}"):
        bert.check_student_fits_teacher(student, teacher, "student.json")


def test_soft_target_loss_against_a_hand_computation():
    s = np.array([[[1.0, 0.0, -1.0], [3.0, 3.0, 3.0]]], "float32")  # (B=1, P=2, V=3)
    t = np.array([[[0.5, 0.5, 0.0], [9.0, 0.0, 0.0]]], "float32")
    weights = np.array([[1.0, 0.0]], "float32")  # the second prediction is padding

    def hand(temperature):
        ps = [math.exp(x / temperature) for x in (1.0, 0.0, -1.0)]
        pt = [math.exp(x / temperature) for x in (0.5, 0.5, 0.0)]
        ps = [x / sum(ps) for x in ps]
        pt = [x / sum(pt) for x in pt]
        return sum(q * math.log(q / p) for p, q in zip(ps, pt)) * temperature**2

    for temperature in (1.0, 2.0):
        out = losses.soft_target_sums(s, t, weights, temperature)
        assert float(out["weight"]) == 1.0
        assert float(out["loss_sum"]) == pytest.approx(hand(temperature), rel=1e-5)
    same = losses.soft_target_sums(t, t, np.ones((1, 2), "float32"), 2.0)
    assert abs(float(same["loss_sum"])) < 1e-6


def test_cosine_loss_is_zero_for_the_teacher_itself_and_two_when_opposite():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(3, 7, 12)).astype("float32")
    mask = np.ones((3, 7), "int32")
    mask[1, 5:] = 0
    same = losses.cosine_sums(h, h * 2.0, mask)  # the direction is what counts
    assert float(same["count"]) == 19 and abs(float(same["loss_sum"])) < 1e-5
    flipped = h.copy()
    flipped[1, 5:] = -h[1, 5:]  # padding positions do not count
    assert abs(float(losses.cosine_sums(h, flipped, mask)["loss_sum"])) < 1e-5
    assert float(losses.cosine_sums(h, -h, mask)["loss_sum"]) == pytest.approx(2 * 19, rel=1e-5)


def test_task_weights_the_three_losses_and_a_copy_of_the_teacher_has_only_mlm_loss(tmp_path):
    config = helpers.tiny_config()
    teacher = built(config, 1)
    student = built(config, 2)
    bert.init_student_from_teacher(student, teacher)  # same depth: an exact copy
    path = tmp_path / "a.tfrecord"
    helpers.write_synthetic_pretraining_file(path, 6, 11, 3, 53)
    from data_prep import features

    feed = next(iter(features.pretraining_dataset([str(path)], 3, 11, 3, is_training=False)))
    task = tasks.distillation_task(student, teacher)
    fit = trainer.Trainer(tf.distribute.get_strategy(), task, None)
    sums = task.sums_fn(feed, training=False)
    row = [float(sums[k]) for k in fit.sum_keys]
    m = fit.metrics_from_sums(row)
    assert abs(m["soft_target_loss"]) < 1e-5 and abs(m["cosine_loss"]) < 1e-5
    assert fit.loss_from_sums(row) == pytest.approx(2.0 * m["masked_lm_loss"], rel=1e-5)
    other = tasks.distillation_task(built(config, 3), teacher, 2.0, 5.0, 2.0, 1.0)
    sums = other.sums_fn(feed, training=False)
    row = [float(sums[k]) for k in fit.sum_keys]
    m = fit.metrics_from_sums(row)
    assert m["soft_target_loss"] > 0 and m["cosine_loss"] > 0
    want = 5.0 * m["soft_target_loss"] + 2.0 * m["masked_lm_loss"] + m["cosine_loss"]
    assert trainer.Trainer(tf.distribute.get_strategy(), other, None).loss_from_sums(
        row
    ) == pytest.approx(want, rel=1e-6)
    # The teacher is not trained: none of its variables is the student's.
    assert not {id(v) for v in teacher.weights} & {id(v) for v in student.trainable_variables}
