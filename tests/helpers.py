"""Small builders shared by tests: tiny odd-sized configs and synthetic pretraining TFRecords."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os

import numpy as np

from bench.generation import scramble_weights  # noqa: F401 (the tests' helper too)
from data_prep import features
from modeling import bert

# Odd sizes so a swapped axis cannot pass (shared/STYLE.md).
TINY = dict(
    vocab_size=53,
    hidden_size=12,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=17,
    hidden_act="gelu",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    max_position_embeddings=16,
    type_vocab_size=2,
    initializer_range=0.02,
)


def count_xla_weight_gradient_calls(monkeypatch) -> list:
    """Wraps layers.matmul_xla_weight_gradient (--xla_weight_gradients' product) for the test:
    the returned list gets the rows' shape of every call, each call traced by a Dense."""
    from modeling import layers

    calls = []
    product = layers.matmul_xla_weight_gradient

    def counted(flat, kernel):
        calls.append(flat.shape)
        return product(flat, kernel)

    monkeypatch.setattr(layers, "matmul_xla_weight_gradient", counted)
    return calls


def tiny_config(**changes) -> bert.BertConfig:
    return bert.BertConfig(**{**TINY, **changes})


def write_synthetic_pretraining_file(
    path, num_examples, seq_length, max_predictions, vocab_size, seed=0
):
    """Writes random but well-formed pretraining examples; returns the raw arrays written."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    rows = []
    with tf.io.TFRecordWriter(str(path)) as w:
        for _ in range(num_examples):
            n = int(rng.integers(max_predictions + 3, seq_length + 1))
            ids = rng.integers(5, vocab_size, size=n).tolist()
            ids[0] = 2
            seg = [0] * (n // 2) + [1] * (n - n // 2)
            npred = int(rng.integers(1, max_predictions + 1))
            pos = sorted(rng.choice(np.arange(1, n), size=npred, replace=False).tolist())
            labels = [ids[i] for i in pos]
            for i in pos:
                ids[i] = 4
            label = int(rng.integers(0, 2))
            w.write(
                features.serialize_pretraining_example(
                    ids, seg, pos, labels, label, seq_length, max_predictions
                )
            )
            rows.append((ids, seg, pos, labels, label))
    return rows


@functools.cache
def mirrored_strategy():
    """One MirroredStrategy over conftest's two logical CPUs, shared by every test.

    Two strategies in one process number their collective ops from the same start, so a second
    one that runs collectives after the first fails ("Collective instance 100 expected type ...");
    a real run has one strategy per process, a test session has to share it.
    """
    import tensorflow as tf

    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    assert len(cpus) == 2, "conftest must configure two logical CPUs"
    return tf.distribute.MirroredStrategy(cpus)


def run_classifier_on_two_sentences(tmp_path, config_file, *flags):
    """run_classifier.py (in this process, run_main) on a learnable SST-2 folder ("The cat sat."
    1 and "The dog barked." 0, six times each in train.tsv, once each in dev.tsv; test.tsv
    indices 4 (dog) and 8 (cat)) with the BPE folder tmp_path/bpe: train, eval and predict at
    batch 4 and learning rate 1e-2, plus `flags`. Returns (run_main's Completed, the output
    folder)."""
    args, out = two_sentences_args(tmp_path, config_file, *flags)
    return run_main("run_classifier.py", args), out


def converted_folder_learns_two_sentences(tmp_path, folder, *flags) -> None:
    """A convert_checkpoint.py output folder as run_classifier's --vocab_file (its tokenizer
    files), config and --init_checkpoint at once (run_classifier_on_two_sentences): the encoder
    is initialised from the folder's ckpt-1 and the two sentences are learnt by heart."""
    (tmp_path / "bpe").symlink_to(folder)  # run_classifier_on_two_sentences' --vocab_file
    r, out = run_classifier_on_two_sentences(
        tmp_path, folder / "bert_config.json", f"--init_checkpoint={folder}",
        "--max_seq_length=24", "--num_train_epochs=10", *flags,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"initialised the encoder from {folder / 'ckpt-1'}" in r.stderr
    results = dict(
        line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines()
    )
    assert float(results["accuracy"]) == 1.0


def two_sentences_args(tmp_path, config_file, *flags):
    """run_classifier_on_two_sentences' data written and its command-line arguments: returns
    (the arguments, the output folder)."""
    data = tmp_path / "sst"
    data.mkdir(parents=True, exist_ok=True)
    rows = ["The cat sat.\t1", "The dog barked.\t0"] * 6
    (data / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (data / "dev.tsv").write_text("sentence\tlabel\nThe cat sat.\t1\nThe dog barked.\t0\n")
    (data / "test.tsv").write_text("index\tsentence\n4\tThe dog barked.\n8\tThe cat sat.\n")
    out = tmp_path / "out"
    args = [
        "--task_name=sst-2", f"--data_dir={data}",
        f"--vocab_file={tmp_path / 'bpe'}", f"--bert_config_file={config_file}",
        f"--output_dir={out}", "--train_batch_size=4", "--learning_rate=1e-2",
        "--do_train", "--do_eval", "--do_predict", *flags,
    ]  # fmt: skip
    return args, out


def run_classifier_on_swag_by_heart(tmp_path, config_file, *flags):
    """run_classifier.py (run_main) on a learnable folder in SWAG's layout: two contexts ("The
    cat sat." answer 0, "The dog ran." answer 1, both after "It" among the same four endings),
    six times each in train.csv, once each in val.csv, and test.csv rows 0 (dog) and 1 (cat),
    with the BPE folder tmp_path/bpe: train 60 steps, eval and predict at batch 4 and learning
    rate 1e-2, sequences of 11, plus `flags`. Returns (run_main's Completed, the output folder)."""
    data = tmp_path / "swag"
    data.mkdir(parents=True, exist_ok=True)
    header = "sent1,sent2,ending0,ending1,ending2,ending3"
    cat, dog = (f"{s},It,purred.,barked.,swam.,flew." for s in ("The cat sat.", "The dog ran."))
    (data / "train.csv").write_text(f"{header},label\n" + f"{cat},0\n{dog},1\n" * 6)
    (data / "val.csv").write_text(f"{header},label\n{cat},0\n{dog},1\n")
    (data / "test.csv").write_text(f"{header}\n{dog}\n{cat}\n")
    out = tmp_path / "out"
    args = [
        "--task_name=swag", f"--data_dir={data}", f"--vocab_file={tmp_path / 'bpe'}",
        f"--bert_config_file={config_file}", f"--output_dir={out}", "--train_batch_size=4",
        "--learning_rate=1e-2", "--max_seq_length=11", "--num_train_epochs=20",
        "--iterations_per_loop=20", "--do_train", "--do_eval", "--do_predict", *flags,
    ]  # fmt: skip
    return run_main("run_classifier.py", args), out


def train_to_copy(model, decoder_start_id: int, steps: int, warmup: int):
    """Teacher-forced training of an encoder-decoder (T5, BART) to copy 32 random 4-id sequences
    followed by eos (id 1), 16 a step; returns the sources and the last step's loss."""
    import tensorflow as tf

    from training import optimization

    rng = np.random.default_rng(0)
    src = rng.integers(3, 23, (32, 4)).astype("int32")
    targets = np.concatenate([src, np.ones((32, 1), np.int32)], axis=1)
    opt = optimization.create_optimizer(5e-3, steps, warmup)

    @tf.function
    def step(ids, tgt):
        start = tf.fill(tf.shape(tgt[:, :1]), decoder_start_id)
        with tf.GradientTape() as tape:
            out = model(
                {
                    "input_ids": ids,
                    "input_mask": tf.ones_like(ids),
                    "decoder_input_ids": tf.concat([start, tgt[:, :-1]], 1),
                },
                training=True,
            )
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(
                    tgt, out["lm_logits"], from_logits=True
                )
            )
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    for i in range(steps):
        j = (i * 16) % 32
        loss = float(step(src[j : j + 16], targets[j : j + 16]))
    return src, loss


def tiny_encoder_decoder(model_cls, config_cls, values: dict):
    """A built T5Model / BartModel of `values` with the same seeded initialisation each call."""
    import keras

    keras.utils.set_random_seed(5)
    model = model_cls(config_cls(**values))
    model.build()
    return model


def at_precision(make, reference, precision: str):
    """`make()` built under `precision`'s dtype policy (a training/optimization.PRECISIONS key)
    holding `reference`'s weights: a float32 checkpoint run at --precision."""
    from training import optimization

    with optimization.dtype_policy(precision):
        model = make()
    for mine, theirs in zip(model.weights, reference.weights, strict=True):
        mine.assign(theirs)
    return model


def check_precision_run(out, precision: str) -> list:
    """A training run finished in `out` at --precision=`precision`: Keras' dynamic loss scale
    (2^15, its start) logged at every step under fp16 and none otherwise, and the precision
    recorded in run_settings.json, so that a resume at another one is refused. Returns the
    train log's records."""
    import json

    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    scales = [r.get("loss_scale") for r in log]
    assert log and scales == [2.0**15 if precision == "fp16" else None] * len(log), scales
    assert json.loads((out / "run_settings.json").read_text())["precision"] == precision
    return log


def check_precision_resume_refused(result) -> None:
    """`result`: an fp16 run's folder resumed at fp32, which must fail naming the flag."""
    assert result.returncode != 0
    assert "--precision was 'fp16' and is now 'fp32'" in result.stderr, result.stderr[-3000:]


# How far a mixed policy's float32 logits may be from float32's, relative to the largest:
# bfloat16 keeps 8 bits of mantissa, float16 11.
MIXED_LOGITS_TOLERANCE = {"bf16": 3e-2, "fp16": 5e-3}


def check_at_precision(make, forward, precision: str, output_dtypes: dict):
    """A model `make()` built at `precision` with the weights of one built at float32 (the same
    seed), both run by `forward(model) -> ({key: output}, loss)` under a gradient tape: each
    output in output_dtypes' dtype ("compute": the policy's), finite and within
    MIXED_LOGITS_TOLERANCE of float32's but not equal to them (the policy took); the loss'
    gradients float32 and finite for the trainable weights float32 gives gradients (a weight off
    the path has none in both)."""
    import keras
    import tensorflow as tf

    def run(model):
        with tf.GradientTape() as tape:
            outputs, loss = forward(model)
        grads = tape.gradient(loss, model.trainable_variables)
        return outputs, [None if g is None else tf.convert_to_tensor(g) for g in grads]

    keras.utils.set_random_seed(0)
    reference = make()
    model = at_precision(make, reference, precision)
    assert model.compute_dtype == {"bf16": "bfloat16", "fp16": "float16"}[precision]
    want, want_grads = run(reference)
    got, grads = run(model)
    for key, dtype in output_dtypes.items():
        assert got[key].dtype == (model.compute_dtype if dtype == "compute" else dtype), key
        mine, theirs = np.asarray(got[key], "float32"), np.asarray(want[key])
        assert np.isfinite(mine).all(), key
        difference = np.abs(mine - theirs).max() / np.abs(theirs).max()
        assert 0 < difference < MIXED_LOGITS_TOLERANCE[precision], (key, difference)
    assert [g is None for g in grads] == [g is None for g in want_grads]
    grads = [g for g in grads if g is not None]
    assert grads and all(g.dtype == "float32" for g in grads)
    assert all(bool(tf.reduce_all(tf.math.is_finite(g))) for g in grads)


def check_classifier_at_precision(make, inputs: dict, labels, precision: str):
    """check_at_precision for a classifier on `inputs`: float32 logits, the cross-entropy of
    `labels` as the loss."""
    import keras

    def forward(model):
        logits = model(inputs, training=True)
        loss = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        return {"logits": logits}, loss

    check_at_precision(make, forward, precision, {"logits": "float32"})


def check_loss_paths_agree(model, fast, plain, sums_rtol: float = 1e-6) -> None:
    """A model's training loss path that skips the (B, T, V) logits (`fast`: its lm_terms)
    against the logits path it replaces (`plain`): each a no-argument callable returning
    (a dict of float32 loss sums, the scalar loss) run under a GradientTape. The same sums and
    the same gradient to every trainable variable: rtol 1e-5 and atol 1e-6, or 1e-5 of the
    variable's largest gradient entry where that is larger (a tied table's entries sum terms
    of both signs from its lookups and its projection, added in another order). Attention's
    key biases get zero gradients up to rounding (softmax ignores a shift shared by a query's
    scores); every other variable a non-zero one (a tiny model's first query kernels: below
    1e-6, hence the atol floor)."""
    import tensorflow as tf

    def run(fn):
        with tf.GradientTape() as tape:
            sums, loss = fn()
        grads = tape.gradient(loss, model.trainable_variables)
        return {k: np.asarray(v) for k, v in sums.items()}, [tf.convert_to_tensor(g) for g in grads]

    (sums, grads), (want_sums, want_grads) = run(fast), run(plain)
    assert sums.keys() == want_sums.keys()
    for name in want_sums:
        np.testing.assert_allclose(sums[name], want_sums[name], rtol=sums_rtol, atol=1e-6)
    for var, got, want in zip(model.trainable_variables, grads, want_grads):
        largest = np.abs(want.numpy()).max()
        assert largest > 0 or ("key" in var.path and var.path.endswith("bias")), var.path
        np.testing.assert_allclose(
            got.numpy(), want.numpy(), rtol=1e-5, atol=max(1e-6, 1e-5 * largest), err_msg=var.path
        )


def encoder_decoder_batch(b=3, s=7, t=5, seed=0, padded=((0, 5),), vocab_size=23):
    """Random int32 encoder ids (B, S) with `padded` rows cut at (row, length), and decoder
    inputs (B, T); ids from 2 up, so that 0 / 1 stay free for pad / eos."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, vocab_size, (b, s)).astype("int32")
    mask = np.ones_like(ids)
    for row, length in padded:
        mask[row, length:] = 0
    return {
        "input_ids": ids,
        "input_mask": mask,
        "decoder_input_ids": rng.integers(2, vocab_size, (b, t)).astype("int32"),
    }


# ---------------------------------------------------------------------------------------------
# Entrypoints in this process: what `python <script> <args>` does, without the 6-8 s that a new
# interpreter spends importing TensorFlow. Each entrypoint keeps one real subprocess smoke run in
# its test file (the CLI itself: app.run, exit codes, signals); the other runs go through here.


@dataclasses.dataclass
class Completed:
    """The parts of subprocess.CompletedProcess the tests read."""

    returncode: int
    stdout: str
    stderr: str


def convert_checkpoint(*args: str) -> Completed:
    """convert_checkpoint.py with `args` (run_main), asserting that it succeeded."""
    r = run_main("convert_checkpoint.py", args)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def run_main(script: str, args=()) -> Completed:
    """Runs entrypoint `script` (a path under the repository, e.g. "run_pretraining.py" or
    "bench/run_all.py") in this process with command-line `args`, as `app.run(main)` would:
    flags parsed from args, main(argv) called, a UsageError, flag error or any exception is exit
    code 1 with its message (and traceback) in stderr, SystemExit its code. stderr also holds what
    absl and Python logging wrote at INFO; stdout what was printed.

    The entrypoint's module is imported afresh for the call and its flags are removed from the
    global absl FLAGS afterwards, so every call starts from the flags' defaults and two
    entrypoints that define the same flag names (--bert_config_file ...) can run one after the
    other in one process."""
    import contextlib
    import io
    import logging
    import os
    import traceback

    import keras
    from absl import app, flags
    from absl import logging as absl_logging

    from tests.conftest import ROOT

    FLAGS = flags.FLAGS
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(
        logging.Formatter("%(relativeCreated)d %(levelname)s %(name)s: %(message)s")
    )
    root, verbosity, level = logging.getLogger(), absl_logging.get_verbosity(), None
    # set_verbosity(verbosity) alone would leave the absl logger at the flag's default (WARNING)
    # where it was NOTSET before the first run: later caplog-based tests would then see nothing.
    absl_logger = logging.getLogger("absl")
    absl_level = absl_logger.level
    cwd, code = os.getcwd(), 0
    try:
        with entrypoint_module(script) as module:  # its flags and module go afterwards
            level = root.level
            root.addHandler(handler)
            root.setLevel(logging.INFO)
            absl_logging.set_verbosity(absl_logging.INFO)
            os.chdir(ROOT)
            argv = [str(ROOT / script), *map(str, args)]
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    module.main(FLAGS(argv))
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else 1
                    if e.code is not None and not isinstance(e.code, int):
                        err.write(f"{e.code}\n")
                except (app.UsageError, flags.Error) as e:
                    code = 1
                    err.write(f"FATAL: {e}\n")
                except Exception:
                    code = 1
                    err.write(traceback.format_exc())
    finally:
        os.chdir(cwd)
        root.removeHandler(handler)
        if level is not None:
            root.setLevel(level)
        absl_logging.set_verbosity(verbosity)
        absl_logger.setLevel(absl_level)
        # The run's models and layer names go; the next run starts clean. Without clear_session's
        # own gc.collect (0.3-0.5 s a call with the suite's heap): the collector's thresholds
        # (tests/conftest.py) free the run's cycles as the tests go on.
        keras.backend.clear_session(free_memory=False)
    return Completed(code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def entrypoint_module(script: str):
    """Imports entrypoint `script` (e.g. "bench/run_all.py") for its functions, and afterwards
    removes the absl flags it defined and the module itself, as run_main does: left in the
    process, its flags (--output_dir ...) would clash with the next entrypoint a test runs."""
    import importlib
    import sys

    from absl import flags

    name = script.removesuffix(".py").replace("/", ".")
    if name in sys.modules:
        raise RuntimeError(f"{name} was imported elsewhere in this process; its flags would clash")
    before = set(flags.FLAGS)
    try:
        yield importlib.import_module(name)
    finally:
        for flag in set(flags.FLAGS) - before:
            delattr(flags.FLAGS, flag)
        sys.modules.pop(name, None)
        package, _, attribute = name.rpartition(".")
        if package and hasattr(sys.modules.get(package), attribute):
            delattr(sys.modules[package], attribute)  # `from bench import run_all` imports anew


def run_script(script: str, args=(), command_line: bool = False) -> Completed:
    """Entrypoint `script` with command-line `args`: in this process (run_main), or with
    `command_line` as `python script args` in a new interpreter from the repository root (the
    one real command-line run each entrypoint keeps; it costs a TensorFlow import, 7-9 s of
    CPU on 2 cores)."""
    if not command_line:
        return run_main(script, args)
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    result = subprocess.run(
        [sys.executable, script, *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    return Completed(result.returncode, result.stdout, result.stderr)


def run_python(code: str):
    """`python -c code` in a new interpreter from the repository root, which must exit 0 (else
    the assertion shows its stderr's end): for what a fresh process imports or does. Returns
    the subprocess.CompletedProcess (text stdout / stderr)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def run_data_script_alone(script: str, args) -> tuple[str, list, str]:
    """A data_prep entrypoint with `args` in a fresh interpreter (run_python): returns its stdout,
    [whether TensorFlow was imported, parallel.start_method()] as its process ended (so a test
    sees that its tokenizing workers were forked), and its stderr."""
    import json

    code = f"""
import json, runpy, sys
sys.argv = {[script, *map(str, args)]!r}
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
from data_prep import parallel
print(json.dumps(["tensorflow" in sys.modules, parallel.start_method()]))
"""
    result = run_python(code)
    return result.stdout, json.loads(result.stdout.splitlines()[-1]), result.stderr


def write_tensorflow_records(examples, output_files) -> None:
    """Examples ({feature: int ids}) through protobuf's deterministic serialization and
    tf.io.TFRecordWriter, round-robin over output_files: the reference for data_prep's records,
    which are written without TensorFlow."""
    import tensorflow as tf

    writers = [tf.io.TFRecordWriter(str(f)) for f in output_files]
    for n, example in enumerate(examples):
        feature = {
            key: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(i) for i in ids]))
            for key, ids in example.items()
        }
        proto = tf.train.Example(features=tf.train.Features(feature=feature))
        writers[n % len(writers)].write(proto.SerializeToString(deterministic=True))
    for w in writers:
        w.close()


def check_group_by_length(
    run, args, output_dir, padding_flag="dynamic_padding", then="--do_eval"
) -> Completed:
    """A fine-tuning script's --group_by_length: refused before anything is written without cut
    training batches (--no<padding_flag>); with them it trains, then runs `then` (its evaluation
    flag; None: nothing more) in output_dir, logging the grouping. `run(argv, expect_ok)` runs the
    script; returns that run."""
    uncut = run([*args, "--do_train", "--group_by_length", f"--no{padding_flag}",
                 f"--output_dir={output_dir}"], False)  # fmt: skip
    assert uncut.returncode != 0 and not output_dir.exists()
    assert f"--group_by_length: needs --{padding_flag}, which is off here" in uncut.stderr
    grouping = ["--do_train", *([then] if then else []), "--group_by_length",
                f"--{padding_flag}", f"--output_dir={output_dir}"]  # fmt: skip
    done = run([*args, *grouping])
    assert "sorted by length 50 batches at a time" in done.stderr, done.stderr[-3000:]
    return done


def free_ports(n: int) -> list[int]:
    """`n` loopback ports free at the time of the call (for a test cluster's TF_CONFIG)."""
    import socket

    socks = [socket.socket() for _ in range(n)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    return ports


def run_workers(script: str, worker_args: list, timeout: int = 300) -> list[Completed]:
    """Runs entrypoint `script` as MultiWorkerMirroredStrategy workers on loopback, one
    subprocess per entry of `worker_args` (worker k's command-line arguments, which should hold
    --distribution_strategy=multi_worker_mirrored), with TF_CONFIG naming a cluster of them;
    waits for all (killing any left at `timeout` seconds) and returns each one's Completed."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(len(worker_args))]}
    procs = []
    for index, args in enumerate(worker_args):
        tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = dict(os.environ, TF_CONFIG=json.dumps(tf_config), TF_CPP_MIN_LOG_LEVEL="2")
        procs.append(
            subprocess.Popen(
                [sys.executable, script, *map(str, args)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    done = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            done.append(Completed(proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return done


def roberta_bpe_folder(folder):
    """Writes a RoBERTa-style Hugging Face vocab.json + merges.txt into `folder`, built from
    GPT-2's real files (data_prep.fetch): fairseq's special tokens first (<s> 0, <pad> 1, </s> 2,
    <unk> 3), the BPE tokens in a shuffled order (fairseq's dictionary renumbers them by
    frequency), <mask> last: 50,261 entries. Returns the folder."""
    import json
    import shutil
    from pathlib import Path

    from data_prep import bpe, fetch

    source = fetch.gpt2_bpe_dir()
    gpt2_vocab = json.loads((source / "encoder.json").read_text(encoding="utf-8"))
    tokens = [t for t in gpt2_vocab if t != bpe.GPT2_END_OF_TEXT]
    order = np.random.default_rng(7).permutation(len(tokens))
    vocab = ["<s>", "<pad>", "</s>", "<unk>", *(tokens[i] for i in order), "<mask>"]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    shutil.copy(source / "vocab.bpe", folder / "merges.txt")
    return folder


def logged_speeds(log: str) -> list[tuple[float, float, int | None]]:
    """(examples/s, FLOP/s, % of the peak or None) of every train progress line in `log` that
    gives its FLOP/s (trainer._fmt_throughput). Both rates are smoothed alike, so FLOP/s over
    examples/s is the step's count per example (of the call's batches, cut or not)."""
    import re

    units = {"P": 1e15, "T": 1e12, "G": 1e9, "M": 1e6, "k": 1e3, "": 1}
    pattern = (
        r"([\d,.]+) examples/s \|[^\n]*?\| ([\d.]+) ([PTGMk]?)FLOP/s"
        r"(?: \((\d+)% of the peak\))? \| ETA"
    )
    return [
        (float(examples.replace(",", "")), float(rate) * units[unit], int(share) if share else None)
        for examples, rate, unit, share in re.findall(pattern, log)
    ]


def check_logged_flops(log: str, lowest: float, highest: float, peak_tflops: float = 0.0):
    """Asserts that `log` has FLOP/s lines, each with a count per example in [lowest, highest]
    (the log rounds to 3 digits and examples/s to 0.1) and, with `peak_tflops`, its share of
    that peak (none without it)."""
    import pytest

    speeds = logged_speeds(log)
    assert speeds, log[-3000:]
    for examples, rate, share in speeds:
        assert lowest * (examples - 0.05) * 0.99 <= rate <= highest * (examples + 0.05) * 1.01
        if peak_tflops:
            # The log rounds the rate to 3 digits and the share to a whole percent.
            assert share == pytest.approx(100 * rate / (peak_tflops * 1e12), rel=0.01, abs=1)
        else:
            assert share is None


def check_training_curves(log: str, output_dir, panels: str) -> None:
    """Asserts that a script's `log` names output_dir's training_curves.png with these panels
    (comma-separated, as the log writes them), none of them empty, and that the file is there."""
    path = os.path.join(str(output_dir), "training_curves.png")
    assert f"training curves: {path} ({panels})" in log, log[-3000:]
    assert "training curves: no values logged" not in log
    assert os.path.getsize(path) > 1000


def graph_matmul_flops(fn, spec, loop_trips: int | None = None) -> int:
    """2 x multiply-adds of the matrix products the outputs of `fn`'s traced graph at the input
    `spec` depend on, read from the ops' static shapes (independent of modeling/flops.py's
    formulas): MatMul, BatchMatMul, two-operand Einsum (2 x the product of every index's size)
    and Conv2D (Keras' Conv1D runs as one). Only what the outputs need counts, as TensorFlow
    prunes the rest when a step runs: a pooler that no output reads, the step Keras' RNN traces
    outside its loop only for the output's shape. What the function's control outputs need
    counts too, as a tf.function runs its stateful ops whether or not an output reads them
    (Keras' RNN loops: an ELMo layer no output reads). A while loop's body counts `loop_trips`
    times (Keras' RNN: once a time step); a loop without `loop_trips` is an error."""
    import tensorflow as tf

    return _graph_flops(tf.function(fn).get_concrete_function(spec).graph, loop_trips)


def _graph_flops(graph, loop_trips) -> int:
    """graph_matmul_flops of a traced graph (or a loop body's), from its outputs back."""
    total = 0
    for op in _needed_ops(graph.outputs):
        if op.type in ("While", "StatelessWhile"):
            if loop_trips is None:
                raise AssertionError(f"{op.name}: a loop; give loop_trips")
            body = graph._get_function(op.get_attr("body").name).graph
            total += loop_trips * _graph_flops(body, loop_trips)
        elif op.type in PRODUCT_OPS or op.type.startswith("Conv"):
            shapes = [t.shape.as_list() for t in op.inputs]
            factors = _product_factors(op, shapes, op.outputs[0].shape.as_list())
            total += 2 * int(np.prod([int(np.prod(f)) for f in factors]))
    return total


def executed_matmul_flops(fn, batch) -> int:
    """graph_matmul_flops of `fn(batch)` with the operands' shapes read when the function runs,
    so a shape known only then counts (an encoder under remove_padding, whose rows are its
    batch's real tokens). The same op rules; no loops."""
    import tensorflow as tf

    @tf.function
    def run(x):
        outputs = tf.nest.flatten(fn(x), expand_composites=True)
        terms = [tf.constant(0, tf.int64)]
        for op in _needed_ops(outputs):
            if op.type in ("While", "StatelessWhile"):
                raise AssertionError(f"{op.name}: a loop; executed_matmul_flops counts none")
            if op.type not in PRODUCT_OPS and not op.type.startswith("Conv"):
                continue  # no matrix product: its shapes are not read
            shapes = [tf.shape(t, out_type=tf.int64) for t in op.inputs]
            factors = _product_factors(op, shapes, tf.shape(op.outputs[0], out_type=tf.int64))
            terms.append(2 * tf.reduce_prod(tf.concat([tf.reshape(f, [-1]) for f in factors], 0)))
        return tf.add_n(terms)

    return int(run(batch))


def _needed_ops(outputs) -> set:
    """The ops `outputs` (tensors) depend on, through data and control inputs."""
    needed, stack = set(), [t.op for t in outputs]
    while stack:
        op = stack.pop()
        if op not in needed:
            needed.add(op)
            stack += [t.op for t in op.inputs] + list(op.control_inputs)
    return needed


PRODUCT_OPS = ("MatMul", "BatchMatMulV2", "BatchMatMulV3", "BatchMatMul", "Einsum", "Conv2D")


def _product_factors(op, shapes, out_shape):
    """The sizes whose product, times 2, is the matrix-multiply FLOPs of `op`, one of
    PRODUCT_OPS (the multiply-adds of MatMul, BatchMatMul, two-operand Einsum, NHWC Conv2D),
    from its inputs' `shapes` and its output's (lists of ints, or 1-D int tensors). Raises
    AssertionError for a product it does not count (another Conv, an Einsum of other form)."""
    if op.type == "MatMul":
        a, b = shapes
        m, k = (a[1], a[0]) if op.get_attr("transpose_a") else (a[0], a[1])
        n = b[0] if op.get_attr("transpose_b") else b[1]
        return [m, k, n]
    if op.type in PRODUCT_OPS[1:4]:
        a, b = shapes
        m, k = (a[-1], a[-2]) if op.get_attr("adj_x") else (a[-2], a[-1])
        n = b[-2] if op.get_attr("adj_y") else b[-1]
        if isinstance(a, list):
            batch = list(np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])))
        else:
            import tensorflow as tf

            batch = tf.broadcast_dynamic_shape(a[:-2], b[:-2])
        return [batch, m, k, n]
    if op.type == "Einsum":
        operands = op.get_attr("equation").decode().split("->")[0].split(",")
        if len(operands) != 2 or "." in "".join(operands):
            raise AssertionError(f"Einsum {op.get_attr('equation')}: count it too")
        sizes = {}
        for letters, shape in zip(operands, shapes):
            sizes |= {letter: shape[i] for i, letter in enumerate(letters)}
        return list(sizes.values())
    if op.type == "Conv2D" and op.get_attr("data_format") == b"NHWC":
        kh, kw, c_in = shapes[1][0], shapes[1][1], shapes[1][2]  # every output is a dot product
        return [out_shape, kh, kw, c_in]
    raise AssertionError(f"{op.type}: count it too")
