"""XLNet fine-tuning inputs for run_classifier.py (the path it takes when --bert_config_file is an
XLNet config): the tokenizer the XLNet was pretrained with, and its examples packed as the
released XLNet classifier packs them (modeling/xlnet.pack_classifier_ids: `a <sep> b <sep>
<cls>`, left padded; a multiple-choice example as one such sequence per choice). The model is
modeling/xlnet.XLNetClassifier; training, dev scoring, the best checkpoint and predictions are
run_classifier's BERT path, unchanged.

The tokenizer is the one the XLNet was pretrained with: the SentencePiece model of a published
XLNet (spiece.model; a converted Hugging Face folder holds it), or the vocabulary of
run_pretraining's XLNet blocks (create_lm_data.py): a byte-level BPE folder (encoder.json +
vocab.bpe, or the encoder.json itself) or a WordPiece vocab.txt. <sep> and <cls> are the
vocabulary's own `<sep>` / `<cls>` (XLNet's SentencePiece names) or `[SEP]` / `[CLS]` when it
holds them; a BPE vocabulary with neither uses its
`<|endoftext|>` for both, the document boundary pretraining learned (as training/gpt_finetuning
does for GPT-1's delimiters). <cls> stays told apart by its own segment id and its place last.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from data_prep import bpe, glue, spiece, tokenization
from data_prep.errors import input_error
from modeling import xlnet
from training.gpt_finetuning import load_bpe

SPECIALS = {"sep": ("<sep>", "[SEP]"), "cls": ("<cls>", "[CLS]")}
# The order of pack_classifier_ids' lists.
FEATURES = ("input_ids", "input_mask", "segment_ids")


class XLNetTextEncoder:
    """Text -> XLNet classifier features (see the module docstring).

    vocab_file: a SentencePiece model (a `.model` file, or a folder holding spiece.model, as
    XLNet's release, Hugging Face's folders and convert_checkpoint.py's output have: XLNet's own
    tokenization, data_prep/spiece.py), a BPE folder / encoder.json, or a WordPiece vocab.txt.
    do_lower_case: None is the vocabulary's own default, lower case for WordPiece, cased for
    SentencePiece (XLNet's released models are cased); byte-level BPE is always cased. Raises
    InputError for a missing file.
    encode(text) -> list of ids; sep_id, cls_id, vocab_size. For run_squad: `tokenizer`, the
    token-level tokenizer (the run scripts' interface: tokenize, tokenize_word,
    convert_tokens_to_ids, detokenize, do_lower_case), and `packing`, glue.xlnet_packing with the
    vocabulary's <sep> and <cls>.
    """

    def __init__(self, vocab_file: str, do_lower_case: bool | None = None):
        path = Path(vocab_file)
        if model := spiece.model_file(vocab_file):
            self.tokenizer = spiece.SentencePieceTokenizer(model, bool(do_lower_case))
        elif path.is_dir() or path.suffix == ".json":
            self.tokenizer = bpe.RobertaTokenizer(load_bpe(vocab_file))  # cased byte-level BPE
        else:
            lower = True if do_lower_case is None else do_lower_case
            self.tokenizer = tokenization.FullTokenizer(vocab_file, lower)
        vocab = self.tokenizer.vocab
        fallback = bpe.GPT2_END_OF_TEXT if bpe.GPT2_END_OF_TEXT in vocab else None
        found = {
            role: next((n for n in names if n in vocab), fallback)
            for role, names in SPECIALS.items()
        }
        if None in found.values():
            raise input_error(
                vocab_file,
                f"{SPECIALS['sep']}, {SPECIALS['cls']} or {bpe.GPT2_END_OF_TEXT!r} tokens",
                "none of them",
            )
        self.sep_id, self.cls_id = vocab[found["sep"]], vocab[found["cls"]]
        self.vocab_size = len(vocab)
        unk = next((n for n in ("<unk>", tokenization.UNK_TOKEN) if n in vocab), found["sep"])
        self.packing = glue.xlnet_packing(found["sep"], found["cls"], unk)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.convert_tokens_to_ids(self.tokenizer.tokenize(text))

    def encode_examples(
        self, examples: Sequence[glue.Example], task: glue.TaskSpec, max_seq_length: int
    ) -> glue.Encoded:
        """glue.encode_examples' features (int32 (N, S) input_ids, input_mask, segment_ids and
        label_ids) in XLNet's layout; (N, C, S) for a multiple-choice task, choice i being
        `context <sep> text_b + " " + ending_i <sep> <cls>` (as glue.encode_examples pairs them)."""
        n, c = len(examples), task.num_choices
        cols = {k: np.zeros((n, c or 1, max_seq_length), np.int32) for k in FEATURES}
        labels = np.zeros((n,), np.float32 if task.kind == glue.REGRESSION else np.int32)
        truncated = []
        for i, ex in enumerate(examples):
            a = self.encode(ex.text_a)
            seconds = [self.encode(b) if b is not None else None for b in glue.second_texts(ex, c)]
            cut = False
            for j, b in enumerate(seconds):
                *row, was_cut = xlnet.pack_classifier_ids(
                    a, b, max_seq_length, self.sep_id, self.cls_id
                )
                cut |= was_cut
                for key, values in zip(FEATURES, row):
                    cols[key][i, j] = values
            if cut:
                truncated.append(ex.guid)
            labels[i] = glue.label_id(task, ex.label)
        if not c:
            cols = {k: v[:, 0] for k, v in cols.items()}  # (N, 1, S) -> (N, S)
        return glue.Encoded({**cols, "label_ids": labels}, truncated)


def is_config_file(path) -> bool:
    """Whether a run script's --bert_config_file is an XLNet config (its released names).
    Raises InputError naming a file that is no JSON object."""
    from modeling import bert

    return xlnet.is_xlnet_config(bert.read_config_json(path, "a model config JSON file"))


def load_tokenizer(config_file, vocab_file, do_lower_case: bool, lower_case_given: bool):
    """(tokenizer, packing, is_xlnet) of a run script's --vocab_file for its --bert_config_file:
    an XLNet config's own vocabulary (XLNetTextEncoder's token-level tokenizer, cased unless
    --do_lower_case was given, and glue.xlnet_packing), else glue.load_tokenizer's (WordPiece, a
    RoBERTa's BPE folder, an ALBERT's spiece.model). Raises InputError naming the file."""
    if is_config_file(config_file):
        encoder = XLNetTextEncoder(vocab_file, do_lower_case if lower_case_given else None)
        return encoder.tokenizer, encoder.packing, True
    return (*glue.load_tokenizer(vocab_file, do_lower_case, lower_case_given), False)


def load_config(path, vocab_size: int) -> xlnet.XLNetConfig:
    """The XLNet config, checked to hold the tokenizer's ids (InputError naming the file)."""
    config = xlnet.XLNetConfig.from_json_file(path)
    if vocab_size > config.n_token:
        raise input_error(
            str(path), f"n_token of at least the vocabulary's {vocab_size}", f"{config.n_token}"
        )
    return config
