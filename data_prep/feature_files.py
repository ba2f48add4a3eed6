"""extract_features.py's input lines and output files: the original JSON lines and a compact .npz.

Input (as the original extract_features.py): one example a line, `text_a` or
`text_a ||| text_b`; every line is an example (an empty one gives `[CLS] [SEP]`), numbered from 0.

JSON lines (the original's format, values rounded to 6 decimals):
  {"linex_index": 0, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]},
   ...]}, ...]}
Compact .npz (no pickled objects; float32 values as computed, not rounded):
  values       float32 (T, K, H)  every token of every line, K chosen layers, H hidden
  tokens       str (T,)           the WordPieces, [CLS] and [SEP] included
  offsets      int64 (N + 1,)     line n's tokens are rows offsets[n]:offsets[n + 1]
  linex_index  int64 (N,)
  layers       int64 (K,)         the --layers indices, in the order of the K axis
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from data_prep.errors import input_error
from data_prep.tokenization import read_utf8_lines

_PAIR = re.compile(r"^(.*) \|\|\| (.*)$")


@dataclasses.dataclass(frozen=True)
class InputLine:
    """One example: its index (the line, from 0), the line number (from 1) and the texts."""

    unique_id: int
    line: int
    text_a: str
    text_b: str | None


def read_input_lines(path: str | os.PathLike) -> list[InputLine]:
    """Reads `text_a` / `text_a ||| text_b` lines (see the docstring); InputError when empty."""
    out = []
    for number, text in read_utf8_lines(path):
        text = text.strip()
        match = _PAIR.match(text)
        a, b = (match.group(1), match.group(2)) if match else (text, None)
        out.append(InputLine(number - 1, number, a, b))
    if not out:
        raise input_error(str(path), "one `text_a [||| text_b]` example a line", "an empty file")
    return out


@dataclasses.dataclass
class LineFeatures:
    """The features of one line: its tokens and values float32 (T, K, H) for `layers`."""

    linex_index: int
    tokens: list[str]
    values: np.ndarray
    layers: tuple[int, ...]


def jsonl_record(item: LineFeatures) -> str:
    """One line of the original's JSON output (values rounded to 6 decimals, as it does)."""
    features = [
        {
            "token": token,
            "layers": [
                {"index": int(index), "values": [round(float(x), 6) for x in item.values[t, k]]}
                for k, index in enumerate(item.layers)
            ],
        }
        for t, token in enumerate(item.tokens)
    ]
    return json.dumps({"linex_index": int(item.linex_index), "features": features})


class FeatureWriter:
    """Streams LineFeatures to the JSON lines file and/or the .npz file (either may be None).

    The .npz needs the total token count up front (`num_tokens`): its values are written into a
    memory-mapped array beside it, so a large input does not have to fit in memory. Files are
    complete only after close(); until then they carry a temp name.
    """

    def __init__(
        self,
        jsonl_path: str | os.PathLike | None,
        npz_path: str | os.PathLike | None,
        num_tokens: int = 0,
        num_lines: int = 0,
        layers: Sequence[int] = (),
        hidden_size: int = 0,
    ):
        self.jsonl_path = Path(jsonl_path) if jsonl_path else None
        self.npz_path = Path(npz_path) if npz_path else None
        self._jsonl = None
        self._values = None
        self._row = 0
        self._tokens: list[str] = []
        self._offsets = [0]
        self._ids: list[int] = []
        self._layers = tuple(int(i) for i in layers)
        if self.jsonl_path:
            self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)
            self._jsonl_tmp = self.jsonl_path.with_name(f".{self.jsonl_path.name}.tmp")
            self._jsonl = open(self._jsonl_tmp, "w", encoding="utf-8", newline="\n")
        if self.npz_path:
            self.npz_path.parent.mkdir(parents=True, exist_ok=True)
            self._values_tmp = self.npz_path.with_name(f".{self.npz_path.name}.values.npy")
            shape = (num_tokens, len(self._layers), hidden_size)
            self._values = np.lib.format.open_memmap(
                self._values_tmp, mode="w+", dtype=np.float32, shape=shape
            )

    def write(self, item: LineFeatures) -> None:
        if self._jsonl is not None:
            self._jsonl.write(jsonl_record(item) + "\n")
        if self._values is not None:
            n = len(item.tokens)
            self._values[self._row : self._row + n] = item.values
            self._row += n
            self._tokens += item.tokens
            self._offsets.append(self._row)
            self._ids.append(int(item.linex_index))

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            os.replace(self._jsonl_tmp, self.jsonl_path)
            self._jsonl = None
        if self._values is not None:
            if self._row != len(self._values):
                raise ValueError(f"wrote {self._row} token rows, expected {len(self._values)}")
            tmp = self.npz_path.with_name(f".{self.npz_path.name}.tmp.npz")
            np.savez(
                tmp,
                values=self._values,
                tokens=np.array(self._tokens, dtype=str),
                offsets=np.array(self._offsets, np.int64),
                linex_index=np.array(self._ids, np.int64),
                layers=np.array(self._layers, np.int64),
            )
            os.replace(tmp, self.npz_path)
            del self._values
            self._values = None
            os.remove(self._values_tmp)


def read_jsonl(path: str | os.PathLike) -> Iterator[LineFeatures]:
    """Reads the JSON lines output back (this project's or the original's)."""
    for number, text in read_utf8_lines(path):
        try:
            record = json.loads(text)
            features = record["features"]
            layers = tuple(int(x["index"]) for x in features[0]["layers"]) if features else ()
            values = np.array(
                [[x["values"] for x in f["layers"]] for f in features], np.float32
            )  # (T, K, H)
            tokens = [f["token"] for f in features]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError, ValueError) as e:
            raise input_error(
                f"{path}:{number}", "an extract_features JSON line", repr(e)
            ) from None
        yield LineFeatures(int(record["linex_index"]), tokens, values, layers)


def read_npz(path: str | os.PathLike) -> Iterable[LineFeatures]:
    """Reads the compact .npz back, line by line."""
    with np.load(path, allow_pickle=False) as data:
        values, tokens, offsets = data["values"], data["tokens"], data["offsets"]
        ids, layers = data["linex_index"], tuple(int(i) for i in data["layers"])
    return [
        LineFeatures(int(ids[n]), tokens[a:b].tolist(), values[a:b], layers)
        for n, (a, b) in enumerate(zip(offsets[:-1], offsets[1:]))
    ]


# ---------------------------------------------------------------------------------------------
# run_ner.py --feature_cache: a frozen encoder's outputs per tagging window, computed once
# ---------------------------------------------------------------------------------------------
# One .npz per split:
#   layer_features  float32 (W, S, L + 1, H)  every encoder output (embeddings, then each layer)
#   key             str ()                    what the values were computed from (cache_key)


def cache_key(checkpoint_prefix: str, config_json: str, features: dict) -> str:
    """A digest of what a frozen encoder's outputs depend on: the checkpoint (its prefix and its
    .index file, which changes with every save), the encoder config and the windows' inputs."""
    import hashlib

    digest = hashlib.sha256()
    digest.update(checkpoint_prefix.encode())
    index = Path(checkpoint_prefix + ".index")
    digest.update(index.read_bytes() if index.exists() else b"")
    digest.update(config_json.encode())
    for name in ("input_ids", "input_mask", "segment_ids"):
        array = np.ascontiguousarray(features[name], np.int32)
        digest.update(f"{name}{array.shape}".encode() + array.tobytes())
    return digest.hexdigest()


def read_layer_cache(path: str | os.PathLike, key: str) -> np.ndarray | None:
    """The cached (W, S, L + 1, H) values when `path` exists and was made for `key`, else None."""
    if not Path(path).exists():
        return None
    with np.load(path, allow_pickle=False) as data:
        if str(data["key"]) != key:
            return None
        return data["layer_features"]


def write_layer_cache(path: str | os.PathLike, key: str, values: np.ndarray) -> None:
    """Writes one split's cached encoder outputs (atomically: a temp file, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    np.savez(tmp, layer_features=np.asarray(values, np.float32), key=np.array(key))
    os.replace(tmp, path)


def in_memory_training_batches(
    features: dict, batch_size: int, seed: int, num_shards: int = 1, shard_index: int = 0
):
    """Endless shuffled batches of in-memory arrays (N rows each), as the TFRecord pipelines give.

    The shuffle runs over row numbers and each batch gathers its rows, so a checkpointed iterator
    holds N integers, not the (possibly large) rows themselves.
    """
    import tensorflow as tf

    rows = {k: tf.constant(v) for k, v in features.items()}
    n = len(next(iter(features.values())))
    index = tf.data.Dataset.range(n)
    if num_shards > 1:
        index = index.shard(num_shards, shard_index)
    index = index.shuffle(n, seed=seed, reshuffle_each_iteration=True).repeat()
    batches = index.batch(batch_size, drop_remainder=True)
    batches = batches.map(lambda i: {k: tf.gather(v, i) for k, v in rows.items()})  # (B, ...)
    return batches.prefetch(tf.data.AUTOTUNE)
