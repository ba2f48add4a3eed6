"""SQuAD v1.1 / v2.0: reading the JSON, and the original run_squad's feature creation.

The steps and their rules are google-research/bert's run_squad.py, so features, spans and the
predictions made from them agree with the original:
  1. `read_squad_examples`: the context is split on whitespace into words, with a map from every
     character to its word; an answer's `answer_start` becomes a (start word, end word) span.
     Answers whose text is not found at that place are counted, warned about with the question
     id and skipped; a file that is not in SQuAD's schema raises an InputError naming the JSON
     path (`data[3].paragraphs[0].qas[2].answers[0].answer_start`).
  2. `convert_examples_to_features`: every word is WordPiece-tokenized (or byte-level BPE with a
     leading space, for a RoBERTa checkpoint: `<s> query </s></s> window </s>`, one segment
     type), the document is cut into windows of at most max_seq_length - len(query) - 3 tokens
     (4 for RoBERTa) that start every doc_stride tokens,
     each token remembers whether this window gives it the most context (`check_is_max_context`),
     and a training answer is narrowed to the sub-span whose WordPieces equal the answer's
     (`improve_answer_span`). Windows without the answer, and v2.0 impossible questions, point at
     [CLS] (position 0).
  3. `write_train_tfrecord` streams training features to a TFRecord, and prediction scores them
     chunk by chunk (training/squad_eval.stream_predictions): features are made one at a time by
     a generator, so memory does not grow with the file's number of windows.

Shapes: S max_seq_length.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
from collections.abc import Callable, Iterable, Iterator

from data_prep import glue
from data_prep.errors import InputError, input_error

_log = logging.getLogger(__name__)

# The original numbers features from here so ids never collide with example indexes.
FIRST_UNIQUE_ID = 1_000_000_000
# Mismatched answers are warned about one by one up to this many, then only counted.
MAX_WARNINGS = 20


@dataclasses.dataclass
class SquadExample:
    """One question over its whitespace-split context.

    start_position / end_position are word indexes into doc_tokens (inclusive), set for training
    examples with an answer; -1 for impossible ones; None when not training.
    """

    qas_id: str
    question_text: str
    doc_tokens: list[str]
    orig_answer_text: str = ""
    start_position: int | None = None
    end_position: int | None = None
    is_impossible: bool = False


@dataclasses.dataclass
class InputFeatures:
    """One window of one example, padded to S.

    tokens: the WordPieces of [CLS] query [SEP] window [SEP] (unpadded; XLNet's `query <sep>
      window <sep> <cls>`, glue.xlnet_packing).
    token_to_orig_map: position in tokens -> word index in the example's doc_tokens.
    token_is_max_context: position in tokens -> whether this window is the token's best context.
    input_ids, input_mask, segment_ids: int lists of length S.
    start_position, end_position: answer positions in tokens (null_index: no answer in this
      window), training only.
    null_index: the position of the token that stands for "no answer" ([CLS], 0; XLNet's <cls>
      after the window).
    """

    unique_id: int
    example_index: int
    doc_span_index: int
    tokens: list[str]
    token_to_orig_map: dict[int, int]
    token_is_max_context: dict[int, bool]
    input_ids: list[int]
    input_mask: list[int]
    segment_ids: list[int]
    start_position: int | None = None
    end_position: int | None = None
    is_impossible: bool = False
    null_index: int = 0


@dataclasses.dataclass
class ReadStats:
    """What `read_squad_examples` kept and skipped (training files)."""

    questions: int = 0
    kept: int = 0
    impossible: int = 0
    mismatched_answers: int = 0
    no_answer: int = 0
    empty_contexts: int = 0

    def summary(self) -> str:
        return (
            f"{self.questions} questions, {self.kept} kept ({self.impossible} impossible); "
            f"skipped {self.mismatched_answers} whose answer text does not match the context and "
            f"{self.no_answer} without an answer; {self.empty_contexts} empty contexts"
        )


# ---------------------------------------------------------------------------------------------
# Reading the JSON
# ---------------------------------------------------------------------------------------------


def is_whitespace(c: str) -> bool:
    """The original's whitespace: space, tab, CR, LF and the narrow no-break space U+202F."""
    return c in " \t\r\n" or ord(c) == 0x202F


def split_context(text: str) -> tuple[list[str], list[int]]:
    """Splits a context on whitespace (`is_whitespace`).

    Returns (doc_tokens, char_to_word_offset): the words, and for every character of `text` the
    index of the word it belongs to (a whitespace character maps to the word before it, -1 before
    the first word), as the original.
    """
    doc_tokens: list[str] = []
    char_to_word_offset: list[int] = []
    prev_is_whitespace = True
    for c in text:
        if is_whitespace(c):
            prev_is_whitespace = True
        else:
            if prev_is_whitespace:
                doc_tokens.append(c)
            else:
                doc_tokens[-1] += c
            prev_is_whitespace = False
        char_to_word_offset.append(len(doc_tokens) - 1)
    return doc_tokens, char_to_word_offset


def load_squad_json(path: str | os.PathLike) -> dict:
    """Reads a SQuAD file: strict UTF-8, then JSON; errors name the file and the place."""
    try:
        raw = open(path, "rb").read()
    except OSError as e:
        raise input_error(str(path), "a readable SQuAD JSON file", e.strerror or str(e)) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise input_error(
            f"{path}:{line}", "UTF-8 text", f"byte 0x{raw[e.start]:02x} at byte offset {e.start}"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise input_error(f"{path}:{e.lineno}:{e.colno}", "JSON", e.msg) from None
    except RecursionError:  # found by tests/test_fuzz_readers.py
        raise input_error(str(path), "SQuAD JSON", "JSON nested too deeply") from None
    _field(data, "data", list, str(path), "")
    return data


def _field(obj, key, kind, path: str, where: str, optional: bool = False):
    """obj[key] checked to be of `kind`; raises InputError naming `file: json.path`."""
    here = f"{where}.{key}" if where else key
    if not isinstance(obj, dict):
        raise input_error(f"{path}: {where or '(top level)'}", "a JSON object", type(obj).__name__)
    if key not in obj:
        if optional:
            return None
        raise input_error(f"{path}: {here}", _kind_name(kind), "nothing (missing)")
    value = obj[key]
    # bool is an int in Python; answer_start must not be true/false.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise input_error(f"{path}: {here}", _kind_name(kind), repr(value)[:80])
    return value


def _kind_name(kind) -> str:
    names = {list: "a list", str: "a string", int: "an integer", bool: "true or false"}
    return names.get(kind, f"a {getattr(kind, '__name__', kind)}")


def iter_questions(data: dict, path: str) -> Iterator[tuple[str, dict, str, dict]]:
    """Yields (paragraph JSON path, paragraph, qa JSON path, qa) with the schema checked."""
    for i, article in enumerate(data["data"]):
        for j, paragraph in enumerate(_field(article, "paragraphs", list, path, f"data[{i}]")):
            p_where = f"data[{i}].paragraphs[{j}]"
            _field(paragraph, "context", str, path, p_where)
            for k, qa in enumerate(_field(paragraph, "qas", list, path, p_where)):
                q_where = f"{p_where}.qas[{k}]"
                _field(qa, "id", str, path, q_where)
                _field(qa, "question", str, path, q_where)
                answers = _field(qa, "answers", list, path, q_where)
                for a, answer in enumerate(answers):
                    a_where = f"{q_where}.answers[{a}]"
                    _field(answer, "text", str, path, a_where)
                    _field(answer, "answer_start", int, path, a_where)
                _field(qa, "is_impossible", bool, path, q_where, optional=True)
                yield p_where, paragraph, q_where, qa


def read_squad_examples(
    path: str | os.PathLike,
    is_training: bool,
    version_2_with_negative: bool,
    data: dict | None = None,
) -> tuple[list[SquadExample], ReadStats]:
    """Reads a SQuAD v1.1 / v2.0 file into examples, as the original `read_squad_examples`.

    For training, a question's first answer is its span (the original requires exactly one and
    crashes otherwise; SQuAD train files have one). Answers whose whitespace-normalised text is
    not in the context words at answer_start, and v1.1 questions without answers, are counted,
    warned about with the question id and skipped. For prediction every question is kept, and
    a question id used twice is an error (predictions are keyed by id).
    `data`: the already loaded JSON (load_squad_json), to avoid reading the file twice.
    """
    path = str(path)
    data = load_squad_json(path) if data is None else data
    stats = ReadStats()
    examples: list[SquadExample] = []
    last_paragraph = None
    warned = 0
    first_seen: dict[str, str] = {}  # question id -> its JSON path

    def warn(msg, *args):
        nonlocal warned
        warned += 1
        if warned <= MAX_WARNINGS:
            _log.warning(msg, *args)
        elif warned == MAX_WARNINGS + 1:
            _log.warning("more skipped questions in %s: only counted from here on", path)

    for p_where, paragraph, q_where, qa in iter_questions(data, path):
        if paragraph is not last_paragraph:
            last_paragraph = paragraph
            doc_tokens, char_to_word_offset = split_context(paragraph["context"])
            if not doc_tokens:
                stats.empty_contexts += 1
                _log.warning("%s: %s.context is empty", path, p_where)
        stats.questions += 1
        qas_id = qa["id"]
        if not is_training:
            if qas_id in first_seen:
                raise input_error(
                    f"{path}: {q_where}.id",
                    "a question id used once (predictions are keyed by id)",
                    f"{qas_id!r}, already the id of {first_seen[qas_id]}",
                )
            first_seen[qas_id] = q_where
        is_impossible = bool(qa.get("is_impossible", False)) and version_2_with_negative
        example = SquadExample(qas_id, qa["question"], doc_tokens, is_impossible=is_impossible)
        if is_training:
            if is_impossible:
                example.start_position = example.end_position = -1
                stats.impossible += 1
            elif not qa["answers"]:
                stats.no_answer += 1
                warn(
                    "%s: %s (id %s) has no answer%s; skipped",
                    path,
                    q_where,
                    qas_id,
                    "" if version_2_with_negative else " (use --version_2_with_negative for v2.0)",
                )
                continue
            else:
                answer = qa["answers"][0]
                span = answer_word_span(
                    doc_tokens, char_to_word_offset, answer["text"], answer["answer_start"]
                )
                if span is None:
                    stats.mismatched_answers += 1
                    warn(
                        "%s: %s.answers[0] (id %s): text %r is not in the context at "
                        "answer_start %d; skipped",
                        path,
                        q_where,
                        qas_id,
                        answer["text"][:60],
                        answer["answer_start"],
                    )
                    continue
                example.orig_answer_text = answer["text"]
                example.start_position, example.end_position = span
        stats.kept += 1
        examples.append(example)
    return examples, stats


def answer_word_span(
    doc_tokens: list[str], char_to_word_offset: list[int], text: str, answer_start: int
) -> tuple[int, int] | None:
    """The (start word, end word) of an answer, or None when its text does not match.

    As the original: the words covering characters answer_start .. answer_start + len(text) - 1
    must contain the answer's whitespace-normalised text; this tolerates answers that cut a word
    ("Nieuwl" of "Nieuwland") and rejects answers at a wrong offset.
    """
    end_char = answer_start + len(text) - 1
    if not text or answer_start < 0 or end_char >= len(char_to_word_offset):
        return None
    start, end = char_to_word_offset[answer_start], char_to_word_offset[end_char]
    if start < 0 or end < start:
        return None
    actual = " ".join(doc_tokens[start : end + 1])
    cleaned = " ".join(text.split())
    if actual.find(cleaned) == -1:
        return None
    return start, end


# ---------------------------------------------------------------------------------------------
# Features
# ---------------------------------------------------------------------------------------------


def doc_spans(num_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> list[tuple[int, int]]:
    """The sliding windows (start, length) over a document of num_tokens WordPieces.

    Windows hold at most max_tokens_for_doc tokens and start doc_stride tokens apart; the last
    one ends at the document's end. An empty document still gets one (0, 0) window, so its
    questions get a (null) prediction.
    """
    if max_tokens_for_doc < 1:
        raise ValueError(f"no room for the document: max_tokens_for_doc={max_tokens_for_doc}")
    spans = []
    start = 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens_for_doc)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans or [(0, 0)]


def check_is_max_context(spans: list[tuple[int, int]], cur_span_index: int, position: int) -> bool:
    """Whether window cur_span_index is the best context of token `position`.

    The original's rule: the score of a window is min(left context, right context) + 0.01 *
    window length; the first window with the highest score wins. A token is predicted only
    from its best window, so overlapping windows never disagree about one token.
    """
    best_score, best_index = None, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, index
    return cur_span_index == best_index


def improve_answer_span(
    doc_tokens: list[str], start: int, end: int, tokenizer, orig_answer_text: str
) -> tuple[int, int]:
    """Narrows a WordPiece span to the sub-span whose pieces are the answer's own pieces.

    The answer "1895" in the word "(1895-1943)." is word-aligned to the whole word; its pieces
    "( 1895 - 1943 ) ." contain "1895" exactly, so the span shrinks to that piece. Falls back to
    the given span when no sub-span matches.
    """
    # Word by word, as the document: for WordPiece the same pieces as the whole text's; for
    # byte-level BPE each word with its leading space, as inside the document.
    words, _ = split_context(orig_answer_text)
    answer = " ".join(piece for w in words for piece in tokenizer.tokenize_word(w))
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if " ".join(doc_tokens[new_start : new_end + 1]) == answer:
                return new_start, new_end
    return start, end


def convert_examples_to_features(
    examples: Iterable[SquadExample],
    tokenizer,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
    is_training: bool,
    packing: glue.Packing = glue.BERT_PACKING,
) -> Iterator[InputFeatures]:
    """Yields the features of every window of every example, one at a time (see the module
    docstring). unique_id counts from FIRST_UNIQUE_ID; example_index is the example's position.

    tokenizer: a FullTokenizer (tokenize, tokenize_word, convert_tokens_to_ids), or a
    bpe.RobertaTokenizer with glue.ROBERTA_PACKING.
    """
    pad_id = packing.pad_id(tokenizer)
    unique_id = FIRST_UNIQUE_ID
    for example_index, example in enumerate(examples):
        query_tokens = tokenizer.tokenize(example.question_text)[:max_query_length]
        tok_to_orig_index, orig_to_tok_index, all_doc_tokens = [], [], []
        for i, token in enumerate(example.doc_tokens):
            orig_to_tok_index.append(len(all_doc_tokens))
            for sub_token in tokenizer.tokenize_word(token):
                tok_to_orig_index.append(i)
                all_doc_tokens.append(sub_token)

        tok_start = tok_end = None
        if is_training and example.is_impossible:
            tok_start = tok_end = -1
        elif is_training:
            tok_start = orig_to_tok_index[example.start_position]
            if example.end_position < len(example.doc_tokens) - 1:
                tok_end = orig_to_tok_index[example.end_position + 1] - 1
            else:
                tok_end = len(all_doc_tokens) - 1
            tok_start, tok_end = improve_answer_span(
                all_doc_tokens, tok_start, tok_end, tokenizer, example.orig_answer_text
            )

        # [CLS] query [SEP] window [SEP] (RoBERTa: <s> query </s></s> window </s>; XLNet:
        # query <sep> window <sep> <cls>)
        room = max_seq_length - len(query_tokens) - packing.pair_specials
        spans = doc_spans(len(all_doc_tokens), room, doc_stride)
        for span_index, (span_start, span_length) in enumerate(spans):
            tokens = [*packing.head, *query_tokens, *packing.middle]
            segment_ids = [0] * len(tokens)
            offset = len(tokens)  # the window's first position
            token_to_orig_map, token_is_max_context = {}, {}
            for i in range(span_length):
                split_index = span_start + i
                token_to_orig_map[len(tokens)] = tok_to_orig_index[split_index]
                token_is_max_context[len(tokens)] = check_is_max_context(
                    spans, span_index, split_index
                )
                tokens.append(all_doc_tokens[split_index])
                segment_ids.append(packing.second_segment)
            tokens.append(packing.end)
            segment_ids.append(packing.second_segment)
            null_index = packing.null_index(len(tokens) + len(packing.tail))
            tokens += packing.tail
            segment_ids += [packing.tail_segment] * len(packing.tail)
            input_ids = tokenizer.convert_tokens_to_ids(tokens)
            pad = max_seq_length - len(input_ids)
            input_mask = [1] * len(input_ids) + [0] * pad
            input_ids = input_ids + [pad_id] * pad
            segment_ids = segment_ids + [0] * pad

            start_position = end_position = None
            if is_training:
                span_end = span_start + span_length - 1
                if example.is_impossible or not (span_start <= tok_start and tok_end <= span_end):
                    start_position = end_position = null_index  # no answer in this window
                else:
                    start_position = tok_start - span_start + offset
                    end_position = tok_end - span_start + offset
            yield InputFeatures(
                unique_id=unique_id,
                example_index=example_index,
                doc_span_index=span_index,
                tokens=tokens,
                token_to_orig_map=token_to_orig_map,
                token_is_max_context=token_is_max_context,
                input_ids=input_ids,
                input_mask=input_mask,
                segment_ids=segment_ids,
                start_position=start_position,
                end_position=end_position,
                is_impossible=example.is_impossible,
                null_index=null_index,
            )
            unique_id += 1


def shuffle_examples(examples: list[SquadExample], seed: int = 12345) -> list[SquadExample]:
    """A shuffled copy (the original shuffles training examples with seed 12345 before writing
    features, so a window-sized shuffle buffer still mixes documents)."""
    out = list(examples)
    random.Random(seed).shuffle(out)
    return out


def write_train_tfrecord(
    path: str | os.PathLike,
    features_iter: Iterable[InputFeatures],
    progress: Callable[[int], None] | None = None,
) -> int:
    """Streams training features to a TFRecord file (written to path.tmp, then renamed).

    progress: called with 1 after each feature. Returns the number of features written.
    """
    import tensorflow as tf

    from data_prep import features

    path = str(path)
    count = 0
    with tf.io.TFRecordWriter(path + ".tmp") as writer:
        for f in features_iter:
            writer.write(
                features.serialize_squad_example(
                    f.unique_id,
                    f.input_ids,
                    f.input_mask,
                    f.segment_ids,
                    f.start_position,
                    f.end_position,
                    f.is_impossible,
                )
            )
            count += 1
            if progress is not None:
                progress(1)
    os.replace(path + ".tmp", path)
    return count


def check_lengths(
    max_seq_length: int,
    max_query_length: int,
    doc_stride: int,
    packing: glue.Packing = glue.BERT_PACKING,
) -> None:
    """Raises InputError when the lengths leave no room for the document or the stride is not
    positive (windows never skip tokens: each moves on by at most its own length)."""
    specials = packing.pair_specials
    if max_seq_length <= max_query_length + specials:
        raise InputError(
            f"max_seq_length={max_seq_length} leaves no room for the document after "
            f"max_query_length={max_query_length} + {specials} special tokens"
        )
    if doc_stride < 1:
        raise InputError(f"doc_stride: expected at least 1, found {doc_stride}")


def predict_arrays(features_list: list[InputFeatures]) -> dict:
    """The model inputs of in-memory features: int32 (N, S) input_ids, input_mask, segment_ids."""
    import numpy as np

    return {
        key: np.array([getattr(f, key) for f in features_list], np.int32).reshape(
            len(features_list), -1
        )
        for key in ("input_ids", "input_mask", "segment_ids")
    }


def predict_batches(arrays: dict, batch_size: int, num_shards: int = 1, shard_index: int = 0):
    """In-order batches for prediction, padded with all-zero rows to full global batches.

    arrays: int (N, S) arrays (predict_arrays). Worker k of num_shards takes batches k,
    k + num_shards, ... of batch_size / num_shards rows, so gathering a step's outputs over
    workers gives consecutive rows; the caller keeps the first N output rows.
    Returns a tf.data.Dataset of dicts of int32 (batch_size / num_shards, S).
    """
    import numpy as np
    import tensorflow as tf

    if batch_size % num_shards:
        raise ValueError(f"batch size {batch_size} is not divisible by {num_shards} workers")
    n = len(arrays["input_ids"])
    total = max(batch_size, -(-n // batch_size) * batch_size)
    padded = {
        k: np.concatenate([v, np.zeros((total - n, *v.shape[1:]), v.dtype)])
        for k, v in arrays.items()
    }
    dataset = tf.data.Dataset.from_tensor_slices(padded).batch(batch_size // num_shards)
    return dataset.shard(num_shards, shard_index) if num_shards > 1 else dataset
