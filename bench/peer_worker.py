"""A worker process for one of the pretraining, inference and fine-tuning benchmarks' optional
peers.

  hf_torch      bench/torch_peer.py: Hugging Face transformers' BertForPreTraining under PyTorch
                (its BertModel for inference, BertForSequenceClassification for fine-tuning)
  model_garden  bench/model_garden_peer.py: TF Model Garden's BertPretrainerV2 under tf_keras
                (its BertEncoder for inference, BertClassifier for fine-tuning)

Why a process of its own: PyTorch's OpenMP threads and TensorFlow's pools would share the cores
inside one process, with each library's idle threads left between the alternating rounds, and
Model Garden needs Keras 2 (TF_USE_LEGACY_KERAS=1) where the benchmark's own process runs
Keras 3. The worker can run under another interpreter (a venv holding the peer: its
requirements file in bench/, pretrain_throughput's `peer_python`). It imports the peer's
libraries only when asked to build it.

Protocol, one JSON object per line (requests on stdin, replies on the stdout the worker keeps
for itself; anything a library prints goes to stderr):
  {"op": "build", "config": <Hugging Face config.json dict>, "batch": <feature: nested list>,
   "precision": "fp32"|"bf16"|"fp16", "seed": int, "threads": int, optional "head": "classifier",
   optional "device": "cpu" (the default) or "cuda" (hf_torch only: bench/gpu_mfu.py's side)}
      (precision, head and device checked here, before the peer's libraries are imported)
      ->  {"params": int, "versions": {...}, "threads": int}
  {"op": "train", "steps": int, optional "data": <a name load kept>}  ->  {"losses": [...],
   "overflow": [...]}: each step's loss, and true where fp16's loss scale overflowed (the
   update skipped and the scale halved; always false in fp32 and bf16)
  {"op": "load", "name": str, "batches": [[{"input_ids", "token_type_ids", "labels"}, ...], ...],
   "vocab": <WordPiece vocabulary file>, "pad_to_multiple_of": int}  ->  {"lengths": [...]}:
   an epoch's batches of unpadded examples, for train's "data" (hf_torch's classifier only: the
   fine-tuning epochs), and the lengths the worker will pad them to
  {"op": "build_encoder", "model_dir": <the folder of weights the side reads: a Hugging Face
   BertModel folder for hf_torch, a google-research/bert checkpoint for model_garden>, "batch":
   <input_ids, input_mask, segment_ids>, "threads": int}  ->  as build (the inference side)
  {"op": "infer", "steps": int, "save": <.npz path> | null}  ->  {}; the last pass'
   sequence_output and pooled_output go to `save` when given
The caller times train and infer around the request (what it sees is what it compares).
  {"op": "exit"}
An error in a request replies {"error": "<type>: <message>"} and the worker exits 1.

A peer's module has a class Peer(config, batch, precision, seed, threads, head) (and `device`
where its module lists more DEVICES than "cpu") with
count_params(), train(steps, data=None) -> train's reply, get_num_threads() and a
`versions` dict (where it trains epochs, also load(name, batches, vocab, pad_to_multiple_of) ->
the padded lengths), and may have a class Encoder(model_dir, batch, threads) with the same but
infer(steps, save) for train.
"""

from __future__ import annotations

import json
import os
import sys

from training.precision import PRECISION_NAMES

# The sides this worker runs, and what every side's Peer is built with: its precision (one of
# training/precision.PRECISION_NAMES), and its head (the pretraining benchmark's MLM + NSP, or
# the fine-tuning benchmark's classifier).
PEERS = ("hf_torch", "model_garden")
HEADS = ("pretraining", "classifier")


def peer_module(kind: str):
    """The module of side `kind`: its Peer class (pretraining) and, where the benchmark has
    one, its Encoder class (inference). It imports its libraries only when one is built."""
    if kind == "hf_torch":
        from bench import torch_peer

        return torch_peer
    if kind == "model_garden":
        from bench import model_garden_peer

        return model_garden_peer
    raise ValueError(f"peer {kind!r}: expected one of {PEERS}")


def devices_of(module) -> tuple:
    """Where `module`'s Peer trains: its DEVICES, else the CPU alone."""
    return tuple(getattr(module, "DEVICES", ("cpu",)))


def serve(module, requests, replies) -> int:
    """Answers the protocol's requests (module docstring) with `module`'s Peer and Encoder
    until `exit` or end of input."""
    built = {}  # "train": the Peer, "infer": the Encoder
    for line in requests:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            op = request["op"]
            if op == "exit":
                return 0
            if op in ("build", "build_encoder"):
                if op == "build":
                    precision, head = request["precision"], request.get("head", "pretraining")
                    if precision not in PRECISION_NAMES:
                        raise ValueError(
                            f"precision {precision!r}: expected one of {PRECISION_NAMES}"
                        )
                    if head not in HEADS:
                        raise ValueError(f"head {head!r}: expected one of {HEADS}")
                    device, devices = request.get("device", "cpu"), devices_of(module)
                    if device not in devices:
                        raise ValueError(f"device {device!r}: expected one of {devices}")
                    side = built["train"] = module.Peer(
                        request["config"],
                        request["batch"],
                        precision,
                        request["seed"],
                        request["threads"],
                        head=head,
                        **({"device": device} if device != "cpu" else {}),
                    )
                elif getattr(module, "Encoder", None) is None:
                    raise ValueError(f"{module.__name__} has no Encoder: no inference side")
                else:
                    side = built["infer"] = module.Encoder(
                        request["model_dir"], request["batch"], request["threads"]
                    )
                reply = {
                    "params": side.count_params(),
                    "versions": side.versions,
                    "threads": side.get_num_threads(),
                }
            elif op == "load":
                if "train" not in built:
                    raise RuntimeError("load before build")
                if getattr(built["train"], "load", None) is None:
                    raise ValueError(f"{module.__name__} has no load: no epochs")
                reply = {
                    "lengths": built["train"].load(
                        request["name"],
                        request["batches"],
                        request["vocab"],
                        request["pad_to_multiple_of"],
                    )
                }
            elif op in ("train", "infer"):
                if op not in built:
                    raise RuntimeError(
                        f"{op} before {'build' if op == 'train' else 'build_encoder'}"
                    )
                if op == "train":
                    data = {"data": request["data"]} if request.get("data") else {}
                    reply = built["train"].train(int(request["steps"]), **data)
                else:
                    built["infer"].infer(int(request["steps"]), request.get("save"))
                    reply = {}
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as e:  # noqa: BLE001 -- the caller gets the message, then the exit
            replies.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
            replies.flush()
            return 1
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    return 0


def main(argv) -> int:
    if len(argv) != 2 or argv[1] not in PEERS:
        print(f"usage: python -m bench.peer_worker {{{'|'.join(PEERS)}}}", file=sys.stderr)
        return 2
    module = peer_module(argv[1])
    # The protocol keeps the real stdout; whatever the libraries print goes to stderr instead.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return serve(module, sys.stdin, replies)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
