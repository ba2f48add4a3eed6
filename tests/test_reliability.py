"""Reliability: negative controls for exact resume, a full disk, archive extraction, and an audit
of what Cloze deletes and deserialises. (Kill/resume, SIGTERM and damaged TFRecords are tested in
test_trainer.py and test_run_pretraining.py; bench/reliability.py loops over them.)"""

import importlib
import io
import json
import logging
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_prep import features
from data_prep.errors import InputError
from data_prep.fetch import extract_members
from data_prep.tokenization import RESERVED_TOKENS
from modeling import span_qa
from tests import helpers, test_trainer
from tests.test_trainer import P, S, _run, build, dataset, weights
from training import optimization, squad_eval, trainer

ROOT = Path(__file__).resolve().parents[1]
data_file = test_trainer.data_file  # the same fixture: 40 synthetic pretraining records


# ---------------------------------------------------------------------------------------------
# Exact resume: the bitwise comparison must fail when iterator or dropout RNG state is left out


DROPOUT = dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


def _resume_by_hand(out_dir, data_file, config, leave_out: str):
    """Restores ckpt-6 of `out_dir` the way run_training does, but without `leave_out` (one of
    "nothing", "iterator", "seed_states"), trains steps 7-12 and returns (weights, rows)."""
    fit = build(tf.distribute.OneDeviceStrategy("/cpu:0"), config, steps=12)
    model = fit.task.model
    iterator = iter(dataset(data_file))
    parts = {
        "model": model,
        "optimizer": fit.optimizer,
        "iterator": iterator,
        "seed_states": trainer.seed_states(model),
    }
    assert parts["seed_states"], "the dropout layers hold no seed-generator state"
    parts.pop(leave_out, None)
    status = tf.train.Checkpoint(**parts).restore(os.path.join(out_dir, "ckpt-6"))
    status.expect_partial().assert_existing_objects_matched()
    rows = fit.train_steps(iterator, 6)
    return weights(model), rows


def test_resume_negative_controls_fail_without_iterator_or_rng_state(tmp_path, data_file):
    config = helpers.tiny_config(**DROPOUT)
    # The straight run's own ckpt-6 (it keeps its last 5 checkpoints: 3, 6, 9 and 12), saved
    # mid-run as any resumed checkpoint is.
    straight = _run(tmp_path / "a", data_file, 12, config)
    log = trainer.read_jsonl(str(tmp_path / "a" / "train_log.jsonl"))
    want_loss = [r["loss"] for r in log[6:]]

    def same(leave_out):
        got_weights, rows = _resume_by_hand(str(tmp_path / "a"), data_file, config, leave_out)
        loss = [straight.loss_from_sums(r) for r in rows]
        equal = all(np.array_equal(a, b) for a, b in zip(weights(straight.task.model), got_weights))
        return equal, loss == want_loss

    # Positive control: restoring everything by hand reproduces the uninterrupted run exactly,
    # so a difference below comes from what was left out and not from the by-hand restore.
    assert same("nothing") == (True, True)
    # Without the iterator the resumed run re-reads the first batches; without the seed states it
    # draws other dropout masks. Either way weights and losses differ from the straight run.
    assert same("iterator") == (False, False)
    assert same("seed_states") == (False, False)


def test_mirrored_resume_replays_and_skips_no_batch(tmp_path, data_file):
    # The bound on replayed data under distribution: 0 batches. The distributed iterator cannot
    # be checkpointed (tensorflow issue 56372), so the trainer feeds the replicas from one plain
    # per-worker iterator, sliced per replica (trainer.slice_for_replica), and saves that
    # iterator in every checkpoint; under MultiWorkerMirroredStrategy each worker saves its own
    # (test_two_workers_train_as_one_survive_a_kill_and_resume checks the same there). Every
    # step's loss depends on its batch, so equal loss logs mean the same batches in order.
    config = helpers.tiny_config()
    mirrored = helpers.mirrored_strategy()
    straight, resumed, (log_a, log_b) = test_trainer._straight_and_resumed(
        tmp_path, data_file, 9, 3, config, strategy=mirrored
    )
    assert straight.strategy.num_replicas_in_sync == 2
    assert [r["step"] for r in log_b] == list(range(1, 10)) and log_a == log_b
    for a, b in zip(weights(straight.task.model), weights(resumed.task.model)):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------------------------
# Disk full: the save fails naming the path, the previous checkpoint restores intact

_FULL_DISK_SCRIPT = textwrap.dedent(
    """
    import resource, signal, sys
    import numpy as np
    sys.path.insert(0, {root!r})
    from tests import helpers
    from tests.test_trainer import _run, weights
    config = helpers.tiny_config()
    fit = _run({out!r}, {data!r}, 3, config)
    np.savez({saved!r}, *weights(fit.task.model))
    # A write past the limit fails with EFBIG instead of killing the process with SIGXFSZ.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
    _run({out!r}, {data!r}, 6, config)
    """
)


def _run_child(script: str, timeout: int) -> subprocess.CompletedProcess:
    """`python -c script` with TensorFlow's C++ logging quiet; output captured as text."""
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )


def test_full_disk_names_the_path_and_keeps_the_previous_checkpoint(tmp_path, data_file):
    out = tmp_path / "run"
    saved = tmp_path / "after3.npz"
    script = _FULL_DISK_SCRIPT.format(
        root=str(ROOT), out=str(out), data=data_file, saved=str(saved), limit=20_000
    )
    result = _run_child(script, timeout=300)
    assert result.returncode != 0, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert re.search(re.escape(str(out)) + r"/ckpt-6_temp/\S+; File too large", last), last
    # The checkpoint of step 3 is still the latest and holds exactly the weights of step 3.
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-3")
    fit = build(tf.distribute.OneDeviceStrategy("/cpu:0"), helpers.tiny_config())
    trainer.restore_model_weights(fit.task.model, str(out))
    with np.load(saved) as want:
        for i, got in enumerate(weights(fit.task.model)):
            np.testing.assert_array_equal(got, want[f"arr_{i}"])
    # With room again, a rerun cleans the half-written folder and goes on from step 3.
    assert (out / "ckpt-6_temp").is_dir()
    _run(out, data_file, 6, helpers.tiny_config())
    assert not (out / "ckpt-6_temp").exists()
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-6")
    log = trainer.read_jsonl(str(out / "train_log.jsonl"))
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]


def test_unwritable_output_dir_names_the_path(tmp_path, data_file):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError, match=re.escape(str(blocker / "out"))):
        _run(blocker / "out", data_file, 3, helpers.tiny_config())


_READ_ONLY_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    sys.path.insert(0, {root!r})
    from tests import helpers
    from tests.test_trainer import _run, weights
    config = helpers.tiny_config()
    fit = _run({out!r}, {data!r}, 3, config)
    np.savez({saved!r}, *weights(fit.task.model))
    # Root writes through any permission bits: the folder is made read-only, then this process
    # drops to an unprivileged user (everything it needs is imported already) and resumes.
    os.chmod({out!r}, 0o555)
    os.setgid(65534)
    os.setuid(65534)
    _run({out!r}, {data!r}, 6, config)
    """
)


def test_read_only_output_dir_names_the_path_and_keeps_the_checkpoint(tmp_path):
    # A folder others can reach (pytest's tmp_path is private to root), removed at the end.
    scratch = Path(tempfile.mkdtemp(prefix="cloze_read_only_"))
    out, data, saved = scratch / "run", scratch / "train.tfrecord", tmp_path / "after3.npz"
    try:
        scratch.chmod(0o755)
        helpers.write_synthetic_pretraining_file(data, 13, S, P, helpers.TINY["vocab_size"])
        script = _READ_ONLY_SCRIPT.format(
            root=str(ROOT), out=str(out), data=str(data), saved=str(saved)
        )
        result = _run_child(script, timeout=900)
        assert result.returncode != 0, result.stderr[-2000:]
        # The run's error (not the last line: at exit TensorFlow's autograph fails to delete the
        # temp files root made before the drop, and says so).
        denied = rf"PermissionError: \[Errno 13\] Permission denied: '{re.escape(str(out))}/\S+'"
        assert re.search(denied, result.stderr), result.stderr[-3000:]
        # Nothing in the folder changed: ckpt-3 is the latest and holds exactly step 3's weights.
        assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-3")
        assert _held_steps(out) == [3]
        fit = build(tf.distribute.OneDeviceStrategy("/cpu:0"), helpers.tiny_config())
        trainer.restore_model_weights(fit.task.model, str(out))
        with np.load(saved) as want:
            for i, got in enumerate(weights(fit.task.model)):
                np.testing.assert_array_equal(got, want[f"arr_{i}"])
        assert [r["step"] for r in trainer.read_jsonl(str(out / "train_log.jsonl"))] == [1, 2, 3]
    finally:
        if out.exists():
            out.chmod(0o755)
        shutil.rmtree(scratch)


# ---------------------------------------------------------------------------------------------
# Archive extraction (data_prep/fetch.py) never writes outside its target


def _tar(path, members):
    """members: (name, bytes) for a file, (name, "->target") for a symlink, (name, "=>target")
    for a hard link."""
    with tarfile.open(path, "w:gz") as tf_:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, str):
                info.type = tarfile.SYMTYPE if data.startswith("->") else tarfile.LNKTYPE
                info.linkname = data[2:]
                tf_.addfile(info)
            else:
                info.size = len(data)
                tf_.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_extraction_refuses_absolute_paths(tmp_path, kind):
    victim = tmp_path / "victim.txt"
    archive = tmp_path / f"evil.{kind}"
    if kind == "tar":
        _tar(archive, [("pkg/ok.txt", b"ok"), (str(victim), b"evil")])
    else:
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr("pkg/ok.txt", "ok")
            # zipfile strips a leading "/" on write; set the raw name as a crafted archive has it.
            info = zipfile.ZipInfo("pkg/x")
            info.filename = str(victim)
            zf.writestr(info, "evil")
    with pytest.raises(InputError, match=rf"{re.escape(str(archive))}: member .*refused"):
        extract_members(archive, tmp_path / "out", lambda name: True)
    assert not victim.exists()


def test_extraction_writes_no_links_and_never_through_one(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = _tar(
        tmp_path / "links.tar.gz",
        [
            ("pkg/up", "->" + str(outside)),  # a symlink to a folder outside the target
            ("pkg/hard", "=>" + str(outside / "f")),  # a hard link to a file outside
            ("pkg/up/planted.txt", b"evil"),  # a file meant to land through the symlink
            ("pkg/ok.txt", b"ok"),
        ],
    )
    target = tmp_path / "out"
    written = extract_members(archive, target, lambda name: True)
    # Links are not created; the file under "pkg/up/" becomes a plain file inside the target.
    assert sorted(p.relative_to(target.resolve()).as_posix() for p in written) == [
        "pkg/ok.txt",
        "pkg/up/planted.txt",
    ]
    assert not any(p.is_symlink() for p in target.rglob("*"))
    assert list(outside.iterdir()) == []
    # A link already in the target (from anywhere) is not followed out of it either.
    target2 = tmp_path / "out2"
    (target2 / "pkg").mkdir(parents=True)
    (target2 / "pkg" / "up").symlink_to(outside)
    with pytest.raises(InputError, match="outside .*refused"):
        extract_members(archive, target2, lambda name: name.endswith("planted.txt"))
    assert list(outside.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Audit: what Cloze deletes, and how it deserialises

LIBRARY = [*ROOT.glob("*.py"), *(p for d in ("data_prep", "modeling", "training", "bench")
                                  for p in (ROOT / d).glob("*.py"))]  # fmt: skip

# Every recursive delete, and why it can only remove what Cloze itself made. A new one fails this
# test until it is checked and listed here.
RMTREE_ALLOWED = {
    # ckpt-N_temp folders tf.train.CheckpointManager leaves after a killed save (by name only).
    "training/trainer.py": 1,
    # output_dir/best and its best.tmp / best.old siblings, written by BestCheckpoint itself.
    "training/finetune_tasks.py": 4,
    # AtomicOutputDir's own mkdtemp folder.
    "modeling/checkpoints.py": 2,
    # bench/reliability.py's own mkdtemp scratch folder (not a --work_dir the user names).
    "bench/reliability.py": 1,
}


def test_recursive_deletes_are_only_the_known_guarded_ones():
    found = {}
    for path in LIBRARY:
        count = len(re.findall(r"rmtree\(", path.read_text()))
        if count:
            found[path.relative_to(ROOT).as_posix()] = count
    assert found == RMTREE_ALLOWED


def test_deserialisation_is_safe_by_default():
    for path in LIBRARY:
        text = path.read_text()
        # PyTorch pickles only behind --trust_pickle, and then with the restricted unpickler.
        for line in re.findall(r".*torch\.load\(.*", text):
            assert "weights_only=True" in line, (path, line)
        # Keras files only in safe mode (no lambda / arbitrary code on load).
        assert "safe_mode=False" not in text, path
        assert not re.search(r"\bload_model\((?![^)]*safe_mode=True)", text), path
        assert not re.search(r"\b(yaml\.load|marshal\.loads?|importlib\.import_module)\(", text)


# ---------------------------------------------------------------------------------------------
# Damaged fine-tuning features (run_classifier, run_squad and run_ner read theirs through the
# same features._shuffled_training_batches): named without skipping, skipped and counted with
# --skip_corrupt_records; toggling that flag in one output_dir is refused naming it


def _flip_payload_bit(path, record: int) -> int:
    """Flips one bit in the payload of record `record` (0-based) of a TFRecord file, so that its
    data CRC fails. Returns that record's byte offset."""
    data = bytearray(Path(path).read_bytes())
    offset = 0
    for _ in range(record):
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        offset += 16 + length  # length, its CRC, the data, its CRC
    data[offset + 12 + 5] ^= 0x10  # past the 12-byte header: a payload byte
    Path(path).write_bytes(bytes(data))
    return offset


def _squad_file(path, n, flip):
    """n SQuAD training windows (unique_ids 0..n-1), one bit flipped in record `flip`'s
    payload. Returns that record's byte offset."""
    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(n):
            ids = rng.integers(5, 50, S).tolist()
            w.write(features.serialize_squad_example(i, ids, [1] * S, [0] * S, 2, 4, 0))
    return _flip_payload_bit(path, flip)


def _squad_run(out, path, skip, steps, **settings):
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    keras.utils.set_random_seed(7)
    with one.scope():
        model = span_qa.BertSpanQA(helpers.tiny_config())
        model.build()
        opt = optimization.create_optimizer(1e-3, 12, 1)
        opt.build(model.trainable_variables)
    fit = trainer.Trainer(one, squad_eval.span_qa_task(model), opt)
    trainer.run_training(
        fit,
        lambda: features.squad_dataset([str(path)], 3, S, seed=1, skip_corrupt_records=skip),
        trainer.TrainSettings(
            str(out), steps, save_checkpoints_steps=3, iterations_per_loop=3, **settings
        ),
        global_batch_size=3,
    )


def test_damaged_fine_tuning_features_are_named_or_skipped_and_counted(tmp_path, caplog):
    path = tmp_path / "train.tf_record"
    offset = _squad_file(path, 13, flip=9)
    named = dict(input_files=(str(path),))
    # Without skipping: the run stops at its first read of record 9, naming file, record, byte.
    where = rf"{re.escape(str(path))}: 9 good records.*record 9 \(byte {offset}\): corrupted"
    with pytest.raises(InputError, match=where):
        _squad_run(tmp_path / "plain", path, False, 3, **named)
    assert not list((tmp_path / "plain").glob("ckpt-*"))
    # Skipping: the per-file count is logged and training reads the 9 sound records only (the
    # CRC error loses the rest of the file, as in pretraining), each once per epoch.
    on = dict(named, run_settings_json=json.dumps({"skip_corrupt_records": True}))
    with caplog.at_level(logging.INFO, logger="absl"):
        _squad_run(tmp_path / "skip", path, True, 3, **on)
        _squad_run(tmp_path / "skip", path, True, 6, **on)  # and resumes
    assert f"skipping 4 records of {path}" in caplog.text, caplog.text[-2000:]
    assert "4 of 13 records skipped" in caplog.text
    assert f"resumed from {tmp_path / 'skip'}/ckpt-3" in caplog.text
    assert tf.train.latest_checkpoint(str(tmp_path / "skip")).endswith("ckpt-6")
    batches = features.squad_dataset([str(path)], 1, S, seed=1, skip_corrupt_records=True)
    ids = [int(b["unique_ids"][0]) for b in batches.take(18)]
    assert sorted(ids[:9]) == sorted(ids[9:]) == list(range(9))
    # Toggling the flag in that output_dir: refused naming the change, before anything restores;
    # a caller that records no settings gets what did not fit from the restore itself.
    off = dict(named, run_settings_json=json.dumps({"skip_corrupt_records": False}))
    with pytest.raises(ValueError, match=r"--skip_corrupt_records was True and is now False.*"
                       r"Rerun with --skip_corrupt_records=True"):  # fmt: skip
        _squad_run(tmp_path / "skip", path, False, 9, **off)
    with pytest.raises(ValueError, match="saved input position belongs to another input pipe"):
        _squad_run(tmp_path / "skip", path, False, 9, **named)


_WORDS = "john mary paris london went to saw in the who where did .".split()


def _classifier_input(d):
    rows = [f"{' '.join(_WORDS[i % 4 : i % 4 + 5])}\t{i % 2}" for i in range(13)]
    (d / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    return ["--task_name=sst-2", f"--data_dir={d}"]


def _squad_input(d):
    paragraphs = [
        {
            "context": f"{name} went to {place} .",
            "qas": [
                {
                    "id": f"q{i}",
                    "question": f"who went to {place} ?",
                    "answers": [{"text": name, "answer_start": 0}],
                }
            ],  # fmt: skip
        }
        for i, (name, place) in enumerate(
            (("john", "mary")[i % 2], ("paris", "london")[i % 3 % 2]) for i in range(13)
        )
    ]
    (d / "train.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": paragraphs}]}))
    return [f"--train_file={d / 'train.json'}", "--max_query_length=6", "--doc_stride=4"]


def _ner_input(d):
    sentences = [
        f"{('john', 'mary')[i % 2]} B-PER\nwent O\nto O\n{('paris', 'london')[i % 3 % 2]} B-LOC"
        for i in range(13)
    ]
    (d / "train.txt").write_text("\n\n".join(sentences) + "\n")
    return [f"--data_dir={d}", "--window_overlap=3"]


# entrypoint -> (module and name of the function that writes its train.tf_record, its input)
FINE_TUNING = {
    "run_classifier": ("data_prep.glue", "write_tfrecord", _classifier_input),
    "run_squad": ("data_prep.squad", "write_train_tfrecord", _squad_input),
    "run_ner": ("data_prep.conll", "write_tfrecord", _ner_input),
}


@pytest.mark.parametrize("name", sorted(FINE_TUNING))
def test_fine_tuning_scripts_pass_skip_corrupt_records_through(name, tmp_path, monkeypatch):
    # Each script rewrites train.tf_record from its text input on every run, so the damage is
    # done between that write and training: the writer is wrapped to flip a bit of record 9.
    module, writer, write_input = FINE_TUNING[name]
    module = importlib.import_module(module)
    write = getattr(module, writer)
    damaged = {}

    def write_then_damage(path, *args, **kwargs):
        damaged["records"] = write(path, *args, **kwargs)
        damaged["path"], damaged["offset"] = str(path), _flip_payload_bit(path, 9)
        return damaged["records"]

    monkeypatch.setattr(module, writer, write_then_damage)
    (tmp_path / "vocab.txt").write_text("\n".join([*RESERVED_TOKENS, *_WORDS]) + "\n")
    (tmp_path / "bert_config.json").write_text(helpers.tiny_config().to_json_string())
    common = [
        *write_input(tmp_path),
        f"--vocab_file={tmp_path / 'vocab.txt'}",
        f"--bert_config_file={tmp_path / 'bert_config.json'}",
        "--max_seq_length=16",
        "--train_batch_size=3",
        "--num_train_epochs=1",  # 13 examples: 4 steps
        "--learning_rate=1e-3",
        "--save_checkpoints_steps=2",
        "--iterations_per_loop=2",
        "--do_train",
    ]
    # Without the flag the run stops naming the file, the record and its byte offset.
    plain = helpers.run_main(f"{name}.py", [*common, f"--output_dir={tmp_path / 'plain'}"])
    assert plain.returncode == 1 and "InputError" in plain.stderr, plain.stderr[-2000:]
    assert damaged["records"] == 13
    where = rf"{re.escape(damaged['path'])}: 9 good records.*record 9 \(byte {damaged['offset']}\)"
    assert re.search(where, plain.stderr), plain.stderr[-2000:]
    # With it the run trains past the damage to its last step, counting what it skipped.
    out = tmp_path / "skip"
    skip = helpers.run_main(
        f"{name}.py", [*common, f"--output_dir={out}", "--skip_corrupt_records"]
    )
    assert skip.returncode == 0, skip.stderr[-2000:]
    assert f"skipping 4 records of {damaged['path']}" in skip.stderr, skip.stderr[-2000:]
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-4")
    # The flag is recorded with the checkpoints; the fine-tuning scripts also record
    # --group_by_length (another input pipeline, off here) and --precision (fp16's checkpoints
    # hold the loss scale), run_squad --train_dynamic_padding too (another loss and pipeline,
    # off here).
    expected = {"skip_corrupt_records": True, "group_by_length": False, "precision": "fp32"}
    if name == "run_squad":
        expected["train_dynamic_padding"] = False
    assert json.loads((out / trainer.RUN_SETTINGS_FILE).read_text()) == expected


def test_toggling_span_boundary_objective_is_refused_naming_the_flag(tmp_path):
    # run_pretraining records the flag with its checkpoints; a resume with the span boundary
    # head toggled is refused before anything restores, naming the flag and what to do.
    data, config = tmp_path / "train.tfrecord", tmp_path / "bert_config.json"
    rows = helpers.write_synthetic_pretraining_file(
        tmp_path / "plain.tfrecord", 13, S, P, helpers.TINY["vocab_size"]
    )
    with tf.io.TFRecordWriter(str(data)) as w:  # the same records with span boundaries
        for ids, seg, pos, labels, label in rows:
            left, right = [q - 1 for q in pos], [min(q + 1, len(ids) - 1) for q in pos]
            w.write(features.serialize_pretraining_example(ids, seg, pos, labels, label, S, P,
                                                           left, right))  # fmt: skip
    config.write_text(helpers.tiny_config().to_json_string())
    out = tmp_path / "out"
    common = [
        f"--bert_config_file={config}", f"--input_file={data}", f"--output_dir={out}",
        f"--max_seq_length={S}", f"--max_predictions_per_seq={P}", "--train_batch_size=3",
        "--num_train_steps=2", "--num_warmup_steps=1", "--save_checkpoints_steps=2",
        "--iterations_per_loop=2", "--learning_rate=1e-3", "--do_train",
    ]  # fmt: skip
    first = helpers.run_main("run_pretraining.py", [*common, "--span_boundary_objective"])
    assert first.returncode == 0, first.stderr[-2000:]
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-2")
    recorded = json.loads((out / trainer.RUN_SETTINGS_FILE).read_text())
    assert recorded == {
        "skip_corrupt_records": False,
        "span_boundary_objective": True,
        "precision": "fp32",
        "xlnet_span_prediction": False,
        "mem_len": 0,
        "bi_data": False,
    }
    toggled = helpers.run_main("run_pretraining.py", [*common, "--num_train_steps=4"])
    assert toggled.returncode == 1
    assert re.search(
        r"--span_boundary_objective was True and is now False.*Rerun with "
        r"--span_boundary_objective=True", toggled.stderr, re.S
    ), toggled.stderr[-2000:]  # fmt: skip
    assert _held_steps(out) == [2]


# ---------------------------------------------------------------------------------------------
# Two MultiWorkerMirroredStrategy workers on loopback: they train as one device would, a killed
# worker makes the other fail fast, a SIGTERM to one stops both at the same step, and a restart
# of both resumes from the last checkpoint

MW_STEPS, MW_SAVE = 40, 10

_WORKER_SCRIPT = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # reads TF_CONFIG; before any op
    sys.path.insert(0, {root!r})
    from absl import logging
    from tests import helpers
    from tests.test_reliability import mw_dataset
    from tests.test_trainer import build
    from training import trainer
    logging.set_verbosity(logging.INFO)  # "resumed from ..." goes to stderr
    index = strategy.cluster_resolver.task_id
    fit = build(strategy, helpers.tiny_config(), steps={steps})
    settings = trainer.TrainSettings(
        {out!r} + str(index), {steps}, save_checkpoints_steps={save}, iterations_per_loop=1
    )
    trainer.run_training(fit, lambda: mw_dataset({files!r}, index), settings, global_batch_size=6)
    """
)


def mw_dataset(files, index):
    """Worker `index`'s batches: 3 examples of its own file (the files are split over workers)."""
    from data_prep import features

    return features.pretraining_dataset(
        files, 3, S, P, True, seed=3, num_shards=2, shard_index=index
    )


def _start_workers(script):
    cluster = {"worker": [f"127.0.0.1:{port}" for port in helpers.free_ports(2)]}
    procs = []
    for index in range(2):
        tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = dict(os.environ, TF_CONFIG=json.dumps(tf_config), TF_CPP_MIN_LOG_LEVEL="2")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", script],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def _held_steps(folder) -> list[int]:
    return sorted(int(p.name[5:-6]) for p in Path(folder).glob("ckpt-*.index"))


def _latest_step(folder) -> int:
    latest = tf.train.latest_checkpoint(str(folder))
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def _wait_for(procs, done, seconds=600):
    """Polls until done() holds. When a worker ends first or time runs out, kills the workers
    and fails showing what each wrote to stderr."""
    deadline = time.time() + seconds
    while not done():
        ended = [i for i, p in enumerate(procs) if p.poll() is not None]
        if ended or time.time() > deadline:
            why = f"worker(s) {ended} ended" if ended else f"nothing happened in {seconds} s"
            for p in procs:
                if p.poll() is None:
                    p.kill()
            errs = _finish(procs, timeout=60)
            raise AssertionError(f"{why}: {[e[-3000:] for e in errs]}")
        time.sleep(0.02)


def _finish(procs, timeout=300) -> list[str]:
    """Waits for the workers; returns their stderr. Kills any still running on the way out."""
    try:
        return [p.communicate(timeout=timeout)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


@pytest.mark.slow
def test_two_workers_train_as_one_stop_together_on_sigterm_and_survive_a_kill(tmp_path):
    files = []
    for i in range(2):
        files.append(str(tmp_path / f"shard{i}.tfrecord"))
        helpers.write_synthetic_pretraining_file(files[i], 17, S, P, helpers.TINY["vocab_size"], i)
    script = _WORKER_SCRIPT.format(
        root=str(ROOT), steps=MW_STEPS, save=MW_SAVE, out=str(tmp_path / "w"), files=files
    )
    folders = [tmp_path / f"w{i}" for i in range(2)]

    def logged(i):
        return len(trainer.read_jsonl(str(folders[i] / "train_log.jsonl")))

    # 1. Preemption: a SIGTERM to worker 1 alone, early in the run, makes both workers save the
    # checkpoint at the same step (between two regular saves) and exit 42.
    procs = _start_workers(script)
    _wait_for(procs, lambda: min(logged(0), logged(1)) >= 2)
    procs[1].send_signal(signal.SIGTERM)
    errs = _finish(procs, timeout=300)
    assert [p.returncode for p in procs] == [42, 42], [e[-3000:] for e in errs]
    stopped = _latest_step(folders[0])
    assert 2 <= stopped < MW_SAVE and _latest_step(folders[1]) == stopped, errs
    for i, err in enumerate(errs):
        assert logged(i) == stopped
        said = f"SIGTERM on worker 1, every worker stops: saved {folders[i]}/ckpt-{stopped} at step"
        assert f"{said} {stopped}; exiting with code 42" in err, err[-3000:]

    # 2. The restart of both continues there. Worker 1 is killed as soon as both hold their
    # second regular checkpoint: worker 0 fails fast instead of hanging.
    procs = _start_workers(script)
    _wait_for(procs, lambda: min(_latest_step(f) for f in folders) >= 2 * MW_SAVE)
    procs[1].kill()
    killed_at = time.time()
    errs = _finish(procs, timeout=60)
    waited = time.time() - killed_at
    assert procs[0].returncode not in (0, 42) and waited < 60, errs[0][-3000:]
    for i, err in enumerate(errs):
        want = f"resumed from {folders[i]}/ckpt-{stopped} at step {stopped}"
        assert want in err, err[-3000:]
    steps = [_latest_step(f) for f in folders]
    assert steps[0] == steps[1] < MW_STEPS, steps

    # 3. A kill between the two workers' saves of a step leaves one worker with the newer
    # checkpoint: worker 1 loses its newest here. A restart of both must not resume them at
    # different steps: both resume from the newest checkpoint they share, and finish.
    for path in folders[1].glob(f"ckpt-{steps[1]}.*"):
        path.unlink()
    common = steps[0] - MW_SAVE
    assert _held_steps(folders[0])[-2:] == [common, steps[0]]
    assert _held_steps(folders[1])[-1] == common
    procs = _start_workers(script)
    errs = _finish(procs, timeout=900)  # start-up alone took minutes at load average 20
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for e in errs]
    for i, err in enumerate(errs):
        assert f"resumed from {folders[i]}/ckpt-{common} at step {common}" in err, err[-3000:]
        assert f"every worker resumes from ckpt-{common}" in err, err[-3000:]

    # The workers, each on its own file, computed what one device computes on both files' batches
    # side by side, across the SIGTERM stop and the kill; a worker alone (its own file only)
    # would not.
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    fit = build(one, helpers.tiny_config(), steps=MW_STEPS)
    both = tf.data.Dataset.zip(mw_dataset(files, 0), mw_dataset(files, 1))
    both = both.map(lambda a, b: {k: tf.concat([a[k], b[k]], 0) for k in a})
    rows = fit.train_steps(iter(both), MW_STEPS)
    for i in range(2):
        log = trainer.read_jsonl(str(folders[i] / "train_log.jsonl"))
        assert [r["step"] for r in log] == list(range(1, MW_STEPS + 1))
        np.testing.assert_allclose(
            [r["loss"] for r in log], [fit.loss_from_sums(r) for r in rows], rtol=1e-5
        )
    alone = build(one, helpers.tiny_config(), steps=MW_STEPS)
    alone.train_steps(iter(mw_dataset(files, 0)), MW_STEPS)
    holder = build(one, helpers.tiny_config(), steps=MW_STEPS)
    trainer.restore_model_weights(holder.task.model, str(folders[0]))
    got = weights(holder.task.model)
    for a, b in zip(got, weights(fit.task.model)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert any(not np.allclose(a, b, atol=1e-4) for a, b in zip(got, weights(alone.task.model)))


# ---------------------------------------------------------------------------------------------
# bench/reliability.py --quick: one kill of each kind, the corruption cases, a short fuzz run


@pytest.mark.slow
def test_reliability_bench_quick_counts(tmp_path):
    result = subprocess.run(
        [sys.executable, "bench/reliability.py", "--quick", f"--work_dir={tmp_path / 'work'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout[result.stdout.index("{") :])
    kill = report["kill_resume"]
    assert kill["kills"] == 1 and kill["restarts"] == 2
    assert kill["loss_log_bitwise_equal"] and kill["checkpoint_tensors_compared"] > 100
    assert kill["checkpoint_tensors_differing"] == 0
    save = report["save_kill"]
    assert save["kills"] == save["latest_restored_intact"] == save["temp_folders_cleaned"] == 1
    for name, case in report["corruption"].items():
        assert case["detected_by_validation"] and case["message_names_file"], name
        assert case["records_lost_silently_without_skipping"] == 0, name
        assert case["skip_count_matches"], name
    assert report["corruption"]["bit_flipped"]["records_skipped_with_skipping"] == 13
    assert report["fuzz"]["fuzz_tests_failed"] == 0 and report["fuzz"]["cases_tried"] >= 100
    assert report["fuzz"]["workers"] == "0"  # the short run in one process


def test_workers_resume_from_the_newest_checkpoint_they_all_hold_or_fail_naming_steps():
    # The decision the two-worker test above exercises through the collective, in every case.
    assert trainer.common_checkpoint_step({0: [], 1: []}) is None
    assert trainer.common_checkpoint_step({0: [10, 20, 30], 1: [10, 20]}) == 20
    assert trainer.common_checkpoint_step({0: [10, 20], 1: [10, 20], 2: [20]}) == 20
    with pytest.raises(ValueError, match=r"worker 0: ckpt-30, worker 1: ckpt-10\b"):
        trainer.common_checkpoint_step({0: [20, 30], 1: [10]})
    with pytest.raises(ValueError, match=r"worker 0: ckpt-10, worker 1: no checkpoint"):
        trainer.common_checkpoint_step({0: [10], 1: []})


def test_held_checkpoints_are_those_whose_files_exist(tmp_path):
    ckpt = tf.train.Checkpoint(v=tf.Variable(1.0))
    manager = tf.train.CheckpointManager(ckpt, str(tmp_path), 5, checkpoint_name="ckpt")
    for step in (3, 6, 9):
        manager.save(checkpoint_number=step)
    for path in tmp_path.glob("ckpt-9.*"):  # the newest lost, its pointer left naming it
        path.unlink()
    manager = tf.train.CheckpointManager(ckpt, str(tmp_path), 5, checkpoint_name="ckpt")
    assert manager.latest_checkpoint.endswith("ckpt-9")
    assert trainer.held_checkpoint_steps(manager) == [3, 6]
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    assert trainer.agreed_checkpoint(one, manager) == str(tmp_path / "ckpt-6")
    # A pointer file that lists only its latest (written without timestamps) still resumes.
    tf.compat.v1.train.update_checkpoint_state(str(tmp_path), "ckpt-3")
    manager = tf.train.CheckpointManager(ckpt, str(tmp_path), 5, checkpoint_name="ckpt")
    assert manager.checkpoints == [] and trainer.held_checkpoint_steps(manager) == [3]
