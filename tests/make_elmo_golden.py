"""Writes tests/fixtures/elmo_bilm_tiny/: a tiny ELMo biLM in the published files' layout
(options.json + weights.hdf5, as bilm-tf's dump_weights writes them and allennlp.modules.elmo reads
them) and what AllenNLP's own ELMo modules compute with it.

The published ELMo weights cannot be had offline (shared/DATA.md), so this is a published-format
stand-in whose computation no one here wrote: AllenNLP 2.10.1's `_ElmoBiLm` (the character CNN,
highway layers, projection and the LSTMs with projections, clipping and residuals that load the
published weights.hdf5), its `ELMoCharacterMapper` (the character ids) and `remove_sentence_
boundaries`, run on seeded random weights. The CI tests (tests/test_elmo_convert.py) convert the
folder with convert_checkpoint.py and compare Cloze against these numbers without PyTorch.

Files: options.json (the published files' keys: no n_tokens_vocab, no softmax), weights.hdf5
(bilm-tf's names and shapes: char_embed without the padding row, CNN/W_cnn_i (1, width, E, n),
CNN_high_k/{W,b}_{carry,transform}, CNN_proj, RNN_d/RNN/MultiRNNCell/Cell{k}/LSTMCell/{W_0, B,
W_P_0} with TF1's gate order i, j, f, o and its forget bias not in B), and golden.npz: SENTENCES'
character ids as AllenNLP's mapper gives them (0 rows pad a sentence), its mask, and the L + 1
layer activations `_ElmoBiLm` returns with the <S> / </S> positions removed.

AllenNLP pins PyTorch < 1.13 and pulls in spaCy and more; its ELMo files need none of that, so
they are imported from the unzipped wheel with the rest of the package stubbed (allennlp_elmo).
Run once, and again whenever SENTENCES or the sizes change:
  pip download allennlp==2.10.1 --no-deps -d /tmp/dl && unzip -q /tmp/dl/allennlp-*.whl -d /tmp/an
  pip install torch==2.13.0 h5py   # ideally in a separate venv
  ALLENNLP_SRC=/tmp/an python tests/make_elmo_golden.py
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "tests" / "fixtures" / "elmo_bilm_tiny"

# Case, punctuation, accents (bytes of multi-byte characters), a word past the 48 bytes a token
# keeps, and lengths that pad.
SENTENCES = (
    ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "."],
    ["Crème", "brûlée", "in", "Zürich", "!"],
    ["Pneumonoultramicroscopicsilicovolcanoconiosis-and-then-some-more-letters", "end"],
    ["a"],
)
OPTIONS = {
    "lstm": {"dim": 24, "projection_dim": 8, "n_layers": 2, "cell_clip": 3, "proj_clip": 3,
             "use_skip_connections": True},
    "char_cnn": {"activation": "relu", "filters": [[1, 4], [2, 6], [3, 6]], "n_highway": 2,
                 "embedding": {"dim": 4}, "n_characters": 262, "max_characters_per_token": 50},
}  # fmt: skip


def write_weights(path: Path, rng) -> None:
    """weights.hdf5 in bilm-tf's layout, every array drawn from `rng` (scaled so the clipping,
    the gates and the residuals all matter)."""
    import h5py

    lstm, cnn = OPTIONS["lstm"], OPTIONS["char_cnn"]
    e, p, h = cnn["embedding"]["dim"], lstm["projection_dim"], lstm["dim"]
    f = sum(n for _, n in cnn["filters"])

    def draw(*shape, scale=0.5):
        return (rng.standard_normal(shape) * scale).astype("float32")

    with h5py.File(path, "w") as out:
        out["char_embed"] = draw(261, e, scale=1.0)
        group = out.create_group("CNN")
        for i, (width, count) in enumerate(cnn["filters"]):
            group[f"W_cnn_{i}"] = draw(1, width, e, count)
            group[f"b_cnn_{i}"] = draw(count, scale=0.1)
        for k in range(cnn["n_highway"]):
            group = out.create_group(f"CNN_high_{k}")
            for name in ("carry", "transform"):
                group[f"W_{name}"] = draw(f, f, scale=0.3)
                group[f"b_{name}"] = draw(f, scale=0.3)
        group = out.create_group("CNN_proj")
        group["W_proj"] = draw(f, p, scale=0.3)
        group["b_proj"] = draw(p, scale=0.1)
        for d in range(2):
            for k in range(lstm["n_layers"]):
                group = out.create_group(f"RNN_{d}/RNN/MultiRNNCell/Cell{k}/LSTMCell")
                group["W_0"] = draw(p + p, 4 * h, scale=0.6)
                group["B"] = draw(4 * h, scale=0.3)
                group["W_P_0"] = draw(h, p, scale=0.6)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports allennlp's ELMo files from the unzipped wheel: package __init__ files skipped,
    REAL modules from their files, every other allennlp module and the missing third-party
    packages as MagicMocks."""

    REAL = {
        "allennlp.modules.elmo", "allennlp.modules.elmo_lstm", "allennlp.modules.highway",
        "allennlp.modules.lstm_cell_with_projection", "allennlp.modules.scalar_mix",
        "allennlp.modules.encoder_base", "allennlp.nn.util", "allennlp.common.checks",
        "allennlp.data.token_indexers.elmo_indexer",
    }  # fmt: skip
    THIRD = {"spacy", "nltk", "base58", "cached_path", "huggingface_hub"}

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top == "allennlp":
            file = os.path.join(self.root, *name.split("."))
            if name in self.REAL:
                return importlib.util.spec_from_file_location(name, file + ".py")
            spec = importlib.machinery.ModuleSpec(name, self, is_package=os.path.isdir(file))
            if os.path.isdir(file):
                spec.submodule_search_locations = [file]
            return spec
        if top in self.THIRD:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        if spec.submodule_search_locations and spec.name.startswith("allennlp"):
            module = type(sys)(spec.name)
            module.__path__ = spec.submodule_search_locations
            if spec.name == "allennlp.common":  # base classes ELMo's classes derive from
                module.FromParams = type("FromParams", (), {})
                module.Registrable = type("Registrable", (), {})
            return module
        module = mock.MagicMock(name=spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def allennlp_elmo():
    """(allennlp.modules.elmo, the ELMoCharacterMapper class, remove_sentence_boundaries)."""
    sys.meta_path.insert(0, _Finder(os.environ.get("ALLENNLP_SRC", "/tmp/allennlp_src")))
    from allennlp.data.token_indexers.elmo_indexer import ELMoCharacterMapper
    from allennlp.modules import elmo, elmo_lstm
    from allennlp.nn.util import remove_sentence_boundaries

    for module in (elmo, elmo_lstm):  # local paths, not URLs
        module.cached_path = lambda path: path
    return elmo, ELMoCharacterMapper, remove_sentence_boundaries


def main() -> None:
    import numpy as np
    import torch

    elmo, mapper, remove_boundaries = allennlp_elmo()
    FOLDER.mkdir(parents=True, exist_ok=True)
    options, weights = FOLDER / "options.json", FOLDER / "weights.hdf5"
    options.write_text(json.dumps(OPTIONS, indent=2) + "\n")
    write_weights(weights, np.random.default_rng(20261201))

    longest = max(len(s) for s in SENTENCES)
    chars = np.zeros((len(SENTENCES), longest, 50), np.int64)  # batch_to_ids' zero padding
    for b, words in enumerate(SENTENCES):
        for t, word in enumerate(words):
            chars[b, t] = mapper().convert_word_to_char_ids(word)
    bilm = elmo._ElmoBiLm(str(options), str(weights), requires_grad=False)
    bilm.eval()
    with torch.no_grad():
        out = bilm(torch.tensor(chars))
        layers = [remove_boundaries(a, out["mask"]) for a in out["activations"]]
    golden = {
        "char_ids": chars.astype(np.int32),
        "mask": layers[0][1].numpy().astype(np.int32),
        "layers": np.stack([a.numpy() for a, _ in layers]).astype(np.float32),  # (L+1, B, S, 2P)
        "sentences": np.asarray(json.dumps(SENTENCES, ensure_ascii=False)),
    }
    np.savez_compressed(FOLDER / "golden.npz", **golden)
    spread = float(np.abs(golden["layers"]).max())
    print(f"wrote {FOLDER}: layers {golden['layers'].shape}, largest |activation| {spread:.3f}")


if __name__ == "__main__":
    main()
