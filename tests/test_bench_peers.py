"""The pretraining benchmark's optional peers, each in a worker process (bench/peer_worker.py,
bench/torch_peer.py, bench/model_garden_peer.py, pretrain_throughput.WorkerPeer).

CI installs neither PyTorch nor Model Garden (bench/requirements-torch.txt and
bench/requirements-model-garden.txt are the bench's own), so the protocol, the batch's
translation and the run's bookkeeping are tested against a stand-in worker that answers as the
real one does; the real peers are tested where the interpreter in CLOZE_PEER_PYTHON (or this
one) has their libraries.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from bench import flops, host, peer_worker, pretrain_throughput, torch_peer
from modeling import checkpoints
from tests import helpers

REPO = Path(__file__).resolve().parents[1]
TINY = "L1/H12/A3/I17"

# A stand-in for the worker: bench/peer_worker.py's own main() and protocol, with the peer's
# module (the part that needs torch or Model Garden) replaced by one whose Peer records what it
# was sent and the environment it ran in, prints to stdout as a chatty library would, and
# sleeps instead of training.
_FAKE_WORKER = """
import json, os, sys, time, types
sys.path.insert(0, {repo!r})
from bench import peer_worker

class FakePeer:
    def __init__(self, config, batch, precision, seed, threads, head="pretraining"):
        if os.environ.get("FAKE_PEER_MISSING"):
            raise ModuleNotFoundError("No module named 'torch'")
        print("a library's chatter on stdout")
        sent = dict(config=config, batch=batch, precision=precision, threads=threads,
                    argv=sys.argv[1:], legacy=os.environ.get("TF_USE_LEGACY_KERAS"), head=head)
        for path in ({log!r}, {log!r} + "." + sys.argv[-1]):  # the last build, and each side's
            with open(path, "w") as f:
                json.dump(sent, f)
        self.versions = {{"fake": "1"}}
        self.threads = threads
        self.losses = iter(json.loads(os.environ.get("FAKE_PEER_LOSSES", "[]")))
        self.overflow = iter(json.loads(os.environ.get("FAKE_PEER_OVERFLOW", "[]")))
        self.loaded = set()

    def count_params(self):
        return 1234

    def get_num_threads(self):
        return self.threads

    def train(self, steps, data=None):
        if data is not None and data not in self.loaded:  # as the real peers' self.data[data]
            raise KeyError(data)
        with open({log!r} + ".train", "a") as f:
            f.write(json.dumps(data) + "\\n")
        time.sleep(0.002 * steps)
        return {{"losses": [next(self.losses, 1.0) for _ in range(steps)],
                "overflow": [next(self.overflow, False) for _ in range(steps)]}}

    def load(self, name, batches, vocab, pad_to_multiple_of):
        self.loaded.add(name)
        with open({log!r} + ".load", "a") as f:
            f.write(json.dumps(dict(name=name, batches=batches, vocab=vocab,
                                    multiple=pad_to_multiple_of)) + "\\n")
        # As DataCollatorWithPadding pads: the longest, rounded up (FAKE_PEER_NO_MULTIPLE: not).
        m = 1 if os.environ.get("FAKE_PEER_NO_MULTIPLE") else pad_to_multiple_of
        return [-(-max(len(e["input_ids"]) for e in b) // m) * m for b in batches]

class FakeEncoder:
    def __init__(self, model_dir, batch, threads):
        hf = os.path.join(model_dir, "config.json")  # else google-research/bert's bert_config
        config = json.load(open(hf if os.path.exists(hf) else model_dir + "/bert_config.json"))
        with open({log!r} + ".encoder." + sys.argv[-1], "w") as f:
            json.dump(dict(model_dir=model_dir, files=sorted(os.listdir(model_dir)), batch=batch,
                           threads=threads), f)
        self.shape = (len(batch["input_ids"]), len(batch["input_ids"][0]), config["hidden_size"])
        self.versions = {{"fake": "1"}}
        self.threads = threads

    def count_params(self):
        return 1234

    def get_num_threads(self):
        return self.threads

    def infer(self, steps, save=None):
        import numpy as np

        time.sleep(0.002 * steps)
        if save:
            np.savez(save, sequence_output=np.zeros(self.shape, np.float32),
                     pooled_output=np.zeros((self.shape[0], self.shape[2]), np.float32))

if os.environ.get("FAKE_PEER_EXIT"):
    sys.exit(int(os.environ["FAKE_PEER_EXIT"]))
for module in ("bench.torch_peer", "bench.model_garden_peer"):
    sys.modules[module] = types.SimpleNamespace(__name__=module, Peer=FakePeer, Encoder=FakeEncoder)
sys.exit(peer_worker.main(["peer_worker", sys.argv[-1]]))
"""


@pytest.fixture
def fake_python(tmp_path):
    """An "interpreter" for WorkerPeer(python=...) that runs the stand-in worker; returns it and
    the file where the stand-in records its build request."""
    log = tmp_path / "build.json"
    worker = tmp_path / "fake_worker.py"
    worker.write_text(_FAKE_WORKER.format(repo=str(REPO), log=str(log)))
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{worker}" "$@"\n')
    python.chmod(0o755)
    return str(python), log


def test_the_batch_becomes_labels_at_the_weighted_masked_positions_only():
    batch = pretrain_throughput.synthetic_batch(3, 7, 2, 53)
    batch["masked_lm_weights"][1, 1] = 0.0  # a padded prediction: no loss there
    fake_torch = types.SimpleNamespace(tensor=np.asarray)
    got = torch_peer.torch_batch({k: v.tolist() for k, v in batch.items()}, fake_torch)
    want = np.full((3, 7), -100)
    for row in range(3):
        for j in range(2):
            if batch["masked_lm_weights"][row, j] > 0:
                want[row, batch["masked_lm_positions"][row, j]] = batch["masked_lm_ids"][row, j]
    np.testing.assert_array_equal(got["labels"], want)
    assert (got["labels"] != -100).sum() == 5
    np.testing.assert_array_equal(got["input_ids"], batch["input_ids"])
    np.testing.assert_array_equal(got["attention_mask"], batch["input_mask"])
    np.testing.assert_array_equal(got["token_type_ids"], batch["segment_ids"])
    np.testing.assert_array_equal(got["next_sentence_label"], batch["next_sentence_labels"][:, 0])
    assert all(v.dtype == np.int64 for v in got.values())


def test_the_worker_replies_an_error_and_exits_on_a_bad_request():
    module = types.SimpleNamespace(__name__="bench.nothing", Peer=None)  # never built here

    def answer(*requests):
        replies = io.StringIO()
        code = peer_worker.serve(module, [json.dumps(r) + "\n" for r in requests], replies)
        return code, [json.loads(line) for line in replies.getvalue().splitlines()]

    assert answer({"op": "train", "steps": 1}) == (
        1,
        [{"error": "RuntimeError: train before build"}],
    )
    assert answer({"op": "infer", "steps": 1}) == (
        1,
        [{"error": "RuntimeError: infer before build_encoder"}],
    )
    build = {"op": "build_encoder", "model_dir": "x", "batch": {}, "threads": 1}
    assert answer(build) == (
        1,
        [{"error": "ValueError: bench.nothing has no Encoder: no inference side"}],
    )
    # A build the worker cannot serve is refused before the peer (and its libraries) is built.
    build = {"op": "build", "config": {}, "batch": {}, "seed": 1, "threads": 1}
    assert answer({**build, "precision": "fp8"}) == (
        1,
        [{"error": "ValueError: precision 'fp8': expected one of ('fp32', 'bf16', 'fp16')"}],
    )
    assert answer({**build, "precision": "bf16", "head": "tagger"}) == (
        1,
        [{"error": "ValueError: head 'tagger': expected one of ('pretraining', 'classifier')"}],
    )
    # A GPU only for a peer whose module lists it (torch_peer.DEVICES; Model Garden's none).
    assert answer({**build, "precision": "bf16", "device": "cuda"}) == (
        1,
        [{"error": "ValueError: device 'cuda': expected one of ('cpu',)"}],
    )
    assert peer_worker.devices_of(torch_peer) == ("cpu", "cuda")
    assert answer({"op": "fly"}, {"op": "exit"}) == (1, [{"error": "ValueError: unknown op 'fly'"}])
    assert answer({"op": "exit"}, {"op": "fly"}) == (0, [])
    assert peer_worker.main(["peer_worker", "jax"]) == 2  # not a peer it knows: usage
    with pytest.raises(ValueError, match=r"peer 'jax': expected one of \['hf_torch', 'model_gar"):
        pretrain_throughput.WorkerPeer("jax", None, {}, "fp32")


def test_run_all_refuses_an_unknown_peer_before_running_anything(tmp_path):
    out = tmp_path / "out"
    result = helpers.run_main("bench/run_all.py", [f"--output_dir={out}", "--extra_peers=jax"])
    assert result.returncode == 1
    want = "--extra_peers: unknown extra peers ['jax']; expected some of ['hf_torch', 'model_ga"
    assert want in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("kind", ["hf_torch", "model_garden"])
def test_worker_peer_speaks_to_its_worker_and_names_what_went_wrong(kind, fake_python, monkeypatch):
    python, log = fake_python
    config = pretrain_throughput.parse_size(TINY, vocab_size=53, max_seq_length=7)
    batch = pretrain_throughput.synthetic_batch(3, 7, 2, 53)
    monkeypatch.setenv("FAKE_PEER_LOSSES", json.dumps([2.0, float("nan"), 1.5, 1.4]))
    monkeypatch.setenv("FAKE_PEER_OVERFLOW", json.dumps([False, False, False, True]))
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    peer = pretrain_throughput.WorkerPeer(kind, config, batch, "bf16", python=python)
    sent = json.loads(log.read_text())
    assert sent["argv"] == ["-m", "bench.peer_worker", kind]
    # Model Garden is Keras 2: its worker alone runs with TF_USE_LEGACY_KERAS=1.
    assert sent["legacy"] == ("1" if kind == "model_garden" else None)
    # The same model: Cloze's config as the Hugging Face config.json its converter writes.
    assert sent["config"] == checkpoints.bert_config_to_hf_config(config, heads=True)
    assert sent["precision"] == "bf16" and sent["threads"] == len(os.sched_getaffinity(0))
    assert {k: np.asarray(v).tolist() for k, v in batch.items()} == sent["batch"]
    assert peer.count_params() == 1234 and peer.versions == {"fake": "1"}
    # Rows end as the Trainer's: the loss, 1.0 where fp16's loss scale overflowed, 1.0 where
    # the update was applied (finite, no overflow); the stdout chatter of the build did not
    # get into the replies. time_trainers' check takes an overflow, not a non-finite loss.
    rows = peer.train_steps(None, 4)
    np.testing.assert_array_equal(rows[:, 1:], [[0, 1], [0, 0], [0, 1], [1, 0]])
    assert rows[0, 0] == 2.0 and rows[2, 0] == 1.5 and rows[3, 0] == 1.4
    assert pretrain_throughput.overflow_steps(kind, rows[[0, 2, 3]]) == 1
    with pytest.raises(RuntimeError, match=f"{kind}: a non-finite step during the benchmark"):
        pretrain_throughput.overflow_steps(kind, rows)
    peer.close()
    assert peer._proc.returncode == 0  # it was told to exit, and did

    monkeypatch.setenv("FAKE_PEER_MISSING", "1")
    want = pretrain_throughput.WORKER_PEERS[kind]["requirements"].replace(".", r"\.")
    with pytest.raises(RuntimeError, match=rf"No module named 'torch'.*bench/{want}"):
        pretrain_throughput.WorkerPeer(kind, config, batch, "fp32", python=python)
    monkeypatch.setenv("FAKE_PEER_EXIT", "3")
    with pytest.raises(RuntimeError, match=r"exited with code 3 before answering 'build'"):
        pretrain_throughput.WorkerPeer(kind, config, batch, "fp32", python=python)


def test_the_run_times_the_extra_peers_in_the_same_rounds(fake_python, tmp_path, monkeypatch):
    python, _ = fake_python
    monkeypatch.setattr(flops, "matmul_peak_flops", lambda **_: {"flops_per_s": 1e9, "by_size": {}})
    monkeypatch.setattr(pretrain_throughput, "print", lambda *_: None, raising=False)
    result = pretrain_throughput.run(
        (TINY,), 3, 7, 2, 2, 2, peak={"flops_per_s": 1e9}, vocab_size=53, round_peak={},
        extra_peers=("hf_torch", "model_garden"), peer_python=python,
    )  # fmt: skip
    threads = len(os.sched_getaffinity(0))
    info = {"python": python, "versions": {"fake": "1"}, "threads": threads}
    assert result["extra_peers"] == {"hf_torch": info, "model_garden": info}
    row, config = result["sizes"][0], pretrain_throughput.parse_size(TINY, 53, 7)
    c = row["cloze"]
    for kind in ("hf_torch", "model_garden"):
        h = row[kind]
        assert len(h["step_s_rounds"]) == 2 and len(h["peak_rounds"]) == 2
        assert h["tokens_per_s"] == pytest.approx(3 * 7 / min(h["step_s_rounds"]))
        assert h["params"] == 1234
        assert h["mfu"] == pytest.approx(row["flops_per_step"] / h["step_s"] / 1e9)
        assert row[f"ratio_{kind}"] == pytest.approx(c["tokens_per_s"] / h["tokens_per_s"])
        assert row[f"ratio_{kind}_rounds"] == pytest.approx(
            [t / s for s, t in zip(c["step_s_rounds"], h["step_s_rounds"])]
        )
    # PyTorch's BertForPreTraining runs its MLM head at all 7 positions, not the 2 predictions:
    # more FLOPs than the model count, which its MFU still divides by, as every side's.
    assert row["hf_torch"]["executed_flops_per_step"] == flops.bert_pretraining_flops(
        config, 3, 7, 7
    )
    assert row["hf_torch"]["executed_flops_per_step"] > row["flops_per_step"]
    assert row["model_garden"]["executed_flops_per_step"] == row["flops_per_step"]
    assert row["ratio"] == pytest.approx(c["tokens_per_s"] / row["keras_hub"]["tokens_per_s"])
    with helpers.entrypoint_module("bench/run_all.py") as run_all:
        lines = run_all.table({"pretrain": result}).splitlines()
    (torch_line,) = [x for x in lines if "| PyTorch " in x]
    h = row["hf_torch"]
    assert f"| {row['ratio_hf_torch']:.2f} (rounds " in torch_line
    assert f"HFU {h['hfu']:.0%}" in torch_line
    (garden_line,) = [x for x in lines if "| Model Garden " in x]
    assert f"| {row['ratio_model_garden']:.2f} (rounds " in garden_line
    assert "HFU" not in garden_line  # it executes the model count
    from bench import finetune, inference

    unknown = r"unknown extra peers \['jax'\]; expected some of"
    with pytest.raises(ValueError, match=unknown):
        pretrain_throughput.run(
            (TINY,), 3, 7, 2, 1, 1, peak={"flops_per_s": 1}, extra_peers=["jax"]
        )
    # The other two benchmarks refuse it before they write anything.
    out = tmp_path / "never"
    with pytest.raises(ValueError, match=unknown):
        finetune.run(None, None, out, sizes=(TINY,), steps=1, epoch_batches=1, extra_peers=["jax"])
    with pytest.raises(ValueError, match=unknown):
        inference.run(size=TINY, work_dir=out, extra_peers=["jax"])
    assert not out.exists()


# The modules each real peer needs (its requirements file in bench/ installs them).
PEER_MODULES = {
    "hf_torch": ("torch", "transformers"),
    "model_garden": ("tf_keras", "official.nlp.modeling"),
}


@functools.cache
def _imports(python: str, kind: str) -> bool:
    """Whether `python` imports peer `kind`'s modules (probed once per process)."""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1"}
    command = "import " + ", ".join(PEER_MODULES[kind])
    probe = subprocess.run([python, "-c", command], capture_output=True, timeout=300, env=env)
    return probe.returncode == 0


def _real_peer_python(kind: str) -> str:
    """The interpreter that has peer `kind`'s libraries: CLOZE_PEER_PYTHON, else this one; the
    test is skipped, naming the requirements file, when it has not."""
    python = os.environ.get("CLOZE_PEER_PYTHON", sys.executable)
    if not _imports(python, kind):
        want = pretrain_throughput.WORKER_PEERS[kind]["requirements"]
        pytest.skip(f"no {', '.join(PEER_MODULES[kind])} (bench/{want}; CLOZE_PEER_PYTHON)")
    return python


@pytest.mark.parametrize(
    "kind, extra_params",
    [
        ("hf_torch", lambda h: 0),
        # Model Garden's encoder also holds a pooler its NSP head does not use (hidden^2 + hidden).
        ("model_garden", lambda h: h * h + h),
    ],
)
def test_the_real_peers_hold_clozes_parameters_and_train(kind, extra_params):
    python = _real_peer_python(kind)
    from modeling import bert

    config = pretrain_throughput.parse_size(TINY, vocab_size=53, max_seq_length=7)
    cloze = bert.BertPretrainer(config, "nsp")
    cloze.build()
    batch = pretrain_throughput.synthetic_batch(3, 7, 2, 53)
    for precision in ("fp32", "bf16", "fp16"):
        peer = pretrain_throughput.WorkerPeer(kind, config, batch, precision, python=python)
        try:
            # The same network, to the last parameter (the MLM decoder tied to the word table).
            assert peer.count_params() == cloze.count_params() + extra_params(12)
            rows = peer.train_steps(None, 50)
        finally:
            peer.close()
        # Every step applied, or under fp16 skipped by the library's loss scaler on an
        # overflow (its first steps, until the scale fits the gradients; never otherwise).
        overflow = pretrain_throughput.overflow_steps(f"{kind} {precision}", rows)
        assert (overflow == 0) if precision != "fp16" else (overflow < 20), rows
        # One fixed batch, 50 AdamW steps at 1e-4: the loss (MLM ~ln 53 + NSP ~ln 2 at the
        # start) falls by about 0.003 a step, under dropout's noise of a few hundredths.
        assert rows[0, 0] == pytest.approx(np.log(53) + np.log(2), abs=1.0)
        assert rows[-5:, 0].mean() < rows[:5, 0].mean() - 0.08, rows[:, 0]
    # fp16 from weights 150 times BERT's initial scale (initializer_range 3.0): the first
    # scaled gradients overflow float16, so the library's scaler skips those steps, halving its
    # scale, and the worker reports each; once the scale fits, every step is applied.
    loud = dataclasses.replace(config, initializer_range=3.0)
    peer = pretrain_throughput.WorkerPeer(kind, loud, batch, "fp16", python=python)
    try:
        rows = peer.train_steps(None, 30)
    finally:
        peer.close()
    assert rows[:3, 1].all() and pretrain_throughput.overflow_steps(kind, rows) >= 3, rows
    assert rows[-10:, 2].all(), rows
    if kind == "hf_torch":  # bench/gpu_mfu.py's device: this host has no GPU to train on
        with pytest.raises(RuntimeError, match=r"device 'cuda': PyTorch \S+ sees no CUDA GPU"):
            pretrain_throughput.WorkerPeer(
                kind, config, batch, "fp32", python=python, device="cuda"
            )


@pytest.fixture
def tiny_inference():
    """inference.run's keyword arguments at a tiny size, exports in this process."""
    return dict(
        size="L2/H36/A3/I37", batch=3, seq=17, steps=2, rounds=2, vocab_size=101, in_process=True
    )


def test_inference_times_each_peer_on_the_weights_in_the_format_its_users_read(
    fake_python, tmp_path, tiny_inference
):
    from bench import inference

    python, log = fake_python
    result = inference.run(
        **tiny_inference,
        work_dir=tmp_path / "work",
        extra_peers=("hf_torch", "model_garden"),
        peer_python=python,
        tolerance=float("inf"),  # the stand-in computes nothing: its outputs are zeros
    )
    batch = {k: v.tolist() for k, v in inference.padded_batch(3, 17, 101).items()}
    # PyTorch gets the Hugging Face folder Cloze's converter writes; Model Garden the
    # google-research/bert checkpoint its own converter reads; both the batch every side gets.
    for kind, files in (
        ("hf_torch", {"config.json", "model.safetensors"}),
        ("model_garden", {"bert_config.json", "bert_model.ckpt.index", "checkpoint"}),
    ):
        sent = json.loads(Path(f"{log}.encoder.{kind}").read_text())
        assert sent["model_dir"] == str(tmp_path / "work" / kind)
        assert files <= set(sent["files"]), sent["files"]
        assert sent["batch"] == batch
    folder = tmp_path / "work" / "model_garden"
    assert json.loads((folder / "bert_config.json").read_text())["hidden_size"] == 36
    info = {"python": python, "versions": {"fake": "1"}}
    assert result["extra_peers"] == {
        kind: {**info, "weights": inference.INFERENCE_PEERS[kind]["reads"]}
        for kind in ("hf_torch", "model_garden")
    }
    with helpers.entrypoint_module("bench/run_all.py") as run_all:
        lines = run_all.table({"inference": result}).splitlines()
    for kind, model in (
        ("hf_torch", "Hugging Face PyTorch BertModel"),
        ("model_garden", "TF Model Garden BertEncoder"),
    ):
        h = result[kind]
        assert len(h["batch_s_rounds"]) == 2
        assert h["sequences_per_s"] == pytest.approx(3 / h["batch_s"])
        # Zeros against Cloze's outputs: the difference is the size of Cloze's own outputs.
        assert result["max_abs_difference"][kind]["pooled_output"] > 0
        for name in ("cloze_keras", "saved_model", "saved_model_unpadded"):
            ratio = result[name]["sequences_per_s"] / h["sequences_per_s"]
            assert result[f"ratio_{name}_{kind}"] == pytest.approx(ratio)
            assert result[f"ratio_{name}_{kind}_rounds"] == pytest.approx(
                [t / c for c, t in zip(result[name]["batch_s_rounds"], h["batch_s_rounds"])]
            )
        (row,) = [x for x in lines if f"saved_model, against {model}" in x]
        assert f"| {result[f'ratio_saved_model_{kind}']:.2f} (rounds " in row


@pytest.mark.parametrize("kind", ["hf_torch", "model_garden"])
def test_the_real_peers_compute_clozes_encoder_in_the_inference_bench(
    kind, tmp_path, tiny_inference
):
    python = _real_peer_python(kind)
    from bench import inference

    # The default tolerance, 1e-4, holds for the peer's outputs too (the run raises otherwise):
    # for Model Garden, the weights went through its own converter of google-research/bert
    # checkpoints from what Cloze's --to=tf1_bert writes.
    result = inference.run(
        **tiny_inference, work_dir=tmp_path / "work", extra_peers=(kind,), peer_python=python
    )
    assert max(result["max_abs_difference"][kind].values()) < 1e-4
    assert result[kind]["sequences_per_s"] > 0


def test_fine_tuning_times_each_peers_classifier_on_the_full_batch(
    fake_python, tmp_path, monkeypatch
):
    from bench import finetune

    python, log = fake_python
    monkeypatch.setattr(finetune, "workloads", lambda *a, **k: {})  # the full batch alone here
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]))
    result = finetune.run(
        None, vocab, tmp_path / "work", sizes=(TINY,), batch=3, seq=7, steps=2, epoch_batches=1,
        rounds=2, log=lambda *_: None, extra_peers=("hf_torch", "model_garden"),
        peer_python=python,
    )  # fmt: skip
    want = {k: v.tolist() for k, v in finetune.classifier_batch(3, 7, 6).items()}
    full = result["sizes"][0]["full"]
    with helpers.entrypoint_module("bench/run_all.py") as run_all:
        rows = run_all.finetune_rows(result)
    for kind, model in (
        ("hf_torch", "PyTorch BertForSequenceClassification"),
        ("model_garden", "TF Model Garden BertClassifier"),
    ):
        sent = json.loads(Path(f"{log}.{kind}").read_text())
        assert sent["head"] == "classifier" and sent["argv"][-1] == kind
        assert sent["batch"] == want
        assert len(full[kind]["seconds_rounds"]) == 2
        assert full[kind]["per_s"] == pytest.approx(2 * 3 * 7 / full[kind]["seconds"])
        assert full[f"ratio_{kind}"] == pytest.approx(full["cloze"]["per_s"] / full[kind]["per_s"])
        assert full[f"ratio_{kind}_rounds"] == pytest.approx(
            [h / c for c, h in zip(full["cloze"]["seconds_rounds"], full[kind]["seconds_rounds"])]
        )
        assert result["sizes"][0]["params"][kind] == 1234
        (row,) = [x for x in rows if model in x]
        assert f"| {full[f'ratio_{kind}']:.2f} (rounds " in row
    # Memory: a further worker starts only where MemAvailable holds 1.2x the largest started
    # one's peak (two at BERT-base were killed for memory on 24 GB); else it is refused before
    # it starts, with the reason in the row and the table, and the rest of the run goes on.
    monkeypatch.setattr(host, "available_memory_bytes", lambda: 2**20)  # 1 MB
    result = finetune.run(
        None, vocab, tmp_path / "work", sizes=(TINY,), batch=3, seq=7, steps=1, epoch_batches=1,
        rounds=1, log=lambda *_: None, extra_peers=("hf_torch", "model_garden"),
        peer_python=python,
    )  # fmt: skip
    (row,) = result["sizes"]
    assert "hf_torch" in row["full"] and "model_garden" not in row["full"]
    reason = row["skipped_peers"]["model_garden"]
    assert reason.startswith("0.0 GB of memory available, and a worker like hf_torch's (peak ")
    with helpers.entrypoint_module("bench/run_all.py") as run_all:
        rows = run_all.finetune_rows(result)
    model = finetune.FINETUNE_PEERS["model_garden"]
    assert f"| the same against {model} | skipped: {reason} | | |" in rows


def test_a_worker_is_refused_where_the_memory_would_not_hold_it():
    from bench import finetune

    gb = 2**30
    assert finetune.memory_shortfall({}, 0) is None  # the first worker always starts
    assert finetune.memory_shortfall({"hf_torch": 8 * gb}, None) is None  # unknown: no refusal
    assert finetune.memory_shortfall({"hf_torch": 8 * gb, "x": gb}, 9.6 * gb) is None
    reason = finetune.memory_shortfall({"x": gb, "hf_torch": 8 * gb}, 9.5 * gb)
    assert reason == (
        "9.5 GB of memory available, and a worker like hf_torch's (peak 8.0 GB) needs about "
        "9.6: run this peer alone"
    )
    # /proc's own figures: this process' peak and the machine's available memory, in bytes.
    assert host.peak_rss_bytes(os.getpid()) > 10 * 2**20 and host.available_memory_bytes() > 0
    assert host.peak_rss_bytes(os.getpid(), "Name:\tx\nVmHWM:\t  2048 kB\n") == 2 * 2**20
    assert host.available_memory_bytes("MemTotal: 8 kB\nMemAvailable: 4 kB\n") == 4096
    assert host.available_memory_bytes("MemTotal: 8 kB\n") is None
    assert host.peak_rss_bytes(2**30) is None  # no such process


@pytest.fixture
def pairs_workload(tmp_path, monkeypatch):
    """A vocabulary and a corpus of sentence pairs of varied lengths, with finetune.workloads
    replaced by their corpus_pairs workload alone (no registry fetch); returns the vocabulary."""
    from bench import finetune

    vocab = tmp_path / "vocab.txt"
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"]
    vocab.write_text("".join(f"{t}\n" for t in tokens))
    rng = np.random.default_rng(3)
    corpus = tmp_path / "corpus.txt"
    documents = [
        "\n".join(" ".join(rng.choice(list("abc"), rng.integers(1, 12))) for _ in range(8))
        for _ in range(4)
    ]
    corpus.write_text("\n\n".join(documents) + "\n")

    def workloads(_, tokenizer, work_dir, seq, examples):
        Path(work_dir).mkdir(parents=True, exist_ok=True)
        pairs = finetune.sentence_pairs(corpus, examples)
        path = Path(work_dir) / "corpus_pairs.tf_record"
        return {"corpus_pairs": finetune.write_examples(pairs, "mrpc", tokenizer, path, seq)}

    monkeypatch.setattr(finetune, "workloads", workloads)
    return vocab


def _tiny_epochs(vocab, work_dir, python):
    from bench import finetune

    return finetune.run(
        None, vocab, work_dir, sizes=(TINY,), batch=3, seq=32, steps=1, epoch_batches=2,
        rounds=2, log=lambda *_: None, extra_peers=("hf_torch",), peer_python=python,
    )  # fmt: skip


def test_fine_tuning_epochs_give_pytorch_clozes_batches_unpadded(
    fake_python, tmp_path, pairs_workload, monkeypatch
):
    from bench import finetune
    from data_prep import features

    python, log = fake_python
    result = _tiny_epochs(pairs_workload, tmp_path / "work", python)
    e = result["sizes"][0]["corpus_pairs"]
    loads = [json.loads(x) for x in Path(f"{log}.load").read_text().splitlines()]
    assert [x["name"] for x in loads] == ["hf_torch", "hf_torch_grouped"]
    for sent, groups, cut in (
        (loads[0], 0, e["cut_lengths"]),
        (loads[1], finetune.LENGTH_GROUP_BATCHES, e["cut_lengths_grouped"]),
    ):
        assert sent["vocab"] == str(pairs_workload) and sent["multiple"] == features.TRIM_MULTIPLE
        cloze = features.classifier_dataset(
            [result["workloads"]["corpus_pairs"]["file"]], 3, 32, seed=finetune.EPOCH_SEED,
            dynamic_padding=True, length_group_batches=groups,
        )  # fmt: skip
        assert len(sent["batches"]) == 2
        for examples, batch, length in zip(sent["batches"], cloze.take(2), cut):
            assert batch["input_ids"].shape == (3, length)
            # Cloze's rows, each without its padding: [CLS] ... [SEP], then nothing but [PAD].
            for example, ids, segments, label in zip(
                examples,
                batch["input_ids"].numpy(),
                batch["segment_ids"].numpy(),
                batch["label_ids"].numpy().reshape(-1),
            ):
                k = len(example["input_ids"])
                assert example["input_ids"] == ids[:k].tolist() and not ids[k:].any()
                assert ids[0] == 2 and ids[k - 1] == 3 and 0 not in ids[:k]
                assert example["token_type_ids"] == segments[:k].tolist()
                assert example["labels"] == int(label) in (0, 1)
            assert length - features.TRIM_MULTIPLE < max(len(x["input_ids"]) for x in examples)
    # The full batch (one untimed call, where its memory is measured, 2 rounds), then each
    # epoch by its name, as often.
    trained = [json.loads(x) for x in Path(f"{log}.train").read_text().splitlines()]
    assert trained[:3] == [None] * 3
    assert sorted(trained[3:]) == ["hf_torch"] * 3 + ["hf_torch_grouped"] * 3
    for ours, theirs, key in (
        ("cloze", "hf_torch", "ratio_hf_torch"),
        ("cloze_grouped", "hf_torch_grouped", "ratio_grouped_hf_torch"),
        ("cloze_unpadded", "hf_torch", "ratio_unpadded_hf_torch"),
        ("cloze_grouped_unpadded", "hf_torch_grouped", "ratio_grouped_unpadded_hf_torch"),
    ):
        assert e[theirs]["per_s"] == pytest.approx(2 * 3 / e[theirs]["seconds"])
        assert e[key] == pytest.approx(e[ours]["per_s"] / e[theirs]["per_s"])
        assert e[f"{key}_rounds"] == pytest.approx(
            [t / c for c, t in zip(e[ours]["seconds_rounds"], e[theirs]["seconds_rounds"])]
        )
    with helpers.entrypoint_module("bench/run_all.py") as run_all:
        rows = run_all.finetune_rows(result)
    (row,) = [x for x in rows if "the --group_by_length batches against Hugging Face" in x]
    assert f"| {e['ratio_grouped_hf_torch']:.2f} (rounds " in row
    (row,) = [x for x in rows if "Cloze with --remove_padding, against Hugging Face" in x]
    assert f"| {e['ratio_unpadded_hf_torch']:.2f} (rounds " in row
    (row,) = [x for x in rows if "Cloze with --remove_padding too, against Hugging Face" in x]
    assert f"| {e['ratio_grouped_unpadded_hf_torch']:.2f} (rounds " in row

    # A collator that pads to other lengths than Cloze's cut would time other work: refused.
    monkeypatch.setenv("FAKE_PEER_NO_MULTIPLE", "1")
    with pytest.raises(RuntimeError, match=r"hf_torch's collator padded the batches to \["):
        _tiny_epochs(pairs_workload, tmp_path / "work2", python)


def test_the_real_collator_pads_clozes_epochs_to_its_cut_lengths(tmp_path, pairs_workload):
    python = _real_peer_python("hf_torch")
    # The run stops if DataCollatorWithPadding pads to other lengths, or a loss is not finite.
    e = _tiny_epochs(pairs_workload, tmp_path / "work", python)["sizes"][0]["corpus_pairs"]
    assert e["hf_torch"]["per_s"] > 0 and e["hf_torch_grouped"]["per_s"] > 0


@pytest.mark.parametrize("kind", ["hf_torch", "model_garden"])
def test_the_real_classifiers_hold_clozes_parameters(kind):
    python = _real_peer_python(kind)
    from bench import finetune
    from modeling import finetuning

    config = pretrain_throughput.parse_size(TINY, vocab_size=53, max_seq_length=7)
    cloze = finetuning.BertClassifier(config, 2)
    cloze.build()
    batch = finetune.classifier_batch(3, 7, 53)
    peer = pretrain_throughput.WorkerPeer(
        kind, config, batch, "fp32", python=python, head="classifier"
    )
    try:
        assert peer.count_params() == cloze.count_params()
        rows = peer.train_steps(None, 5)
    finally:
        peer.close()
    # Two classes, a fresh head: the cross-entropy starts near ln 2.
    assert rows[:, 2].all() and rows[0, 0] == pytest.approx(np.log(2), abs=0.3), rows


# bench/gpu_mfu.py under Keras' JAX backend, in a process of its own, with a PyTorch side whose
# worker is argv[1]'s interpreter.
_GPU_WITH_PEER = """
import json, sys
from bench import gpu_mfu

try:
    gpu_mfu.run(gpu_mfu.TINY_SIZES[:1], "fp16", 1, 1, 64, extra_peers=["model_garden"])
except ValueError as e:
    refused = str(e)
result = gpu_mfu.run(gpu_mfu.TINY_SIZES[:1], "fp16", steps=2, repeats=2, peak_n=64,
                     extra_peers=["hf_torch"], peer_python=sys.argv[1])
print(json.dumps({"refused": refused, "result": result}))
"""


def test_gpu_mfu_times_pytorch_in_a_worker_beside_the_jax_sides(fake_python, monkeypatch):
    """--extra_peers=hf_torch: the worker gets the size's config and batch at the run's
    precision (on the CPU where JAX has no GPU), is timed in `repeats` calls of `steps` steps
    after its warm-up, and its row has the other sides' figures over the same model FLOPs and
    peak, the steps its scaler skipped, and Cloze's ratio over it. Model Garden (TensorFlow) is
    refused before anything runs."""
    python, log = fake_python
    # Warm-up: 3 steps; then 2 calls of 2: the second call's first step overflowed.
    monkeypatch.setenv("FAKE_PEER_OVERFLOW", json.dumps([False] * 5 + [True, False]))
    monkeypatch.setenv("FAKE_PEER_LOSSES", json.dumps([3.0] * 6 + [2.5]))
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    done = subprocess.run(
        [sys.executable, "-c", _GPU_WITH_PEER, python], env=env, capture_output=True, text=True,
        timeout=600, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["refused"] == "extra peers ['model_garden']: only 'hf_torch' runs here"
    result = out["result"]
    (row,) = result["rows"]
    from bench import gpu_mfu  # imported here, it leaves this process' Keras backend alone

    _, layers, hidden, heads, inner, batch, seq, predictions = gpu_mfu.TINY_SIZES[0]
    sent = json.loads(log.read_text())
    config = gpu_mfu.size_config(layers, hidden, heads, inner, seq)
    assert sent["config"] == checkpoints.bert_config_to_hf_config(config, heads=True)
    assert sent["precision"] == "fp16"
    data = gpu_mfu.make_batch(batch, seq, predictions)
    assert sent["batch"] == {k: v.tolist() for k, v in data.items()}
    h = row["hf_torch"]
    assert h["device"] == "cpu" and h["params"] == 1234 and h["overflow_steps"] == 1
    assert h["final_loss"] == 2.5 and result["versions"]["hf_torch"] == {"fake": "1"}
    assert h["tokens_per_second"] == pytest.approx(batch * seq / h["step_seconds"])
    mfu = row["cloze"]["mfu"] * row["cloze"]["step_seconds"] / h["step_seconds"]
    assert h["mfu"] == pytest.approx(mfu)  # the same FLOPs and peak as Cloze's
    ratio = row["cloze"]["tokens_per_second"] / h["tokens_per_second"]
    assert row["ratio_cloze_over_hf_torch"] == pytest.approx(ratio)
