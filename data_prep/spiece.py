"""SentencePiece tokenization as XLNet's and ALBERT's released code do it (prepro_utils.py of
zihangdai/xlnet; google-research/albert's tokenization.py does the same), for the spiece.model
that their checkpoints ship (Hugging Face's folders too).

`preprocess_text` first: whitespace runs collapsed to one space and the ends stripped, `` and ''
made ", accents removed (NFKD, combining marks dropped) unless keep_accents, lower case when
asked (XLNet's released models are cased, ALBERT's lower-cased). Then the `sentencepiece`
library's pieces, with the original's one rule on top: a piece that ends in a comma after a
digit ("1,") is split into the number's own pieces and the comma, so "1,000" does not depend on
whether the vocabulary happens to hold "1,". Ids are the model's piece ids.

The library (Google's reference implementation, a keras-hub dependency) does the segmentation
and its model's own normalisation; only the original's wrapping around it is written here.
T5's tokenizer has no such wrapping: SentencePieceTokenizer(preprocess=False) gives the
library's own pieces of the text as it is (Hugging Face's T5Tokenizer, without its </s>).
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

from data_prep.errors import input_error

SPIECE_UNDERLINE = "\u2581"  # SentencePiece's word-start marker


def preprocess_text(
    text: str, lower: bool = False, remove_space: bool = True, keep_accents: bool = False
) -> str:
    """The original's preprocess_text (see the module docstring)."""
    out = " ".join(text.strip().split()) if remove_space else text
    out = out.replace("``", '"').replace("''", '"')
    if not keep_accents:
        out = "".join(c for c in unicodedata.normalize("NFKD", out) if not unicodedata.combining(c))
    return out.lower() if lower else out


def model_file(vocab_file) -> Path | None:
    """The SentencePiece model a --vocab_file names: a `.model` file, or a folder holding
    spiece.model (a release's, Hugging Face's, convert_checkpoint.py's output); else None."""
    path = Path(vocab_file)
    if path.is_dir() and (path / "spiece.model").is_file():
        return path / "spiece.model"
    return path if path.suffix == ".model" else None


class SentencePieceTokenizer:
    """XLNet's and ALBERT's tokenization over a SentencePiece model file.

    path: the spiece.model. Raises InputError naming it when it is missing or not a model.
    encode(text) -> list of piece ids; pieces(text) -> the pieces; vocab: piece -> id. The run
    scripts' tokenizer interface too (tokenization.FullTokenizer's): tokenize (= pieces),
    tokenize_word (a word of pre-split text: SentencePiece splits at spaces, so its pieces are
    the same as within the text), convert_tokens_to_ids, convert_ids_to_tokens, detokenize and
    do_lower_case.
    """

    def __init__(
        self, path: str | os.PathLike, do_lower_case: bool = False, preprocess: bool = True
    ):
        import sentencepiece

        self.path, self.do_lower_case, self.preprocess = str(path), do_lower_case, preprocess
        if not os.path.isfile(path):
            raise input_error(
                self.path, "a SentencePiece model file (spiece.model)", "no such file"
            )
        self.model = sentencepiece.SentencePieceProcessor()
        try:
            self.model.Load(self.path)
        except (OSError, RuntimeError) as e:
            raise input_error(self.path, "a SentencePiece model file", str(e).strip()) from None
        self.vocab = {self.model.IdToPiece(i): i for i in range(self.model.GetPieceSize())}

    def pieces(self, text: str) -> list[str]:
        if not self.preprocess:  # T5's: the library's pieces of the text as it is
            return self.model.EncodeAsPieces(text.lower() if self.do_lower_case else text)
        text = preprocess_text(text, lower=self.do_lower_case)
        out = []
        for piece in self.model.EncodeAsPieces(text):
            if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
                # The number without its comma, as its own pieces; no word-start marker where
                # the piece had none.
                parts = self.model.EncodeAsPieces(piece[:-1].replace(SPIECE_UNDERLINE, ""))
                if piece[0] != SPIECE_UNDERLINE and parts and parts[0][0] == SPIECE_UNDERLINE:
                    parts[0] = parts[0][1:]
                    if not parts[0]:
                        parts = parts[1:]
                out += [*parts, ","]
            else:
                out.append(piece)
        return out

    def encode(self, text: str) -> list[int]:
        return [self.model.PieceToId(p) for p in self.pieces(text)]

    tokenize = pieces
    tokenize_word = pieces

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self.model.PieceToId(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.model.IdToPiece(int(i)) for i in ids]

    def decode(self, ids: Iterable[int]) -> str:
        """The library's text of piece ids (control pieces such as </s> decode to nothing, ids
        beyond the model's pieces, which a model's larger embedding table can produce, are
        dropped)."""
        size = self.model.GetPieceSize()
        return self.model.DecodeIds([int(i) for i in ids if 0 <= int(i) < size])

    @staticmethod
    def detokenize(tokens: Sequence[str]) -> str:
        """The text of pieces (a span's, run_squad's answers), one space between words:
        ["▁New", "▁Yor", "k"] -> "New York"."""
        return " ".join("".join(tokens).replace(SPIECE_UNDERLINE, " ").split())
