"""Damaged TFRecords: the validation pass names file, record and byte offset; skipping counts."""

import pytest

from data_prep import features
from data_prep.errors import InputError
from tests import helpers

S, P, N = 11, 3, 9


def damage(tmp_path):
    """Sound and damaged copies of one 9-record file; returns {name: path}."""
    sound = tmp_path / "sound.tfrecord"
    helpers.write_synthetic_pretraining_file(sound, N, S, P, helpers.TINY["vocab_size"])
    data = sound.read_bytes()
    size = len(data) // N  # every record has the same length: fixed-length features
    assert size * N == len(data)
    paths = {"sound": sound}
    flipped = bytearray(data)
    flipped[4 * size + 20] ^= 0x01  # a payload byte of record 4: its data CRC no longer fits
    truncated = data[: 6 * size + size // 2]  # half of record 6
    for name, content in [
        ("flipped", bytes(flipped)),
        ("truncated", truncated),
        ("empty", b""),
        ("text", b"this is not a TFRecord\n" * 5),
    ]:
        paths[name] = tmp_path / f"{name}.tfrecord"
        paths[name].write_bytes(content)
    paths["foreign"] = tmp_path / "foreign.tfrecord"  # LM blocks: sound TFRecords, other features
    from data_prep import lm_data

    lm_data.write_lm_tfrecords([list(range(S))] * 4, [str(paths["foreign"])])
    return paths, size


def test_validation_names_file_record_and_offset(tmp_path):
    paths, size = damage(tmp_path)
    checks = {
        name: features.validate_pretraining_files([str(p)], S, P)[0] for name, p in paths.items()
    }
    counts = {n: (c.good, c.bad, c.unreadable) for n, c in checks.items()}
    assert counts == {
        "sound": (9, 0, 0),
        "flipped": (4, 0, 5),  # records 4..8: no reader goes past the CRC error
        "truncated": (6, 0, 1),
        "empty": (0, 0, 0),
        "text": (0, 0, 1),
        "foreign": (0, 4, 0),
    }
    first = {n: c.problems[0][:2] for n, c in checks.items() if c.problems}
    assert first == {
        "flipped": (4, 4 * size),
        "truncated": (6, 6 * size),
        "empty": (0, 0),
        "text": (0, 0),
        "foreign": (0, 0),
    }
    assert "CRC" in checks["flipped"].problems[0][2]
    assert "truncated" in checks["truncated"].problems[0][2]
    assert "empty file" in checks["empty"].problems[0][2]
    assert "not a TFRecord" in checks["text"].problems[0][2]
    assert "does not parse" in checks["foreign"].problems[0][2]
    assert features.damaged_files_error([checks["sound"]]) is None
    error = features.damaged_files_error(list(checks.values()))
    assert isinstance(error, InputError)
    assert f"{paths['flipped']}: 4 good records" in str(error)
    assert f"record 6 (byte {6 * size}): truncated" in str(error)
    assert "5 damaged file(s) of 6" in str(error)


@pytest.mark.parametrize("skip", [False, True])
def test_training_input_skips_exactly_what_validation_counts(tmp_path, skip):
    paths, _ = damage(tmp_path)
    files = [str(paths[n]) for n in ("sound", "flipped", "truncated", "foreign")]
    data = features.pretraining_dataset(
        files, 1, S, P, is_training=False, skip_corrupt_records=skip
    )
    if not skip:  # records lost: none; it stops instead
        with pytest.raises(Exception, match="corrupted record|truncated|Feature"):
            list(data)
        return
    read = len(list(data))
    checks = features.validate_pretraining_files(files, S, P)
    assert read == sum(c.good for c in checks) == 9 + 4 + 6
    assert sum(c.skipped for c in checks) == 5 + 1 + 4
