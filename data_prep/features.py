"""TFRecord feature specs, in one place, with the original google-research/bert names and dtypes.

Files written by the original `create_pretraining_data.py` are read by `run_pretraining.py` and the
other way round, so the names, dtypes and (padded, fixed) shapes here must stay exactly the
original's: int64 features everywhere except the float `masked_lm_weights`.
"""

from __future__ import annotations

import dataclasses
import struct

import tensorflow as tf

from data_prep.errors import InputError, input_error
from data_prep.files import (  # noqa: F401  (the scripts' features.expand_input_files, ...)
    expand_input_files,
    write_atomically,
)

INT_PRETRAINING_FEATURES = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "next_sentence_labels",
)


def pretraining_feature_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """The parse spec of one pretraining tf.train.Example, as the original run_pretraining.py."""
    s, p = max_seq_length, max_predictions_per_seq
    return {
        "input_ids": tf.io.FixedLenFeature([s], tf.int64),
        "input_mask": tf.io.FixedLenFeature([s], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([s], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([p], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([p], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([p], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


# Unmasked ("packed") records for dynamic masking hold only these; masked_lm_* are made in tf.data.
PACKED_FEATURES = ("input_ids", "input_mask", "segment_ids", "next_sentence_labels")
# SpanBERT's span boundary objective: per prediction, the positions just outside its span.
SPAN_BOUNDARY_FEATURES = ("masked_lm_span_left", "masked_lm_span_right")


def pretraining_record_spec(
    max_seq_length: int,
    max_predictions_per_seq: int,
    masking: str = "static",
    span_boundaries: bool = False,
) -> dict:
    """The parse spec of the records a run reads: the original spec for static masking (plus the
    span boundary features when asked), PACKED_FEATURES only for masking="dynamic"."""
    spec = pretraining_feature_spec(max_seq_length, max_predictions_per_seq)
    if masking == "dynamic":
        return {k: v for k, v in spec.items() if k in PACKED_FEATURES}
    if span_boundaries:
        for name in SPAN_BOUNDARY_FEATURES:
            spec[name] = tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64)
    return spec


def _int_feature(values) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def _float_feature(values) -> tf.train.Feature:
    return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))


def serialize_pretraining_example(
    input_ids,
    segment_ids,
    masked_lm_positions,
    masked_lm_ids,
    next_sentence_label: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
    span_left=None,
    span_right=None,
) -> bytes:
    """Pads one instance to the fixed lengths and serializes it as the original script did.

    Args:
      input_ids: token ids of `[CLS] A [SEP] B [SEP]`, at most max_seq_length of them.
      segment_ids: 0 for `[CLS] A [SEP]`, 1 for `B [SEP]`, same length as input_ids.
      masked_lm_positions: positions in input_ids that were masked (at most
        max_predictions_per_seq); padded with 0 and weight 0.
      masked_lm_ids: the original ids at those positions.
      next_sentence_label: 1 if B is a random sentence, 0 if it is the actual next one
        (the original's convention); for SOP, 1 if A and B were swapped.
      span_left, span_right: optional, with span masking: each prediction's span boundary
        positions, written as SPAN_BOUNDARY_FEATURES (padded with 0).
    """
    n = len(input_ids)
    if n > max_seq_length or len(segment_ids) != n:
        raise ValueError(f"instance of length {n} does not fit max_seq_length={max_seq_length}")
    if len(masked_lm_positions) > max_predictions_per_seq:
        raise ValueError(
            f"{len(masked_lm_positions)} predictions > max_predictions_per_seq="
            f"{max_predictions_per_seq}"
        )
    pad = max_seq_length - n
    npred = len(masked_lm_positions)
    ppad = max_predictions_per_seq - npred
    features = {
        "input_ids": _int_feature(list(input_ids) + [0] * pad),
        "input_mask": _int_feature([1] * n + [0] * pad),
        "segment_ids": _int_feature(list(segment_ids) + [0] * pad),
        "masked_lm_positions": _int_feature(list(masked_lm_positions) + [0] * ppad),
        "masked_lm_ids": _int_feature(list(masked_lm_ids) + [0] * ppad),
        "masked_lm_weights": _float_feature([1.0] * npred + [0.0] * ppad),
        "next_sentence_labels": _int_feature([next_sentence_label]),
    }
    if span_left is not None:
        features["masked_lm_span_left"] = _int_feature(list(span_left) + [0] * ppad)
        features["masked_lm_span_right"] = _int_feature(list(span_right) + [0] * ppad)
    example = tf.train.Example(features=tf.train.Features(feature=features))
    # deterministic=True writes the feature map in sorted key order; otherwise protobuf's map
    # order follows a per-process hash seed and the same seed would not give the same bytes.
    return example.SerializeToString(deterministic=True)


def serialize_packed_example(
    input_ids, segment_ids, next_sentence_label: int, max_seq_length: int
) -> bytes:
    """An unmasked pretraining example (PACKED_FEATURES), padded to max_seq_length, for dynamic
    masking at training time; serialized reproducibly as serialize_pretraining_example."""
    n = len(input_ids)
    if n > max_seq_length or len(segment_ids) != n:
        raise ValueError(f"instance of length {n} does not fit max_seq_length={max_seq_length}")
    pad = max_seq_length - n
    features = {
        "input_ids": _int_feature(list(input_ids) + [0] * pad),
        "input_mask": _int_feature([1] * n + [0] * pad),
        "segment_ids": _int_feature(list(segment_ids) + [0] * pad),
        "next_sentence_labels": _int_feature([next_sentence_label]),
    }
    example = tf.train.Example(features=tf.train.Features(feature=features))
    return example.SerializeToString(deterministic=True)


def parse_pretraining_example(
    serialized,
    max_seq_length: int,
    max_predictions_per_seq: int,
    masking: str = "static",
    span_boundaries: bool = False,
):
    """Parses serialized examples (scalar or batch) to a dict of int32 / float32 tensors, with
    the features of pretraining_record_spec.

    int64 is cast to int32 as the original did (TPUs only take int32).
    """
    spec = pretraining_record_spec(
        max_seq_length, max_predictions_per_seq, masking, span_boundaries
    )
    if serialized.shape.rank == 0:
        parsed = tf.io.parse_single_example(serialized, spec)
    else:
        parsed = tf.io.parse_example(serialized, spec)
    return {k: (tf.cast(v, tf.int32) if v.dtype == tf.int64 else v) for k, v in parsed.items()}


def check_pretraining_files(
    files,
    max_seq_length: int,
    max_predictions_per_seq: int,
    masking: str = "static",
    span_boundaries: bool = False,
    sentence_pairs: bool = False,
) -> None:
    """Reads the first record of each file and checks its feature names, dtypes and lengths.

    A full parse would fail later, deep in tf.data, with neither the file nor the flag to change
    in the message; this says both. Also refuses records that do not fit the run's objectives:
    masked records for masking="dynamic" and unmasked ones for "static", records without span
    boundaries for `span_boundaries`, and (with `sentence_pairs`, for NSP or SOP) records of one
    segment only. Raises InputError.
    """
    spec = pretraining_record_spec(
        max_seq_length, max_predictions_per_seq, masking, span_boundaries
    )
    flag_for = {
        "masked_lm_positions": "--max_predictions_per_seq",
        "masked_lm_ids": "--max_predictions_per_seq",
        "masked_lm_weights": "--max_predictions_per_seq",
    }
    for path in files:
        try:
            first = next(iter(tf.data.TFRecordDataset(path).take(1)), None)
        except tf.errors.DataLossError as e:
            raise input_error(
                f"{path} record 0", "a readable TFRecord", f"corrupt data ({e.message})"
            ) from None
        if first is None:
            raise input_error(path, "at least one TFRecord", "an empty file")
        example = tf.train.Example()
        try:
            example.ParseFromString(first.numpy())
        except Exception:  # noqa: BLE001 - protobuf raises its own DecodeError type
            raise input_error(
                f"{path} record 0", "a serialized tf.train.Example", "other bytes"
            ) from None
        feats = example.features.feature
        _check_objectives(path, feats, masking, span_boundaries, sentence_pairs)
        for name, fixed in spec.items():
            if name not in feats:
                raise input_error(
                    f"{path} record 0", f"feature {name!r}", f"features {sorted(feats)}"
                )
            kind = "float_list" if fixed.dtype == tf.float32 else "int64_list"
            if feats[name].WhichOneof("kind") != kind:
                raise input_error(
                    f"{path} record 0 feature {name!r}", kind, str(feats[name].WhichOneof("kind"))
                )
            n = len(getattr(feats[name], kind).value)
            want = fixed.shape[0]
            if n != want:
                flag = flag_for.get(name, "--max_seq_length")
                raise input_error(
                    f"{path} record 0 feature {name!r}",
                    f"length {want} (from {flag})",
                    f"length {n}: the file was made with a different {flag}",
                )


def _check_objectives(path, feats, masking, span_boundaries, sentence_pairs) -> None:
    where = f"{path} record 0"
    masked = "masked_lm_positions" in feats
    if masking == "dynamic" and masked:
        raise input_error(
            where,
            "unmasked records for --masking=dynamic (written by create_pretraining_data "
            "--masking=dynamic)",
            "masked_lm_positions: its masks were fixed when it was written; pass "
            "--masking=static, or rewrite it with create_pretraining_data --masking=dynamic",
        )
    if masking == "static" and not masked and "input_ids" in feats:
        raise input_error(
            where,
            "masked records for --masking=static",
            f"unmasked records (features {sorted(feats)}): pass --masking=dynamic to mask them "
            "while training",
        )
    if span_boundaries and "masked_lm_span_left" not in feats:
        raise input_error(
            where,
            "span boundary features for --span_boundary_objective (written by "
            "create_pretraining_data --masking_scheme=span)",
            f"features {sorted(feats)}; drop --span_boundary_objective or rewrite the file",
        )
    if sentence_pairs and "segment_ids" in feats:
        if not any(feats["segment_ids"].int64_list.value):
            raise input_error(
                where,
                "sentence pairs (segment 1 after the first [SEP]) for --sentence_objective=nsp "
                "or sop",
                "one segment only (written with --sentence_objective=none); pass "
                "--sentence_objective=none",
            )


# ---------------------------------------------------------------------------------------------
# Damaged files: a full validation pass, and what training skips with skip_corrupt_records
# ---------------------------------------------------------------------------------------------

# A TFRecord is, per record: uint64 length, uint32 CRC of it, the data, uint32 CRC of the data.
_RECORD_OVERHEAD = 16


@dataclasses.dataclass
class FileCheck:
    """What validate_tfrecord_file found in one file.

    good: records that read (CRCs right) and parse with the spec. bad: records that read but do
    not parse. unreadable: records from the first framing or CRC error to the end of the file,
    counted from their length headers where those are intact (at least 1): no TFRecord reader
    goes past such an error, so training with skip_corrupt_records loses all of them.
    problems: (record index, byte offset of the record, what is wrong), the first few.
    """

    path: str
    good: int = 0
    bad: int = 0
    unreadable: int = 0
    problems: list = dataclasses.field(default_factory=list)

    @property
    def skipped(self) -> int:
        return self.bad + self.unreadable

    def describe(self) -> str:
        head = f"{self.path}: {self.good} good records"
        if not self.problems:
            return head
        lost = f", {self.bad} that do not parse, {self.unreadable} unreadable"
        where = "; ".join(f"record {i} (byte {o}): {what}" for i, o, what in self.problems)
        return head + lost + "; " + where


def _count_records_from(path: str, offset: int, size: int) -> int:
    """Records from `offset` to the end by their length headers (at least 1: the damaged one)."""
    n = 0
    with tf.io.gfile.GFile(path, "rb") as f:
        while offset + 8 <= size:
            f.seek(offset)
            (length,) = struct.unpack("<Q", f.read(8))
            n += 1
            offset += length + _RECORD_OVERHEAD
    return max(n, 1)


def validate_tfrecord_file(path: str, spec: dict | None, max_problems: int = 5) -> FileCheck:
    """Reads every record of `path`, checking its CRCs and that it parses with `spec`
    (tf.io.parse_example's feature spec; None checks the CRCs only). Never raises for damaged
    data; returns a FileCheck."""
    check = FileCheck(path)
    size = tf.io.gfile.stat(path).length
    if size == 0:
        check.problems.append((0, 0, "an empty file"))
        return check
    offset, pending = 0, []  # (index, offset, serialized) not yet parsed

    def parse_pending():
        if not pending:
            return
        if spec is None:
            check.good += len(pending)
            pending.clear()
            return
        try:
            tf.io.parse_example([r for _, _, r in pending], spec)
            check.good += len(pending)
        except tf.errors.InvalidArgumentError:  # find which, one by one
            for i, o, r in pending:
                try:
                    tf.io.parse_single_example(r, spec)
                    check.good += 1
                except tf.errors.InvalidArgumentError as e:
                    check.bad += 1
                    if len(check.problems) < max_problems:
                        what = e.message.split(";")[0].split("\n")[0][:200]
                        check.problems.append((i, o, f"does not parse ({what})"))
        pending.clear()

    index = 0
    try:
        for record in tf.data.TFRecordDataset(path):
            data = record.numpy()
            pending.append((index, offset, data))
            index += 1
            offset += len(data) + _RECORD_OVERHEAD
            if len(pending) == 512:
                parse_pending()
    except tf.errors.DataLossError as e:
        check.unreadable = _count_records_from(path, offset, size)
        what = "truncated" if "truncated" in e.message else "corrupted (CRC mismatch)"
        if index == 0 and "Is this even a TFRecord" in e.message:
            what = "not a TFRecord file"
        check.problems.insert(
            0, (index, offset, f"{what}; this and everything after it in the file is lost")
        )
    parse_pending()
    return check


def validate_pretraining_files(
    files, max_seq_length, max_predictions_per_seq, masking="static", span_boundaries=False
) -> list[FileCheck]:
    """validate_tfrecord_file over pretraining files with the run's record spec."""
    spec = pretraining_record_spec(
        max_seq_length, max_predictions_per_seq, masking, span_boundaries
    )
    return [validate_tfrecord_file(f, spec) for f in files]


def damaged_files_error(checks: list[FileCheck]):
    """An InputError naming every damaged file, its first damaged record and byte offset and
    what is lost, or None when all files are sound."""
    damaged = [c for c in checks if c.problems]
    if not damaged:
        return None
    return input_error(
        "; ".join(c.describe() for c in damaged),
        "readable TFRecords that parse as the run's records",
        f"{len(damaged)} damaged file(s) of {len(checks)}; rewrite them, or pass "
        "--skip_corrupt_records to train on the rest (the counts above are what it skips)",
    )


def check_skipped_records(files, spec) -> list[FileCheck]:
    """What skip_corrupt_records will skip, before training: validates every file, logs per file
    the records skipped and where (and the total), and raises InputError when no record is
    left to train on."""
    from absl import logging

    checks = [validate_tfrecord_file(f, spec) for f in files]
    for c in checks:
        if c.skipped:
            logging.warning("--skip_corrupt_records: skipping %d records of %s", c.skipped, c.path)
            logging.warning("%s", c.describe())
    total = sum(c.skipped for c in checks)
    good = sum(c.good for c in checks)
    logging.info("--skip_corrupt_records: %d of %d records skipped", total, total + good)
    if not good:
        raise input_error(
            "; ".join(c.describe() for c in checks),
            "at least one sound record to train on (--skip_corrupt_records)",
            "none",
        )
    return checks


def damaged_input_error(files, error: Exception):
    """After `error` (a DataLossError: TensorFlow names no file) while reading `files`: an
    InputError naming the damaged files and records (CRCs checked), or None when every file
    reads (the error came from elsewhere)."""
    found = damaged_files_error([validate_tfrecord_file(f, None) for f in files])
    if found is None:
        return None
    return InputError(f"{found} (TensorFlow: {str(error).strip()[:200]})")


def _records_skipping_corrupt(path, spec):
    """One file's records, dropping those that do not parse and, at a framing or CRC error, the
    rest of the file (what validate_tfrecord_file counts), with a logged warning."""

    def checked(serialized):
        parsed = tf.io.parse_single_example(serialized, spec)
        # tf.data prunes a parse whose values nothing reads (and folds its static sizes), so an
        # always-true Assert (stateful, kept) reads a sum of its values.
        total = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float64)) for v in parsed.values()])
        known = tf.math.is_finite(total) | tf.math.is_nan(total) | tf.math.is_inf(total)
        with tf.control_dependencies([tf.debugging.Assert(known, [serialized])]):
            return tf.identity(serialized)

    records = tf.data.TFRecordDataset(path).map(checked)
    return records.ignore_errors(log_warning=True)


def pretraining_dataset(
    input_files: list[str],
    batch_size: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
    is_training: bool,
    seed: int = 12345,
    num_shards: int = 1,
    shard_index: int = 0,
    dynamic_masking=None,
    span_boundaries: bool = False,
    skip_corrupt_records: bool = False,
) -> tf.data.Dataset:
    """Batches of parsed pretraining examples, deterministic for a given seed.

    Training repeats forever and shuffles with a fixed seed, so the input position can be saved in
    a checkpoint and a resumed run sees exactly the batches an uninterrupted one would. Files are
    split over `num_shards` workers (multi-worker training) when there are enough of them, else the
    records are. Batches drop the remainder so every replica gets equal slices.

    `dynamic_masking` (a data_prep.masking.DynamicMasking) reads unmasked records and masks each
    batch with masking.mask_dynamic seeded by (seed, batch index * num_shards + shard_index): the
    batch index is counted by the pipeline and saved with the iterator, so a resumed run masks
    exactly as an uninterrupted one, and every epoch masks the same sequence anew. Eval
    (is_training=False) masks the same way each time it runs. `span_boundaries` adds the span
    boundary features of static span-masked records. `skip_corrupt_records` drops records that
    do not parse and, per file, everything from a framing or CRC error on (validate_tfrecord_file
    counts both), instead of failing.

    Returns a dataset of dicts of int32 (B, S) / (B, P) / (B, 1) tensors and float32 (B, P)
    `masked_lm_weights`, with B = batch_size.
    """
    files = tf.data.Dataset.from_tensor_slices(list(input_files))
    by_file = num_shards > 1 and len(input_files) >= num_shards
    if by_file:
        files = files.shard(num_shards, shard_index)
    if is_training:
        files = files.shuffle(len(input_files), seed=seed, reshuffle_each_iteration=False)
    read = tf.data.TFRecordDataset
    if skip_corrupt_records:
        spec = pretraining_record_spec(
            max_seq_length,
            max_predictions_per_seq,
            "dynamic" if dynamic_masking is not None else "static",
            span_boundaries,
        )

        def read(path):
            return _records_skipping_corrupt(path, spec)

    records = files.interleave(
        read,
        cycle_length=min(4, len(input_files)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if num_shards > 1 and not by_file:
        records = records.shard(num_shards, shard_index)
    if is_training:
        records = records.repeat().shuffle(10_000, seed=seed, reshuffle_each_iteration=True)
    batches = records.batch(batch_size, drop_remainder=True)
    if dynamic_masking is not None:
        from data_prep import masking

        def parse_and_mask(index, serialized):
            batch = parse_pretraining_example(
                serialized, max_seq_length, max_predictions_per_seq, "dynamic"
            )
            mask_seed = tf.stack([tf.cast(seed, tf.int64), index * num_shards + shard_index])
            masked = masking.mask_dynamic(
                batch["input_ids"], batch["input_mask"], mask_seed, dynamic_masking
            )
            return batch | masked

        batches = batches.enumerate().map(
            parse_and_mask, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )
        return batches.prefetch(tf.data.AUTOTUNE)
    batches = batches.map(
        lambda s: parse_pretraining_example(
            s, max_seq_length, max_predictions_per_seq, span_boundaries=span_boundaries
        ),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    return batches.prefetch(tf.data.AUTOTUNE)


# ---------------------------------------------------------------------------------------------
# Fine-tuning (run_classifier.py): the original `file_based_convert_examples_to_features` names.
# ---------------------------------------------------------------------------------------------


def classifier_feature_spec(
    max_seq_length: int, num_choices: int = 0, regression: bool = False
) -> dict:
    """Parse spec of one fine-tuning example: the original run_classifier's features.

    input_ids, input_mask, segment_ids: int64 [S], or [C * S] (choice after choice) for multiple
    choice; label_ids: int64 [1], or float32 [1] for regression (the original has no regression);
    is_real_example: int64 [1], 0 for the rows that pad a set to full batches.
    """
    width = max_seq_length * max(num_choices, 1)
    return {
        "input_ids": tf.io.FixedLenFeature([width], tf.int64),
        "input_mask": tf.io.FixedLenFeature([width], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([width], tf.int64),
        "label_ids": tf.io.FixedLenFeature([1], tf.float32 if regression else tf.int64),
        "is_real_example": tf.io.FixedLenFeature([1], tf.int64),
    }


def serialize_classifier_example(
    input_ids, input_mask, segment_ids, label_id, is_real_example: int = 1, regression=False
) -> bytes:
    """Serializes one padded example: int arrays (numpy) of shape (S,) or (C, S), flattened
    choice after choice, and an int label id, or a float score when `regression`."""

    def flat(values):
        return values.reshape(-1).tolist() if hasattr(values, "reshape") else list(values)

    features = {
        "input_ids": _int_feature(flat(input_ids)),
        "input_mask": _int_feature(flat(input_mask)),
        "segment_ids": _int_feature(flat(segment_ids)),
        "label_ids": (
            _float_feature([float(label_id)]) if regression else _int_feature([int(label_id)])
        ),
        "is_real_example": _int_feature([int(is_real_example)]),
    }
    example = tf.train.Example(features=tf.train.Features(feature=features))
    return example.SerializeToString(deterministic=True)


def parse_classifier_examples(
    serialized, max_seq_length: int, num_choices: int = 0, regression: bool = False
) -> dict:
    """Parses a batch of serialized fine-tuning examples (string (B,)) to model inputs.

    Returns int32 input_ids, input_mask, segment_ids (B, S) or (B, C, S); label_ids int32 (B,)
    or float32 (B,) for regression; is_real_example int32 (B,).
    """
    spec = classifier_feature_spec(max_seq_length, num_choices, regression)
    parsed = tf.io.parse_example(serialized, spec)
    out = {}
    for key, value in parsed.items():
        if value.dtype == tf.int64:
            value = tf.cast(value, tf.int32)  # TPUs take int32 only, as the original casts
        if key in ("label_ids", "is_real_example"):
            value = tf.reshape(value, [-1])  # (B, 1) -> (B,)
        elif num_choices:
            value = tf.reshape(value, [-1, num_choices, max_seq_length])  # (B, C*S) -> (B, C, S)
        out[key] = value
    return out


# Dynamic padding rounds a batch's length up to a multiple of this: a few distinct shapes (each
# one a trace under XLA), and row counts the matmul kernels block well.
TRIM_MULTIPLE = 8


def trim_to_longest(batch: dict, multiple: int = TRIM_MULTIPLE) -> dict:
    """`batch` with its sequence features cut to the batch's longest example (dynamic padding).

    batch: a dict of batched features with `input_mask` (B, S) or (B, C, S), real tokens first
    (right padding, as every BERT-family encoding here writes them). Every entry of the mask's
    rank (input_ids, segment_ids, a tagger's label_ids / label_weights) is cut along its last
    axis to L: one past the last real token of any row, rounded up to `multiple`, at least
    `multiple` (a batch of padding rows alone keeps a [CLS] position) and at most S. Entries of
    lower rank (label_ids of a classifier, is_real_example) pass unchanged.

    Why: a BERT encoder's outputs at real tokens do not depend on how many padding positions
    follow (padding keys get exp(-10000) = 0 weight, positions count from the left), so the cut
    batch gives the same logits (tests/test_finetuning.py) for less work: GLUE sentences fill a
    fraction of a 128-position window. Not for left padding (XLNet) or static-shape devices
    (TPU).
    """
    mask = batch["input_mask"]
    rank = mask.shape.rank
    seq = tf.shape(mask)[-1]
    real = tf.reshape(tf.cast(mask, tf.int32), [-1, seq])
    last = tf.reduce_max(real * tf.range(1, seq + 1)[None, :])  # one past the last real token
    length = tf.minimum(seq, tf.maximum(multiple, (last + multiple - 1) // multiple * multiple))
    return {k: v[..., :length] if v.shape.rank == rank else v for k, v in batch.items()}


def sort_by_length(batch: dict) -> dict:
    """`batch`'s rows in order of their real length (the sum of `input_mask` over its last axis;
    a multiple-choice example's longest choice), shortest first; rows of equal length keep their
    order (a stable sort, so a seeded shuffle before it stays the only source of order)."""
    mask = tf.cast(batch["input_mask"], tf.int32)
    lengths = tf.reduce_sum(mask, axis=-1)
    if mask.shape.rank == 3:
        lengths = tf.reduce_max(lengths, axis=-1)
    order = tf.argsort(lengths, stable=True)
    return {k: tf.gather(v, order) for k, v in batch.items()}


def classifier_dataset(
    input_files: list[str],
    batch_size: int,
    max_seq_length: int,
    num_choices: int = 0,
    regression: bool = False,
    seed: int = 12345,
    num_shards: int = 1,
    shard_index: int = 0,
    shuffle_buffer: int = 10_000,
    skip_corrupt_records: bool = False,
    dynamic_padding: bool = False,
    length_group_batches: int = 0,
) -> tf.data.Dataset:
    """Endless shuffled training batches of fine-tuning examples, deterministic for a seed.

    Records are split over `num_shards` workers, shuffled within a buffer (reshuffled every
    epoch; a buffer at least the set's size is a full shuffle) and batched dropping the
    remainder so every replica gets an equal slice. The iterator can be saved in a checkpoint:
    its state is file offsets plus the buffer of serialized records. `skip_corrupt_records`:
    as pretraining_dataset's (check_skipped_records logs per file what is skipped).
    `dynamic_padding`: each batch cut to its longest example (trim_to_longest), so the
    sequence axis is (None) in the element spec. `length_group_batches` (with dynamic_padding):
    each run of that many batches' examples, as they leave the shuffle, sorted by length and
    batched again, the batches shuffled (--group_by_length; see _shuffled_training_batches).
    """
    return _shuffled_training_batches(
        input_files,
        batch_size,
        lambda s: parse_classifier_examples(s, max_seq_length, num_choices, regression),
        seed,
        num_shards,
        shard_index,
        shuffle_buffer,
        classifier_feature_spec(max_seq_length, num_choices, regression),
        skip_corrupt_records,
        dynamic_padding,
        length_group_batches,
    )


def _shuffled_training_batches(
    input_files,
    batch_size,
    parse_fn,
    seed,
    num_shards,
    shard_index,
    shuffle_buffer,
    spec,
    skip_corrupt_records,
    dynamic_padding: bool = False,
    length_group_batches: int = 0,
) -> tf.data.Dataset:
    """The fine-tuning input pipeline shared by classifier_dataset, squad_dataset and
    tagging_dataset: records (with skip_corrupt_records, the sound ones of each file, as
    pretraining_dataset) sharded over workers, shuffled in a seeded buffer, repeated, batched
    (remainder dropped), parsed with `parse_fn` on whole batches (then, with dynamic_padding,
    cut to their longest example: trim_to_longest), prefetched.

    length_group_batches (group by length, needs dynamic_padding): the shuffled records are
    taken `length_group_batches` batches at a time; each group's examples are sorted by length
    (sort_by_length) and cut into batches again, and the batches pass a seeded shuffle buffer of
    one group. So a batch holds examples of similar lengths and is cut shorter (the longest of 32
    random sentence pairs is near the window's length); every example still comes once per pass
    over the shuffled stream, but batches are no longer random samples, and the batch order is
    drawn from a group's worth of batches (as Hugging Face's group_by_length).
    """
    if length_group_batches < 0:
        raise ValueError(f"length_group_batches: expected >= 0, found {length_group_batches}")
    if length_group_batches and not dynamic_padding:
        raise ValueError("length_group_batches needs dynamic_padding: full-length batches gain "
                         "nothing from grouping")  # fmt: skip
    if skip_corrupt_records:
        check_skipped_records(input_files, spec)
        files = tf.data.Dataset.from_tensor_slices(list(input_files))
        records = files.flat_map(lambda path: _records_skipping_corrupt(path, spec))
    else:
        records = tf.data.TFRecordDataset(list(input_files))
    if num_shards > 1:
        records = records.shard(num_shards, shard_index)
    records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    if length_group_batches:
        groups = records.batch(batch_size * length_group_batches, drop_remainder=True)
        groups = groups.map(
            lambda s: sort_by_length(parse_fn(s)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        batches = groups.unbatch().batch(batch_size, drop_remainder=True)
        # Its own seed: the record shuffle's would repeat the same draw sequence.
        batch_seed = None if seed is None else seed + 1
        batches = batches.shuffle(length_group_batches, seed=batch_seed)
        batches = batches.map(trim_to_longest, num_parallel_calls=tf.data.AUTOTUNE)
        return batches.prefetch(tf.data.AUTOTUNE)
    batches = records.batch(batch_size, drop_remainder=True)

    def parse(serialized):
        parsed = parse_fn(serialized)
        return trim_to_longest(parsed) if dynamic_padding else parsed

    batches = batches.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return batches.prefetch(tf.data.AUTOTUNE)


# ---------------------------------------------------------------------------------------------
# SQuAD (run_squad.py): the original run_squad `FeatureWriter` names.
# ---------------------------------------------------------------------------------------------


def squad_feature_spec(max_seq_length: int) -> dict:
    """Parse spec of one SQuAD training window, as the original's training TFRecords.

    unique_ids int64 [1]; input_ids, input_mask, segment_ids int64 [S]; start_positions,
    end_positions int64 [1] (0 = [CLS] when the window holds no answer); is_impossible int64 [1].
    """
    return {
        "unique_ids": tf.io.FixedLenFeature([1], tf.int64),
        "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "start_positions": tf.io.FixedLenFeature([1], tf.int64),
        "end_positions": tf.io.FixedLenFeature([1], tf.int64),
        "is_impossible": tf.io.FixedLenFeature([1], tf.int64),
    }


def serialize_squad_example(
    unique_id, input_ids, input_mask, segment_ids, start_position, end_position, is_impossible
) -> bytes:
    """Serializes one padded SQuAD training window (int lists of length S and int scalars)."""
    features = {
        "unique_ids": _int_feature([int(unique_id)]),
        "input_ids": _int_feature(list(input_ids)),
        "input_mask": _int_feature(list(input_mask)),
        "segment_ids": _int_feature(list(segment_ids)),
        "start_positions": _int_feature([int(start_position)]),
        "end_positions": _int_feature([int(end_position)]),
        "is_impossible": _int_feature([int(bool(is_impossible))]),
    }
    example = tf.train.Example(features=tf.train.Features(feature=features))
    return example.SerializeToString(deterministic=True)


def parse_squad_examples(serialized, max_seq_length: int) -> dict:
    """Parses a batch of serialized SQuAD windows (string (B,)): int32 input_ids, input_mask,
    segment_ids (B, S); int32 unique_ids, start_positions, end_positions, is_impossible (B,)."""
    parsed = tf.io.parse_example(serialized, squad_feature_spec(max_seq_length))
    out = {}
    for key, value in parsed.items():
        value = tf.cast(value, tf.int32)  # TPUs take int32 only, as the original casts
        if value.shape[-1] == 1:
            value = tf.reshape(value, [-1])  # (B, 1) -> (B,)
        out[key] = value
    return out


def squad_dataset(
    input_files: list[str],
    batch_size: int,
    max_seq_length: int,
    seed: int = 12345,
    num_shards: int = 1,
    shard_index: int = 0,
    shuffle_buffer: int = 10_000,
    skip_corrupt_records: bool = False,
    dynamic_padding: bool = False,
    length_group_batches: int = 0,
) -> tf.data.Dataset:
    """Endless shuffled training batches of SQuAD windows (see classifier_dataset: same
    sharding, shuffling, checkpointable iterator, skip_corrupt_records and
    length_group_batches; `dynamic_padding`: each batch cut to its longest window, for
    span_qa_task's mask_padding loss)."""
    return _shuffled_training_batches(
        input_files,
        batch_size,
        lambda s: parse_squad_examples(s, max_seq_length),
        seed,
        num_shards,
        shard_index,
        shuffle_buffer,
        squad_feature_spec(max_seq_length),
        skip_corrupt_records,
        dynamic_padding,
        length_group_batches,
    )


# ---------------------------------------------------------------------------------------------
# Token tagging (run_ner.py): one window of a sentence, labels at every position.
# ---------------------------------------------------------------------------------------------


def tagging_feature_spec(max_seq_length: int) -> dict:
    """Parse spec of one tagging window (data_prep/conll.py).

    input_ids, input_mask, segment_ids, label_ids: int64 [S]; label_weights: float32 [S], 1.0 at
    the first WordPiece of each word the window predicts, 0.0 elsewhere (as masked_lm_weights).
    """
    s = max_seq_length
    return {
        "input_ids": tf.io.FixedLenFeature([s], tf.int64),
        "input_mask": tf.io.FixedLenFeature([s], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([s], tf.int64),
        "label_ids": tf.io.FixedLenFeature([s], tf.int64),
        "label_weights": tf.io.FixedLenFeature([s], tf.float32),
    }


def serialize_tagging_example(
    input_ids, input_mask, segment_ids, label_ids, label_weights
) -> bytes:
    """Serializes one padded tagging window: arrays (or lists) of length S."""
    features = {
        "input_ids": _int_feature([int(x) for x in input_ids]),
        "input_mask": _int_feature([int(x) for x in input_mask]),
        "segment_ids": _int_feature([int(x) for x in segment_ids]),
        "label_ids": _int_feature([int(x) for x in label_ids]),
        "label_weights": _float_feature([float(x) for x in label_weights]),
    }
    example = tf.train.Example(features=tf.train.Features(feature=features))
    return example.SerializeToString(deterministic=True)


def parse_tagging_examples(serialized, max_seq_length: int) -> dict:
    """Parses a batch of serialized tagging windows (string (B,)): int32 input_ids, input_mask,
    segment_ids, label_ids (B, S) and float32 label_weights (B, S)."""
    parsed = tf.io.parse_example(serialized, tagging_feature_spec(max_seq_length))
    # int64 -> int32: TPUs take int32 only, as the original casts.
    return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in parsed.items()}


def tagging_dataset(
    input_files: list[str],
    batch_size: int,
    max_seq_length: int,
    seed: int = 12345,
    num_shards: int = 1,
    shard_index: int = 0,
    shuffle_buffer: int = 10_000,
    skip_corrupt_records: bool = False,
    dynamic_padding: bool = False,
    length_group_batches: int = 0,
) -> tf.data.Dataset:
    """Endless shuffled training batches of tagging windows (see classifier_dataset: same
    sharding, shuffling, checkpointable iterator, skip_corrupt_records, dynamic_padding, which
    cuts the labels and their weights with the inputs, and length_group_batches)."""
    return _shuffled_training_batches(
        input_files,
        batch_size,
        lambda s: parse_tagging_examples(s, max_seq_length),
        seed,
        num_shards,
        shard_index,
        shuffle_buffer,
        tagging_feature_spec(max_seq_length),
        skip_corrupt_records,
        dynamic_padding,
        length_group_batches,
    )
