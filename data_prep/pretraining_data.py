"""BERT pre-training instances: sentence pairs for next sentence prediction, masked for MLM.

The algorithm is the original google-research/bert `create_pretraining_data.py` (Devlin et al.
2018, section 3.1 and Appendix A), re-implemented on token ids:

  read_documents            text files -> documents (lists of sentences of token ids)
  create_training_instances dupe_factor passes over the shuffled documents, then a global shuffle
  create_instances_from_document
                            one document -> [CLS] A [SEP] B [SEP] pairs, B the actual next
                            sentences or a random other document's (is_random_next)
  truncate_seq_pair         trims the longer side, randomly at the front or the back
  create_masked_lm_predictions
                            80% [MASK] / 10% random token / 10% unchanged, optionally whole words
                            (n-gram and SpanBERT span masking: data_prep/masking.py)
  write_instances           round-robin TFRecord shards with the original feature names

The sentence-level objective is a choice (`sentence_objective`):
  "nsp"   BERT's next sentence prediction, as above (the default; identical to the original).
  "sop"   ALBERT's sentence-order prediction (Lan et al. 2020, sec. 4.2): A and B are two
          consecutive segments of one document, swapped with probability 0.5; label 1 = swapped
          (stored as `next_sentence_labels`, as ALBERT's own code did).
  "none"  no pairs: `[CLS] sentences [SEP]`, segment 0 only, label 0 (RoBERTa, Liu et al. 2019,
          sec. 4.2): DOC-SENTENCES packing, or FULL-SENTENCES (`full_sentences`) that runs on into
          the next document after an extra [SEP].
With `static_masking=False` instances are left unmasked, for dynamic masking at training time
(data_prep/masking.mask_dynamic); they are written without the masked_lm_* features.

Every random choice comes from one `random.Random`, drawn in the original's order, so the same seed
gives the same instances (and the same bytes on disk). Working on int ids rather than token strings
and keeping ids in `array('i')` is what makes this faster and several times smaller in memory than
the original; neither changes a single output value.

Two deliberate differences from the original, both where it was wrong rather than where it was a
choice: a random next segment is always drawn from a *different* document (the original gave up
after 10 draws and silently used the same one, with label "random"), and the end of an input file
also ends a document (the original joined the last document of one file to the first of the next
when a file did not end in a blank line).
"""

from __future__ import annotations

import dataclasses
import os
import random
import uuid
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence

from absl import logging

from data_prep.errors import input_error
from data_prep.tokenization import read_utf8_lines

# TensorFlow (and data_prep.masking / data_prep.features, which import it) is imported only where
# used: the worker processes of data_prep/pretraining_shards.py import this module to pair
# sentences and would otherwise each pay seconds and hundreds of MB for an import they never use.

# Lines tokenized per call of the bulk tokenizer: large enough to amortize the per-call graph
# overhead, small enough to keep the raw text of only this many lines in memory.
_TOKENIZE_CHUNK_LINES = 4096

Document = list[array]  # sentences, each an array('i') of token ids

SENTENCE_OBJECTIVES = ("nsp", "sop", "none")
# The same tuple as data_prep.masking.STATIC_SCHEMES (a test checks), spelled out so that importing
# this module does not import TensorFlow.
MASKING_SCHEMES = ("token", "whole_word", "ngram", "span")


@dataclasses.dataclass(frozen=True, slots=True)
class TrainingInstance:
    """One pre-training example before padding.

    Attributes:
      input_ids: ids of `[CLS] A [SEP] B [SEP]` (or `[CLS] tokens [SEP]` without a sentence
        objective) after masking, array('i') of length <= S.
      segment_ids: 0 for `[CLS] A [SEP]`, 1 for `B [SEP]`; bytes of the same length (one byte per
        position keeps a million instances in memory cheaply; iterating gives ints).
      is_random_next: the sentence label, written as `next_sentence_labels`: NSP, True when B
        comes from another document; SOP, True when A and B were swapped; always False for
        "none".
      masked_lm_positions: sorted positions of the predictions, array('i') of length <= P;
        None when the instance is left unmasked for dynamic masking.
      masked_lm_ids: the original ids at those positions, array('i'), or None.
      masked_lm_span_left, masked_lm_span_right: with span masking, each prediction's span
        boundary positions s - 1 and e + 1 (SpanBERT sec. 3.2); None otherwise.
    """

    input_ids: array
    segment_ids: bytes
    is_random_next: bool
    masked_lm_positions: array | None
    masked_lm_ids: array | None
    masked_lm_span_left: array | None = None
    masked_lm_span_right: array | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class MaskingVocab:
    """What instance creation needs from the vocabulary, as ids.

    Attributes:
      cls_id, sep_id, mask_id: ids of `[CLS]`, `[SEP]` and `[MASK]`.
      random_ids: the ids a random replacement is drawn from, in vocabulary-file order: the whole
        vocabulary, special tokens included, as the original drew from `vocab.keys()`.
      is_continuation: bytes indexed by id, 1 for a piece that continues the word before it
        (whole-word and n-gram masking): WordPiece's `##` pieces, or a SentencePiece model's
        pieces that spiece_word_start says begin no word.
    """

    cls_id: int
    sep_id: int
    mask_id: int
    random_ids: tuple[int, ...]
    is_continuation: bytes

    @classmethod
    def from_vocab(
        cls, vocab: dict[str, int], where: str = "vocabulary", sentencepiece: bool = False
    ) -> MaskingVocab:
        """Builds it from a token -> id dict (`load_vocab` / `FullTokenizer.vocab`, or a
        SentencePiece model's pieces with sentencepiece=True).

        Raises InputError naming `where` when `[CLS]`, `[SEP]` or `[MASK]` is missing.
        """
        missing = [t for t in ("[CLS]", "[SEP]", "[MASK]") if t not in vocab]
        if missing:
            raise input_error(where, "the tokens [CLS], [SEP] and [MASK]", f"no {missing}")
        specials = {vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"]}
        continuation = bytearray(max(vocab.values()) + 1)
        for token, token_id in vocab.items():
            if sentencepiece:
                continues = token_id not in specials and not spiece_word_start(token)
            else:
                continues = token.startswith("##")
            if continues:
                continuation[token_id] = 1
        return cls(
            cls_id=vocab["[CLS]"],
            sep_id=vocab["[SEP]"],
            mask_id=vocab["[MASK]"],
            random_ids=tuple(vocab.values()),
            is_continuation=bytes(continuation),
        )


# ALBERT's create_pretraining_data.py (`_is_start_piece`) for a SentencePiece vocabulary: a piece
# begins a word when it begins with the model's word boundary or with "<" (a control piece), or
# is one of these punctuation characters alone.
SPIECE_WORD_START_PUNCTUATION = frozenset('!"#$%&()*+,-./:;?@[\\]^_`{|}~')


def spiece_word_start(piece: str) -> bool:
    from data_prep.spiece import SPIECE_UNDERLINE

    return piece.startswith((SPIECE_UNDERLINE, "<")) or piece in SPIECE_WORD_START_PUNCTUATION


def vocab_tokenizer(vocab_file, do_lower_case: bool):
    """create_pretraining_data's and run_pretraining's --vocab_file -> (make_tokenizer, vocab,
    MaskingVocab). A WordPiece vocab.txt: tokenization.FullTokenizer, `##` pieces continue a
    word. A SentencePiece model (a `.model` file, or a folder holding spiece.model: an ALBERT's):
    spiece.SentencePieceTokenizer (ALBERT's preprocessing; lower-cased with do_lower_case), its
    pieces continuing a word unless spiece_word_start. make_tokenizer: a picklable callable of
    no arguments making the tokenizer, once per worker process."""
    import functools

    from data_prep import spiece
    from data_prep.tokenization import FullTokenizer, load_vocab

    if model := spiece.model_file(vocab_file):
        make = functools.partial(spiece.SentencePieceTokenizer, str(model), do_lower_case)
        vocab = make().vocab
    else:
        vocab = load_vocab(vocab_file)
        make = functools.partial(FullTokenizer.from_vocab, vocab, do_lower_case=do_lower_case)
    where = str(model or vocab_file)
    return make, vocab, MaskingVocab.from_vocab(vocab, where, sentencepiece=bool(model))


# --------------------------------------------------------------------------------------------
# Reading


def _tokenize_lines(tokenizer, lines: list[str]) -> list[list[int]]:
    # The bulk in-graph path tokenizes a whole chunk in one call; a FullTokenizer (or any object
    # with tokenize / convert_tokens_to_ids) gives the same ids one line at a time.
    if hasattr(tokenizer, "batch_tokenize_ids"):
        return tokenizer.batch_tokenize_ids(lines)
    return [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(line)) for line in lines]


def _line_ids(path: str, tokenizer) -> Iterator[list[int] | None]:
    """Yields the ids of each non-blank line of `path` and None for each blank one, in order."""
    pending: list[str] = []
    blank: list[bool] = []  # one entry per line, so blank lines can be replayed among the ids
    for _, text in read_utf8_lines(path):
        text = text.strip()
        blank.append(not text)
        if text:
            pending.append(text)
            if len(pending) >= _TOKENIZE_CHUNK_LINES:
                yield from _replay(blank, _tokenize_lines(tokenizer, pending))
                pending, blank = [], []
    yield from _replay(blank, _tokenize_lines(tokenizer, pending) if pending else [])


def _replay(blank: list[bool], ids_per_line: list[list[int]]) -> Iterator[list[int] | None]:
    ids = iter(ids_per_line)
    for is_blank in blank:
        yield None if is_blank else next(ids)


def read_documents(
    input_files: Sequence[str], tokenizer, sentence_objective: str = "nsp"
) -> list[Document]:
    """Reads one-sentence-per-line text with blank lines between documents, as token ids.

    The original format: each non-blank line is a sentence (NSP splits only at line ends), a blank
    or whitespace-only line ends a document, and so does the end of each file. Lines that tokenize
    to nothing are dropped, as are empty documents.

    Args:
      input_files: paths of UTF-8 text files.
      tokenizer: an object with `batch_tokenize_ids(lines) -> list[list[int]]` (the fast bulk path)
        or with `tokenize(text)` and `convert_tokens_to_ids(tokens)`.
      sentence_objective: what the corpus must allow: "nsp" needs two documents and a
        multi-sentence one, "sop" a multi-sentence document, "none" any text.

    Returns:
      Documents in file order, each a list of sentences, each an array('i') of ids.

    Raises:
      InputError: naming the file (and line) for bytes that are not UTF-8, a corpus with no text,
        or one the sentence objective cannot use: a single document (NSP draws a random B from
        another document) or only single-sentence documents (NSP and SOP need sentence pairs).
    """
    if sentence_objective not in SENTENCE_OBJECTIVES:
        raise ValueError(
            f"sentence_objective: expected one of {SENTENCE_OBJECTIVES}, found "
            f"{sentence_objective!r}"
        )
    documents: list[Document] = []
    for path in input_files:
        current: Document = []
        for ids in _line_ids(path, tokenizer):
            if ids is None:
                if current:
                    documents.append(current)
                current = []
            elif ids:
                current.append(array("i", ids))
        if current:  # the end of a file ends its last document
            documents.append(current)
    check_documents(documents, ", ".join(input_files), sentence_objective)
    return documents


def check_documents(documents: Sequence[Document], names: str, sentence_objective: str) -> None:
    """Refuses documents the sentence objective cannot use (see read_documents), naming `names`
    (files, or a file and line range) in the InputError; warns about single-sentence documents."""
    if not documents:
        raise input_error(
            names, "sentences, one per line, with a blank line between documents", "no text"
        )
    if sentence_objective == "none":
        return
    single = sum(1 for d in documents if len(d) == 1)
    if single == len(documents):
        what = {
            "nsp": "next sentence prediction pairs",
            "sop": "sentence-order prediction (--sentence_objective=sop) swaps",
        }[sentence_objective]
        raise input_error(
            names,
            f"at least one document with two or more sentences ({what} consecutive lines of a "
            "document; documents are separated by blank lines)",
            f"{len(documents)} document(s) of one sentence each; for a corpus without sentence "
            "pairs use --sentence_objective=none",
        )
    if len(documents) < 2 and sentence_objective == "nsp":
        raise input_error(
            names,
            "at least two documents separated by a blank line (a random next sentence must come "
            "from another document)",
            "one document",
        )
    if single:
        logging.warning(
            "%d of %d documents have a single sentence; they only make random-next pairs "
            "(NSP) or pairs split inside the sentence (SOP). "
            "Is there a blank line after every sentence instead of only between documents?",
            single,
            len(documents),
        )


# --------------------------------------------------------------------------------------------
# Instance creation (pure, one rng)


def create_training_instances(
    documents: Sequence[Document],
    vocab: dict[str, int] | MaskingVocab,
    max_seq_length: int,
    dupe_factor: int,
    short_seq_prob: float,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    rng: random.Random,
    do_whole_word_mask: bool = False,
    progress: Callable[[int], None] | None = None,
    sentence_objective: str = "nsp",
    masking_scheme: str = "token",
    static_masking: bool = True,
    full_sentences: bool = False,
) -> list[TrainingInstance]:
    """Makes `dupe_factor` passes over the documents, each with fresh pairs and masks.

    As the original: the documents are shuffled once with `rng`, then every pass visits them in
    that order, and all instances of all passes are shuffled together at the end, so a shard holds
    no run of instances from one document.

    Args:
      documents: lists of sentences of ids, as from `read_documents`; at least two. Not modified.
      vocab: token -> id dict, or a MaskingVocab.
      max_seq_length: S, the length of `[CLS] A [SEP] B [SEP]` at most; >= 5.
      dupe_factor: number of passes over the corpus (different pairs and masks each time).
      short_seq_prob: probability of a random shorter target length for a document's instances.
      masked_lm_prob: fraction of tokens to predict.
      max_predictions_per_seq: P, cap on predictions per instance.
      rng: the only source of randomness.
      do_whole_word_mask: mask all pieces of a word or none (the same as
        masking_scheme="whole_word"; "ngram" and "span" always mask whole words).
      progress: called with the number of instances made after each document (after each pass
        without a sentence objective).
      sentence_objective: "nsp", "sop" or "none" (see the module docstring).
      masking_scheme: "token" (BERT), "whole_word", "ngram" (ALBERT) or "span" (SpanBERT).
      static_masking: False leaves instances unmasked (masked_lm_positions None).
      full_sentences: with "none", pack across document boundaries (RoBERTa's FULL-SENTENCES);
        otherwise a sequence never leaves its document (DOC-SENTENCES).
    """
    if sentence_objective not in SENTENCE_OBJECTIVES:
        raise ValueError(
            f"sentence_objective: expected one of {SENTENCE_OBJECTIVES}, found "
            f"{sentence_objective!r}"
        )
    if masking_scheme not in MASKING_SCHEMES:
        raise ValueError(
            f"masking_scheme: expected one of {MASKING_SCHEMES}, found {masking_scheme!r}"
        )
    if full_sentences and sentence_objective != "none":
        raise ValueError(
            "full_sentences packs one segment per sequence, so it needs sentence_objective "
            f"'none', found {sentence_objective!r}"
        )
    if len(documents) < 2 and sentence_objective == "nsp":
        raise ValueError(
            f"need at least two documents for random next sentences, got {len(documents)}"
        )
    if max_seq_length < 5:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for A and B (need >= 5)")
    mvocab = vocab if isinstance(vocab, MaskingVocab) else MaskingVocab.from_vocab(vocab)
    if do_whole_word_mask and masking_scheme == "token":
        masking_scheme = "whole_word"
    masker = _Masker(
        masked_lm_prob, max_predictions_per_seq, mvocab, rng, masking_scheme, static_masking
    )
    documents = list(documents)
    rng.shuffle(documents)
    instances: list[TrainingInstance] = []
    if sentence_objective == "none":
        for _ in range(dupe_factor):
            # A fresh document order per pass, so passes differ in more than their masks.
            order = list(documents)
            rng.shuffle(order)
            made = [
                masker([mvocab.cls_id, *tokens, mvocab.sep_id], None, False)
                for tokens in pack_sentences(
                    order, max_seq_length - 2, full_sentences, mvocab.sep_id
                )
            ]
            instances.extend(made)
            if progress is not None:
                progress(len(made))
        rng.shuffle(instances)
        return instances
    for _ in range(dupe_factor):
        for document_index in range(len(documents)):
            made = create_instances_from_document(
                documents,
                document_index,
                max_seq_length,
                short_seq_prob,
                masked_lm_prob,
                max_predictions_per_seq,
                mvocab,
                rng,
                sentence_objective=sentence_objective,
                masker=masker,
            )
            instances.extend(made)
            if progress is not None:
                progress(len(made))
    rng.shuffle(instances)
    return instances


def create_instances_from_document(
    documents: Sequence[Document],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    vocab: MaskingVocab,
    rng: random.Random,
    do_whole_word_mask: bool = False,
    sentence_objective: str = "nsp",
    masker: _Masker | None = None,
) -> list[TrainingInstance]:
    """Turns one document into sentence-pair instances (BERT section 3.1, "Task #2: NSP").

    Sentences are accumulated into a chunk until it reaches the target length; a random number of
    leading sentences form A. With probability 0.5 (always when the chunk is one sentence) B is
    taken from a random other document from a random sentence on, and the chunk's unused sentences
    are put back for the next instance; otherwise B is the rest of the chunk.

    With sentence_objective "sop" B is always the rest of the chunk (see sentence_order_pair).
    `masker` (made by create_training_instances) overrides the masking arguments.
    """
    if masker is None:
        scheme = "whole_word" if do_whole_word_mask else "token"
        masker = _Masker(masked_lm_prob, max_predictions_per_seq, vocab, rng, scheme, True)
    document = documents[document_index]
    max_num_tokens = max_seq_length - 3  # room for [CLS], [SEP], [SEP]

    # Full-length sequences waste no padding, but fine-tuning inputs are often short, so 10% of
    # the time (short_seq_prob) a shorter target narrows that mismatch. The target is a soft goal;
    # max_num_tokens is the hard limit.
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances: list[TrainingInstance] = []
    chunk: list[array] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if (i == len(document) - 1 or chunk_length >= target_seq_length) and (
            sentence_objective == "sop"
        ):
            tokens_a, tokens_b, swapped = sentence_order_pair(chunk, rng)
            if tokens_a:  # else a one-token chunk: nothing to order
                instances.append(
                    _pair_instance(tokens_a, tokens_b, swapped, max_num_tokens, vocab, rng, masker)
                )
            chunk = []
            chunk_length = 0
        elif i == len(document) - 1 or chunk_length >= target_seq_length:
            # Split at sentence boundaries, not at an arbitrary token: a mid-sentence cut would
            # make "is B the real continuation?" too easy to answer.
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a: list[int] = []
            for sentence in chunk[:a_end]:
                tokens_a.extend(sentence)

            tokens_b: list[int] = []
            if len(chunk) == 1 or rng.random() < 0.5:
                is_random_next = True
                target_b_length = target_seq_length - len(tokens_a)
                # Drawn until different. The original stopped after 10 draws and then used the
                # same document with the "random" label; whenever it found another document
                # within 10 draws this consumes the same random numbers, so outputs agree.
                while True:
                    random_index = rng.randint(0, len(documents) - 1)
                    if random_index != document_index:
                        break
                random_document = documents[random_index]
                # Indexing, not a slice: a slice would copy the rest of a long document each time.
                for j in range(rng.randint(0, len(random_document) - 1), len(random_document)):
                    tokens_b.extend(random_document[j])
                    if len(tokens_b) >= target_b_length:
                        break
                # The sentences after A were not used: put them back so they start the next chunk.
                i -= len(chunk) - a_end
            else:
                is_random_next = False
                for sentence in chunk[a_end:]:
                    tokens_b.extend(sentence)

            instances.append(
                _pair_instance(
                    tokens_a, tokens_b, is_random_next, max_num_tokens, vocab, rng, masker
                )
            )
            chunk = []
            chunk_length = 0
        i += 1
    return instances


def _pair_instance(tokens_a, tokens_b, label, max_num_tokens, vocab, rng, masker):
    tokens_a, tokens_b = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
    input_ids = [vocab.cls_id, *tokens_a, vocab.sep_id, *tokens_b, vocab.sep_id]
    segment_ids = bytes(len(tokens_a) + 2) + b"\x01" * (len(tokens_b) + 1)
    return masker(input_ids, segment_ids, label)


def sentence_order_pair(
    chunk: Sequence[Sequence[int]], rng: random.Random
) -> tuple[list[int], list[int], bool]:
    """ALBERT's SOP pair from a chunk of consecutive sentences (Lan et al. 2020, sec. 4.2).

    A is a random number of leading sentences and B the rest, as for NSP; a chunk of one sentence
    is cut inside it at a random token, so A and B are still consecutive text of one document
    (ALBERT's code took B from a random other document there, which mixes topic prediction back
    into SOP). Then A and B are swapped with probability 0.5.

    Returns (tokens_a, tokens_b, swapped); empty lists for a one-token chunk.
    """
    if len(chunk) >= 2:
        a_end = rng.randint(1, len(chunk) - 1)
        tokens_a = [t for sentence in chunk[:a_end] for t in sentence]
        tokens_b = [t for sentence in chunk[a_end:] for t in sentence]
    else:
        sentence = chunk[0]
        if len(sentence) < 2:
            return [], [], False
        cut = rng.randint(1, len(sentence) - 1)
        tokens_a, tokens_b = list(sentence[:cut]), list(sentence[cut:])
    if rng.random() < 0.5:
        return tokens_b, tokens_a, True
    return tokens_a, tokens_b, False


def pack_sentences(
    documents: Sequence[Document], max_num_tokens: int, cross_documents: bool, sep_id: int
) -> list[list[int]]:
    """RoBERTa's DOC-SENTENCES / FULL-SENTENCES packing (Liu et al. 2019, sec. 4.2): contiguous
    whole sentences fill each sequence up to `max_num_tokens`; a sentence longer than that is cut
    into pieces of that length. With `cross_documents` a sequence runs on into the next document
    after an extra `sep_id` between the two; otherwise each document starts a new sequence.

    Deterministic (no rng): the caller orders the documents. Returns the token lists, without
    [CLS] and the final [SEP], each 1..max_num_tokens long.
    """
    sequences: list[list[int]] = []
    current: list[int] = []

    def flush():
        nonlocal current
        while current and current[-1] == sep_id and cross_documents:
            current.pop()  # a document separator that no sentence followed
        if current:
            sequences.append(current)
        current = []

    for document in documents:
        if current and cross_documents:
            if len(current) + 1 >= max_num_tokens:
                flush()
            else:
                current.append(sep_id)
        for sentence in document:
            for start in range(0, len(sentence), max_num_tokens):
                piece = sentence[start : start + max_num_tokens]
                if len(current) + len(piece) > max_num_tokens:
                    flush()
                current.extend(piece)
        if not cross_documents:
            flush()
    flush()
    return sequences


class _Masker:
    """Makes a TrainingInstance from unmasked ids with the run's masking settings."""

    def __init__(self, masked_lm_prob, max_predictions_per_seq, vocab, rng, scheme, static):
        self.masked_lm_prob = masked_lm_prob
        self.max_predictions_per_seq = max_predictions_per_seq
        self.vocab = vocab
        self.rng = rng
        self.scheme = scheme
        self.static = static

    def __call__(self, input_ids, segment_ids, label) -> TrainingInstance:
        if segment_ids is None:
            segment_ids = bytes(len(input_ids))
        if not self.static:
            return TrainingInstance(array("i", input_ids), segment_ids, label, None, None)
        args = (input_ids, self.masked_lm_prob, self.max_predictions_per_seq, self.vocab, self.rng)
        left = right = None
        if self.scheme in ("ngram", "span"):
            from data_prep import masking

            output_ids, positions, labels, left, right = masking.create_span_masked_lm_predictions(
                *args, self.scheme
            )
            if self.scheme == "span":
                left, right = array("i", left), array("i", right)
            else:
                left = right = None
        else:
            output_ids, positions, labels = create_masked_lm_predictions(
                *args, do_whole_word_mask=self.scheme == "whole_word"
            )
        return TrainingInstance(
            input_ids=array("i", output_ids),
            segment_ids=segment_ids,
            is_random_next=label,
            masked_lm_positions=array("i", positions),
            masked_lm_ids=array("i", labels),
            masked_lm_span_left=left,
            masked_lm_span_right=right,
        )


def truncate_seq_pair(
    tokens_a: Sequence[int], tokens_b: Sequence[int], max_num_tokens: int, rng: random.Random
) -> tuple[list[int], list[int]]:
    """Trims the pair to `max_num_tokens` in all, one token at a time from the longer side (B on a
    tie), from the front or the back with probability 0.5 each to avoid a positional bias.

    Returns new lists. Draws one `rng.random()` per removed token, as the original; the removals
    are counted first and sliced once, which gives the same result without O(n) deletes.
    """
    len_a, len_b = len(tokens_a), len(tokens_b)
    front_a = back_a = front_b = back_b = 0
    while len_a + len_b > max_num_tokens:
        from_front = rng.random() < 0.5
        if len_a > len_b:
            len_a -= 1
            front_a += from_front
            back_a += not from_front
        else:
            len_b -= 1
            front_b += from_front
            back_b += not from_front
    return (
        list(tokens_a[front_a : len(tokens_a) - back_a]),
        list(tokens_b[front_b : len(tokens_b) - back_b]),
    )


def create_masked_lm_predictions(
    input_ids: Sequence[int],
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    vocab: MaskingVocab,
    rng: random.Random,
    do_whole_word_mask: bool = False,
) -> tuple[list[int], list[int], list[int]]:
    """Chooses the positions to predict and corrupts them (BERT section 3.1, "Task #1: MLM").

    min(max_predictions_per_seq, max(1, round(len(input_ids) * masked_lm_prob))) positions are
    predicted, never [CLS] or [SEP]. With whole-word masking a word's `##` pieces form one
    candidate with it, and a word that would overshoot the budget is skipped, not split.

    Returns:
      (output_ids, masked_lm_positions, masked_lm_ids): the corrupted copy of input_ids, and the
      predicted positions in increasing order with their original ids.
    """
    cls_id, sep_id = vocab.cls_id, vocab.sep_id
    num_to_predict = min(
        max_predictions_per_seq, max(1, int(round(len(input_ids) * masked_lm_prob)))
    )
    if do_whole_word_mask:
        continuation = vocab.is_continuation
        candidates: list = []
        for i, token_id in enumerate(input_ids):
            if token_id == cls_id or token_id == sep_id:
                continue
            # As the original: a `##` piece joins the candidate before it, even when a [SEP]
            # lies between (B front-truncated mid-word), so outputs stay identical to it.
            if candidates and continuation[token_id]:
                candidates[-1].append(i)
            else:
                candidates.append([i])
        rng.shuffle(candidates)
        chosen: list[int] = []
        for word in candidates:
            if len(chosen) >= num_to_predict:
                break
            if len(chosen) + len(word) > num_to_predict:
                continue
            chosen.extend(word)
    else:
        candidates = [i for i, t in enumerate(input_ids) if t != cls_id and t != sep_id]
        # Shuffling single positions draws the same random numbers as the original's shuffle
        # of one-element lists, and taking the first num_to_predict is its loop.
        rng.shuffle(candidates)
        chosen = candidates[:num_to_predict]

    output_ids = list(input_ids)
    random_ids = vocab.random_ids
    for index in chosen:
        # BERT section 3.1 and Appendix A: of the chosen positions 80% become [MASK], 10% a random
        # token and 10% stay unchanged, so the model cannot rely on seeing [MASK] (which never
        # occurs at fine-tuning time) and must keep a representation of every input token.
        if rng.random() < 0.8:
            output_ids[index] = vocab.mask_id
        elif rng.random() < 0.5:
            pass  # keep the original token
        else:
            output_ids[index] = random_ids[rng.randint(0, len(random_ids) - 1)]
    positions = sorted(chosen)
    return output_ids, positions, [input_ids[p] for p in positions]


# --------------------------------------------------------------------------------------------
# Writing


def _printable(inv_vocab: dict[int, str], ids: Iterable[int]) -> str:
    return " ".join(inv_vocab.get(i, f"<id {i}>") for i in ids)


def _log_instance(instance: TrainingInstance, inv_vocab: dict[int, str]) -> None:
    logging.info("*** Example ***")
    logging.info("tokens: %s", _printable(inv_vocab, instance.input_ids))
    logging.info("segment_ids: %s", " ".join(str(s) for s in instance.segment_ids))
    logging.info("is_random_next: %s", instance.is_random_next)
    if instance.masked_lm_positions is None:
        logging.info("masked_lm_positions: (none: masked at training time)")
        return
    logging.info("masked_lm_positions: %s", " ".join(map(str, instance.masked_lm_positions)))
    logging.info("masked_lm_labels: %s", _printable(inv_vocab, instance.masked_lm_ids))
    if instance.masked_lm_span_left is not None:
        logging.info("masked_lm_span_left: %s", " ".join(map(str, instance.masked_lm_span_left)))
        logging.info("masked_lm_span_right: %s", " ".join(map(str, instance.masked_lm_span_right)))


def serialize_instance(
    instance: TrainingInstance, max_seq_length: int, max_predictions_per_seq: int
) -> bytes:
    """One padded tf.train.Example with the original features, serialized reproducibly (the
    feature map in sorted key order, see data_prep/features.py). An unmasked instance is written
    without the masked_lm_* features, a span-masked one with its span boundaries as well."""
    from data_prep.features import serialize_packed_example, serialize_pretraining_example

    if instance.masked_lm_positions is None:
        return serialize_packed_example(
            instance.input_ids,
            instance.segment_ids,
            int(instance.is_random_next),
            max_seq_length,
        )
    return serialize_pretraining_example(
        instance.input_ids,
        instance.segment_ids,
        instance.masked_lm_positions,
        instance.masked_lm_ids,
        int(instance.is_random_next),  # 1 = random next, the original's convention
        max_seq_length,
        max_predictions_per_seq,
        span_left=instance.masked_lm_span_left,
        span_right=instance.masked_lm_span_right,
    )


def write_instances(
    instances: Iterable[TrainingInstance],
    output_files: Sequence[str],
    max_seq_length: int,
    max_predictions_per_seq: int,
    vocab: dict[str, int],
    num_logged: int = 20,
) -> list[int]:
    """Writes instances round-robin over TFRecord shards, padded with the original features.

    Each shard is written under a temporary name in its own folder and renamed only after every
    shard was written and closed, so an interrupted or failed run leaves no file that looks
    complete; the temporary files are removed on failure.

    Args:
      instances: from `create_training_instances` (any iterable, e.g. wrapped in a progress bar).
      output_files: shard paths (local or any tf.io.gfile filesystem); distinct.
      max_seq_length, max_predictions_per_seq: S and P of the padded features.
      vocab: token -> id dict, used only to log the first instances as tokens.
      num_logged: how many instances to log at INFO, as the original's 20.

    Returns:
      The number of instances written to each shard, in `output_files` order.
    """
    import tensorflow as tf

    if not output_files:
        raise ValueError("no output files")
    if len(set(output_files)) != len(output_files):
        raise ValueError(f"output files repeat a path: {list(output_files)}")
    token = uuid.uuid4().hex[:8]
    temp_files = [f"{path}.incomplete-{os.getpid()}-{token}" for path in output_files]
    inv_vocab = {i: t for t, i in vocab.items()} if num_logged else {}
    counts = [0] * len(output_files)
    writers = []
    try:
        writers = [tf.io.TFRecordWriter(path) for path in temp_files]
        shard = 0
        for index, instance in enumerate(instances):
            writers[shard].write(
                serialize_instance(instance, max_seq_length, max_predictions_per_seq)
            )
            counts[shard] += 1
            shard = (shard + 1) % len(writers)
            if index < num_logged:
                _log_instance(instance, inv_vocab)
        for writer in writers:
            writer.close()
        for temp, path in zip(temp_files, output_files, strict=True):
            tf.io.gfile.rename(temp, path, overwrite=True)
    except BaseException:
        for writer in writers:
            writer.close()
        for temp in temp_files:
            if tf.io.gfile.exists(temp):
                tf.io.gfile.remove(temp)
        raise
    logging.info("Wrote %d instances to %d file(s): %s", sum(counts), len(counts), counts)
    return counts


__all__ = [
    "Document",
    "MASKING_SCHEMES",
    "MaskingVocab",
    "SENTENCE_OBJECTIVES",
    "TrainingInstance",
    "check_documents",
    "create_instances_from_document",
    "create_masked_lm_predictions",
    "create_training_instances",
    "pack_sentences",
    "read_documents",
    "sentence_order_pair",
    "serialize_instance",
    "truncate_seq_pair",
    "write_instances",
]
