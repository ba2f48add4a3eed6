"""A worker process for one of the pretraining benchmark's optional peers.

  hf_torch      bench/torch_peer.py: Hugging Face transformers' BertForPreTraining under PyTorch
  model_garden  bench/model_garden_peer.py: TF Model Garden's BertPretrainerV2 under tf_keras

Why a process of its own: PyTorch's OpenMP threads and TensorFlow's pools would share the cores
inside one process, with each library's idle threads left between the alternating rounds, and
Model Garden needs Keras 2 (TF_USE_LEGACY_KERAS=1) where the benchmark's own process runs
Keras 3. The worker can run under another interpreter (a venv holding the peer: its
requirements file in bench/, pretrain_throughput's `peer_python`). It imports the peer's
libraries only when asked to build it.

Protocol, one JSON object per line (requests on stdin, replies on the stdout the worker keeps
for itself; anything a library prints goes to stderr):
  {"op": "build", "config": <Hugging Face config.json dict>, "batch": <feature: nested list>,
   "precision": "fp32"|"bf16", "seed": int, "threads": int}
      ->  {"params": int, "versions": {...}, "threads": int}
  {"op": "train", "steps": int}  ->  {"losses": [...], "seconds": float}
  {"op": "exit"}
An error in a request replies {"error": "<type>: <message>"} and the worker exits 1.

A peer is a class Peer(config, batch, precision, seed, threads) with count_params(),
train(steps) -> the steps' losses, get_num_threads() and a `versions` dict.
"""

from __future__ import annotations

import json
import os
import sys
import time

# The sides this worker runs.
PEERS = ("hf_torch", "model_garden")


def peer_class(kind: str):
    """The Peer class of side `kind` (its module imports its libraries only when it builds)."""
    if kind == "hf_torch":
        from bench import torch_peer

        return torch_peer.Peer
    if kind == "model_garden":
        from bench import model_garden_peer

        return model_garden_peer.Peer
    raise ValueError(f"peer {kind!r}: expected one of {PEERS}")


def serve(peer_class, requests, replies) -> int:
    """Answers the protocol's requests (module docstring) until `exit` or end of input."""
    peer = None
    for line in requests:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            op = request["op"]
            if op == "exit":
                return 0
            if op == "build":
                peer = peer_class(
                    request["config"],
                    request["batch"],
                    request["precision"],
                    request["seed"],
                    request["threads"],
                )
                reply = {
                    "params": peer.count_params(),
                    "versions": peer.versions,
                    "threads": peer.get_num_threads(),
                }
            elif op == "train":
                if peer is None:
                    raise RuntimeError("train before build")
                start = time.perf_counter()
                losses = peer.train(int(request["steps"]))
                reply = {"losses": losses, "seconds": time.perf_counter() - start}
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
    chosen = peer_class(argv[1])
    # The protocol keeps the real stdout; whatever the libraries print goes to stderr instead.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return serve(chosen, sys.stdin, replies)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
