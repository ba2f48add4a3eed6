"""SQuAD: the training task, predictions from span logits, and the official scoring.

- `span_qa_task`: the original run_squad loss for training/trainer.py, or (mask_padding) the same
  with padding positions left out of its softmaxes, so that batches cut to their longest window
  train as whole ones (run_squad --train_dynamic_padding).
- `example_predictions`: the original write_predictions' post-processing of one question. For
  every window of the example, the n_best_size highest start and end logits give candidate
  spans; a span must lie in the document, be its window's max-context choice
  (data_prep/squad.check_is_max_context), end after it starts and hold at most
  max_answer_length tokens. WordPieces are mapped back to the original words and
  `get_final_text` projects the normalised text onto the original characters. For v2.0 the null
  answer scores start_logit[CLS] + end_logit[CLS] of its best window; an answer is given when
  null score - best span score <= null_score_diff_threshold.
- `stream_predictions` runs the model over chunks of windows as they are created and yields each
  question's result as soon as its last window is scored; `write_predictions` writes the three
  output files entry by entry. Memory holds one chunk of windows, not the whole file's (the
  original kept every feature and result). `make_predictions` is the same on in-memory lists.
- The official SQuAD v1.1 and v2.0 evaluation scripts' definitions: answer normalisation (lower
  case, no punctuation, no articles a/an/the, single spaces), exact match and bag-of-tokens F1,
  the maximum over the gold answers; for v2.0 the HasAns / NoAns breakdown and the search of the
  best no-answer threshold.
Shapes: N windows, S length.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import json
import math
import os
import re
import string
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
from keras import ops

from data_prep import squad, tokenization
from training import finetune_tasks
from training.trainer import Task

# ---------------------------------------------------------------------------------------------
# Training task
# ---------------------------------------------------------------------------------------------


# A padding position's logit under a mask: exp of it minus any real logit is 0 in float32.
PADDING_LOGIT = -1e9


def span_sums(logits, start_positions, end_positions, input_mask=None):
    """The original run_squad loss, as sums for training/trainer.py.

    logits float (B, S, 2); start_positions, end_positions int (B,).
    Returns float32 scalars: loss_sum (sum over the batch of the mean of the start and end
    softmax cross-entropies over positions), start_correct, end_correct and count.

    The original's softmaxes run over every position, padding included, so its loss depends on
    how much padding follows a window. With `input_mask` (B, S) of 1 / 0, padding positions get
    PADDING_LOGIT (no probability, never the argmax): the loss, the hits and the gradient are then
    those of the real positions alone, the same for a window however far it is padded.
    """
    logits = ops.cast(logits, "float32")
    if input_mask is not None:
        real = ops.expand_dims(ops.not_equal(input_mask, 0), -1)  # (B, S, 1)
        logits = ops.where(real, logits, PADDING_LOGIT)
    start_logits, end_logits = logits[..., 0], logits[..., 1]  # (B, S) each
    start = ops.reshape(start_positions, (-1,))
    end = ops.reshape(end_positions, (-1,))
    ce_start = ops.sparse_categorical_crossentropy(start, start_logits, from_logits=True)  # (B,)
    ce_end = ops.sparse_categorical_crossentropy(end, end_logits, from_logits=True)  # (B,)

    def hits(lg, labels):
        return ops.cast(ops.equal(ops.argmax(lg, axis=-1), ops.cast(labels, "int64")), "float32")

    return {
        "loss_sum": ops.sum((ce_start + ce_end) / 2.0),
        "start_correct": ops.sum(hits(start_logits, start)),
        "end_correct": ops.sum(hits(end_logits, end)),
        "count": ops.cast(ops.shape(start)[0], "float32"),
    }


def span_qa_task(model, mask_padding: bool = False) -> Task:
    """The Task of modeling/span_qa.BertSpanQA on batches of data_prep/features.squad_dataset.
    mask_padding: the span loss leaves padding positions out (span_sums' input_mask), which
    batches cut to their longest window need to train as whole windows do."""

    def sums_fn(batch, training):
        inputs = {k: batch[k] for k in ("input_ids", "input_mask", "segment_ids")}
        logits = model(inputs, training=training)
        mask = batch["input_mask"] if mask_padding else None
        return span_sums(logits, batch["start_positions"], batch["end_positions"], mask)

    return _span_task(model, sums_fn)


def _span_task(model, sums_fn, **metrics) -> Task:
    """A span model's Task: span_sums' loss and accuracies, and `metrics` beside them."""
    return Task(
        model=model,
        sums_fn=sums_fn,
        loss_terms=[("loss_sum", "count")],
        metrics={
            "span_loss": ("loss_sum", "count"),
            "start_accuracy": ("start_correct", "count"),
            "end_accuracy": ("end_correct", "count"),
            **metrics,
        },
        flops_fn=finetune_tasks.flops_fn(model),
    )


def beam_span_qa_task(model) -> Task:
    """The Task of modeling/xlnet.XLNetBeamSpanQA: the released XLNet's SQuAD loss, the mean of
    the start and end cross-entropies (the end's conditioned on the gold start) plus 0.5 x the
    answer class's logistic loss, "no answer" being a gold start at the <cls>. Positions outside
    the window have -1e30 logits, so padding never counts."""

    def sums_fn(batch, training):
        keys = ("input_ids", "input_mask", "segment_ids", "start_positions")
        out = model({k: batch[k] for k in keys}, training=training)
        logits = ops.stack([out["start_logits"], out["end_logits"]], axis=-1)  # (B, S, 2)
        sums = span_sums(logits, batch["start_positions"], batch["end_positions"])
        start = ops.reshape(ops.cast(batch["start_positions"], "int32"), (-1,))
        impossible = ops.cast(ops.equal(start, out["cls_index"]), "float32")  # (B,)
        cls = out["cls_logits"]
        bce = ops.binary_crossentropy(impossible, cls, from_logits=True)  # (B,)
        sums["loss_sum"] = sums["loss_sum"] + 0.5 * ops.sum(bce)
        predicted = ops.cast(ops.greater(cls, 0.0), "float32")
        sums["answer_class_correct"] = ops.sum(
            ops.cast(ops.equal(predicted, impossible), "float32")
        )
        return sums

    return _span_task(model, sums_fn, answer_class_accuracy=("answer_class_correct", "count"))


# ---------------------------------------------------------------------------------------------
# Predictions
# ---------------------------------------------------------------------------------------------


def get_final_text(pred_text: str, orig_text: str, do_lower_case: bool) -> str:
    """Projects a prediction in BasicTokenizer's normalised text back onto the original text.

    pred_text is the predicted WordPieces joined ("steve smith"); orig_text the original words
    they came from ("Steve Smith's"). Both are compared with spaces removed, character by
    character, after running BasicTokenizer on orig_text; the matching characters of orig_text
    are returned ("Steve Smith"). When the alignment fails (the normalisation changed the
    length, e.g. stripped accents of a decomposed character), the whole orig_text is returned,
    as the original does.
    """

    def strip_spaces(text):
        chars, ns_to_s = [], {}
        for i, c in enumerate(text):
            if c == " ":
                continue
            ns_to_s[len(chars)] = i
            chars.append(c)
        return "".join(chars), ns_to_s

    tok_text = " ".join(tokenization.BasicTokenizer(do_lower_case).tokenize(orig_text))
    start = tok_text.find(pred_text)
    if start == -1:
        return orig_text
    end = start + len(pred_text) - 1
    orig_ns, orig_ns_to_s = strip_spaces(orig_text)
    tok_ns, tok_ns_to_s = strip_spaces(tok_text)
    if len(orig_ns) != len(tok_ns):
        return orig_text
    tok_s_to_ns = {s: ns for ns, s in tok_ns_to_s.items()}
    if start not in tok_s_to_ns or end not in tok_s_to_ns:
        return orig_text
    orig_start = orig_ns_to_s.get(tok_s_to_ns[start])
    orig_end = orig_ns_to_s.get(tok_s_to_ns[end])
    if orig_start is None or orig_end is None:
        return orig_text
    return orig_text[orig_start : orig_end + 1]


def best_indexes(logits: Sequence[float], n_best_size: int) -> list[int]:
    """The indexes of the n_best_size largest logits, largest first (ties: lower index first)."""
    order = sorted(range(len(logits)), key=lambda i: (-logits[i], i))
    return order[:n_best_size]


def softmax(scores: Sequence[float]) -> list[float]:
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


Prediction = collections.namedtuple("Prediction", "text start_logit end_logit")
# Windows scored per chunk when predicting: a window of 384 tokens takes about 20 KiB as Python
# objects (measured on the real SQuAD sample), so a chunk holds tens of MB however large the file.
PREDICT_CHUNK_WINDOWS = 1024


@dataclasses.dataclass
class ExampleResult:
    """The post-processed prediction of one question.

    text: the answer ("" = no answer, v2.0); nbest: [{text, probability, start_logit,
    end_logit}, ...]; null_odds: null score - best non-null span score (v2.0, else None);
    best_non_null: the best non-empty text, before the v2.0 threshold is applied.
    """

    qas_id: str
    text: str
    nbest: list
    null_odds: float | None
    best_non_null: str


def is_answer_span(feature, s: int, e: int, max_answer_length: int) -> bool:
    """Whether window positions s..e can be an answer: spans outside the document (question,
    padding), not the window's max-context choice for their start, reversed or longer than
    max_answer_length cannot."""
    if s not in feature.token_to_orig_map or e not in feature.token_to_orig_map:
        return False
    if not feature.token_is_max_context.get(s, False):
        return False
    return s <= e and e - s + 1 <= max_answer_length


def span_text(example, feature, s: int, e: int, detokenize, do_lower_case: bool) -> str:
    """The original text of window positions s..e: its pieces detokenized (WordPiece's
    "un ##aff ##able" -> "unaffable", or byte-level BPE / SentencePiece) and projected onto the
    example's original words (get_final_text)."""
    words = example.doc_tokens[feature.token_to_orig_map[s] : feature.token_to_orig_map[e] + 1]
    pieces = feature.tokens[s : e + 1]
    return get_final_text(detokenize(pieces), " ".join(words), do_lower_case)


def nbest_entries(nbest: Sequence[Prediction]) -> list[dict]:
    """nbest_predictions.json's entries of Predictions: text, the softmax of the summed scores
    over the list as probability, start_logit and end_logit."""
    probs = softmax([p.start_logit + p.end_logit for p in nbest])
    return [
        {"text": p.text, "probability": prob, "start_logit": float(p.start_logit),
         "end_logit": float(p.end_logit)}
        for p, prob in zip(nbest, probs)
    ]  # fmt: skip


def distinct_best(prelim, example, features, n_best_size: int, detokenize, do_lower_case: bool):
    """The n_best_size best spans of `prelim` ((window, start, end, start score, end score)
    tuples, ranked here by the sum of the scores) whose texts differ, as Predictions; a start of
    0 is the null answer "" (v2.0's [CLS]; no answer span starts there)."""
    seen, nbest = set(), []
    for w, s, e, start, end in sorted(prelim, key=lambda p: p[3] + p[4], reverse=True):
        if len(nbest) >= n_best_size:
            break
        text = span_text(example, features[w], s, e, detokenize, do_lower_case) if s > 0 else ""
        if text in seen and s > 0:
            continue
        seen.add(text)
        nbest.append(Prediction(text, start, end))
    return nbest


def example_predictions(
    example,
    features: Sequence,
    logits: Sequence[np.ndarray],
    n_best_size: int,
    max_answer_length: int,
    do_lower_case: bool,
    version_2_with_negative: bool,
    null_score_diff_threshold: float,
    detokenize: Callable[[Sequence[str]], str] = tokenization.wordpiece_text,
) -> ExampleResult:
    """The original write_predictions for one example: its windows' n-best spans merged.

    features: the example's data_prep.squad.InputFeatures (its windows, in order); logits: one
    float (S, 2) array per window. Only these are needed, so predictions can be made example by
    example while the windows stream past (stream_predictions). detokenize: a span's tokens ->
    its text (WordPiece's by default; a RoBERTa tokenizer's `detokenize` for byte-level BPE).
    """
    prelim = []
    score_null = math.inf
    null_window, null_start, null_end = 0, 0.0, 0.0
    for w, (feature, window_logits) in enumerate(zip(features, logits)):
        start_logits = np.asarray(window_logits)[:, 0].tolist()
        end_logits = np.asarray(window_logits)[:, 1].tolist()
        if version_2_with_negative:  # "no answer" is read at [CLS] (XLNet: its <cls>)
            k = feature.null_index
            null = start_logits[k] + end_logits[k]
            if null < score_null:
                score_null, null_window = null, w
                null_start, null_end = start_logits[k], end_logits[k]
        for s in best_indexes(start_logits, n_best_size):
            for e in best_indexes(end_logits, n_best_size):
                if is_answer_span(feature, s, e, max_answer_length):
                    prelim.append((w, s, e, start_logits[s], end_logits[e]))
    if version_2_with_negative:
        prelim.append((null_window, 0, 0, null_start, null_end))
    nbest = distinct_best(prelim, example, features, n_best_size, detokenize, do_lower_case)
    if version_2_with_negative:
        if all(p.text for p in nbest):
            nbest.append(Prediction("", null_start, null_end))
        if len(nbest) == 1:  # only the null answer: keep a non-null entry, as the original
            nbest.insert(0, Prediction("empty", 0.0, 0.0))
    if not nbest:
        nbest.append(Prediction("empty", 0.0, 0.0))
    entries = nbest_entries(nbest)
    best = next((p for p in nbest if p.text), nbest[0])
    if not version_2_with_negative:
        return ExampleResult(example.qas_id, nbest[0].text, entries, None, best.text)
    diff = float(score_null - best.start_logit - best.end_logit)
    text = "" if diff > null_score_diff_threshold else best.text
    return ExampleResult(example.qas_id, text, entries, diff, best.text)


def beam_example_predictions(
    example,
    features: Sequence,
    rows: Sequence[tuple],
    n_best_size: int,
    max_answer_length: int,
    do_lower_case: bool,
    version_2_with_negative: bool,
    null_score_diff_threshold: float,
    detokenize: Callable[[Sequence[str]], str] = tokenization.wordpiece_text,
) -> ExampleResult:
    """The released XLNet's post-processing (its run_squad.py write_predictions) for one example,
    from each window's beam (XLNetBeamSpanQA.unpack_beam: the top starts, each with its top
    ends, as log-probabilities, and the answer-class logit). Spans are filtered as in
    example_predictions and ranked by start + end log-probability; nbest's start_logit /
    end_logit are those log-probabilities. For v2.0 the null score is the lowest answer-class
    logit over the windows, and the answer is "" when it exceeds null_score_diff_threshold
    (null_odds.json holds it, as the released code writes score_null)."""
    prelim = []
    score_null = math.inf
    for w, (feature, beam) in enumerate(zip(features, rows)):
        start_lp, start_index, end_lp, end_index, cls_logit = beam
        score_null = min(score_null, cls_logit)
        for i, s in enumerate(start_index.tolist()):
            for j, e in enumerate(end_index[i].tolist()):
                if is_answer_span(feature, s, e, max_answer_length):
                    prelim.append((w, s, e, float(start_lp[i]), float(end_lp[i, j])))
    nbest = distinct_best(prelim, example, features, n_best_size, detokenize, do_lower_case)
    if not nbest:
        nbest.append(Prediction("", -1e6, -1e6))
    entries = nbest_entries(nbest)
    best = nbest[0].text
    if not version_2_with_negative:
        return ExampleResult(example.qas_id, best, entries, None, best)
    text = "" if score_null > null_score_diff_threshold else best
    return ExampleResult(example.qas_id, text, entries, float(score_null), best)


def make_predictions(
    examples,
    features,
    logits: np.ndarray,
    n_best_size: int,
    max_answer_length: int,
    do_lower_case: bool,
    version_2_with_negative: bool,
    null_score_diff_threshold: float,
    detokenize: Callable[[Sequence[str]], str] = tokenization.wordpiece_text,
) -> tuple[dict, dict, dict, dict]:
    """The original write_predictions, without the writing, on features held in memory.

    examples: data_prep.squad.SquadExample list; features: data_prep.squad.InputFeatures list
    (example_index refers to `examples`); logits float (N, S, 2), row i for features[i].
    Returns (predictions, nbest, null_odds, best_non_null):
      predictions {qas_id: text} ("" = no answer, v2.0);
      nbest {qas_id: [{text, probability, start_logit, end_logit}, ...]};
      null_odds {qas_id: null score - best non-null span score} (v2.0, else empty);
      best_non_null {qas_id: best non-empty text}: the answer before the threshold is applied,
      what the official v2.0 script's threshold search needs.
    For large files use stream_predictions, which holds one chunk of windows at a time.
    """
    by_example = collections.defaultdict(list)
    for i, feature in enumerate(features):
        by_example[feature.example_index].append(i)
    results = (
        example_predictions(
            example,
            [features[i] for i in by_example[example_index]],
            [logits[i] for i in by_example[example_index]],
            n_best_size,
            max_answer_length,
            do_lower_case,
            version_2_with_negative,
            null_score_diff_threshold,
            detokenize,
        )
        for example_index, example in enumerate(examples)
    )
    return collect(results)


def collect(results: Iterable[ExampleResult]) -> tuple[dict, dict, dict, dict]:
    """(predictions, nbest, null_odds, best_non_null) dicts of ExampleResults, as make_predictions
    returns them."""
    predictions, nbest, null_odds, best_non_null = {}, {}, {}, {}
    for r in results:
        predictions[r.qas_id] = r.text
        nbest[r.qas_id] = r.nbest
        if r.null_odds is not None:
            null_odds[r.qas_id] = r.null_odds
        best_non_null[r.qas_id] = r.best_non_null
    return predictions, nbest, null_odds, best_non_null


def stream_predictions(
    examples: Sequence,
    features: Iterable,
    predict_fn: Callable[[list], np.ndarray],
    chunk_size: int,
    n_best_size: int,
    max_answer_length: int,
    do_lower_case: bool,
    version_2_with_negative: bool,
    null_score_diff_threshold: float,
    detokenize: Callable[[Sequence[str]], str] = tokenization.wordpiece_text,
    example_fn: Callable = example_predictions,
    unpack: Callable = np.array,
) -> Iterator[ExampleResult]:
    """Yields every example's ExampleResult, in example order, from windows that stream past.

    examples: the SquadExamples; features: their InputFeatures in order (a generator such as
    data_prep.squad.convert_examples_to_features), an example's windows next to each other;
    predict_fn(list of n InputFeatures) -> float (n, S, 2) logits, called on chunks of
    chunk_size windows (make it a multiple of the global batch size so that every chunk but the
    last fills whole batches). At most one chunk of windows and the windows of one example
    are alive at a time, whatever the size of the file; the results equal make_predictions'.
    example_fn: example_predictions, or beam_example_predictions with predict_fn's rows being
    XLNetBeamSpanQA's `beam` and unpack its unpack_beam (each row is copied through unpack).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size: expected at least 1, found {chunk_size}")
    post = (
        n_best_size,
        max_answer_length,
        do_lower_case,
        version_2_with_negative,
        null_score_diff_threshold,
        detokenize,
    )
    done = 0  # examples yielded so far
    windows, rows = [], []  # of example `done`
    features = iter(features)
    while True:
        chunk = list(itertools.islice(features, chunk_size))
        if not chunk:
            break
        logits = np.asarray(predict_fn(chunk))
        if logits.shape[0] != len(chunk):
            raise ValueError(f"predict_fn gave {logits.shape[0]} rows for {len(chunk)} windows")
        for feature, row in zip(chunk, logits):
            if feature.example_index < done:
                raise ValueError(
                    f"window {feature.unique_id} of example {feature.example_index} comes after "
                    f"example {done}: an example's windows must be next to each other"
                )
            while feature.example_index > done:
                yield example_fn(examples[done], windows, rows, *post)
                windows, rows = [], []
                done += 1
            windows.append(feature)
            rows.append(unpack(row))  # a copy: a view would keep the chunk's logits alive
        chunk = logits = feature = row = None  # free the chunk before the next one is made
    while done < len(examples):
        yield example_fn(examples[done], windows, rows, *post)
        windows, rows = [], []
        done += 1


def best_non_null_answers(nbest: dict) -> dict:
    """{qas_id: best non-empty text} read back from nbest_predictions.json: ExampleResult's
    best_non_null, i.e. each question's first n-best entry with a text (example_predictions puts
    the placeholder "empty" first when only the null answer is left)."""
    return {
        qid: next((e["text"] for e in entries if e["text"]), entries[0]["text"])
        for qid, entries in nbest.items()
    }


class WindowPredictor:
    """The predict_fn of stream_predictions for a model run by a finetune_tasks.Predictor.

    A chunk of windows becomes in-order batches padded to whole global batches
    (data_prep/squad.predict_batches; worker shard_index of num_shards takes its share) and
    comes back as float (n, S, 2) logits without the padding rows. `windows` counts the windows
    scored so far. `dynamic_padding`: each batch cut to its longest window
    (features.trim_to_longest); the predictor then needs its sequence_length to pad the logits
    back.
    """

    def __init__(
        self,
        predictor,
        batch_size: int,
        num_shards: int = 1,
        shard_index: int = 0,
        dynamic_padding: bool = False,
    ):
        self.predictor = predictor
        self.batch_size = batch_size
        self.num_shards = num_shards
        self.shard_index = shard_index
        self.dynamic_padding = dynamic_padding
        self.windows = 0

    def __call__(self, windows: list) -> np.ndarray:
        from data_prep import features

        arrays = squad.predict_arrays(windows)
        batches = squad.predict_batches(arrays, self.batch_size, self.num_shards, self.shard_index)
        if self.dynamic_padding:
            batches = batches.map(features.trim_to_longest)
        self.windows += len(windows)
        return self.predictor(batches)[: len(windows)]  # (n, S, 2), padding rows dropped


def write_predictions(
    results: Iterable[ExampleResult], output_dir: str | os.PathLike | None
) -> tuple[dict, dict]:
    """Writes predictions.json, nbest_predictions.json and (when the results hold null odds,
    v2.0) null_odds.json to output_dir as the results stream past; only the small
    {qas_id: text} maps stay in memory. output_dir None: consume without writing (the other
    workers of a multi-worker run). Files appear complete or not at all.

    Returns (predictions, best_non_null) {qas_id: text}.
    """
    predictions, best_non_null = {}, {}
    with contextlib.ExitStack() as stack:
        writers = {}
        if output_dir is not None:
            for name in ("predictions", "nbest_predictions", "null_odds"):
                path = os.path.join(str(output_dir), f"{name}.json")
                writers[name] = stack.enter_context(JsonObjectWriter(path))
        has_odds = False
        for r in results:
            if r.qas_id in predictions:
                raise ValueError(f"question id {r.qas_id!r} is predicted twice")
            predictions[r.qas_id] = r.text
            best_non_null[r.qas_id] = r.best_non_null
            has_odds |= r.null_odds is not None
            if writers:
                writers["predictions"].add(r.qas_id, r.text)
                writers["nbest_predictions"].add(r.qas_id, r.nbest)
                if r.null_odds is not None:
                    writers["null_odds"].add(r.qas_id, r.null_odds)
        if writers and not has_odds:
            writers["null_odds"].discard()
    return predictions, best_non_null


def write_json(path: str | os.PathLike, obj) -> None:
    """Writes JSON atomically (path.tmp, then rename), indented as the original's outputs."""
    path = str(path)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=4, ensure_ascii=False) + "\n")
    os.replace(path + ".tmp", path)


class JsonObjectWriter:
    """Writes a JSON object entry by entry, byte for byte what write_json writes for the whole
    dict (4-space indent, UTF-8), so a large output never has to be held in memory.

    Use as a context manager: the file is written to path.tmp and renamed into place on a clean
    exit; on an exception, or after discard(), the temporary file is removed and path is left
    as it was. Keys must be distinct (a dict would keep one of them).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self._file = None
        self._count = 0

    def __enter__(self) -> JsonObjectWriter:
        self._file = open(self.path + ".tmp", "w", encoding="utf-8")
        return self

    def add(self, key: str, value) -> None:
        # json.dumps indents a nested value from column 0; inside the object it sits one level in.
        text = json.dumps(value, indent=4, ensure_ascii=False).replace("\n", "\n    ")
        self._file.write("{\n" if self._count == 0 else ",\n")
        self._file.write(f"    {json.dumps(key, ensure_ascii=False)}: {text}")
        self._count += 1

    def discard(self) -> None:
        """Drops what was written: nothing appears at path."""
        if self._file is not None:
            self._file.close()
            os.remove(self.path + ".tmp")
            self._file = None

    def __exit__(self, exc_type, exc, tb):
        if self._file is None:
            return False
        if exc_type is not None:
            self.discard()
            return False
        self._file.write("\n}\n" if self._count else "{}\n")
        self._file.close()
        self._file = None
        os.replace(self.path + ".tmp", self.path)
        return False


# ---------------------------------------------------------------------------------------------
# The official evaluation (evaluate-v1.1.py, evaluate-v2.0.py)
# ---------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower case, remove punctuation, articles (a, an, the) and extra whitespace (official)."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(gold: str, pred: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(pred))


def f1_v2(gold: str, pred: str) -> float:
    """v2.0's token F1: an empty answer on either side scores 1 only when both are empty."""
    gold_toks = normalize_answer(gold).split() if gold else []
    pred_toks = normalize_answer(pred).split() if pred else []
    if not gold_toks or not pred_toks:
        return float(gold_toks == pred_toks)
    return _f1_tokens(gold_toks, pred_toks)


def f1_v1(gold: str, pred: str) -> float:
    """v1.1's token F1 (no special case: an empty side scores 0)."""
    return _f1_tokens(normalize_answer(gold).split(), normalize_answer(pred).split())


def _f1_tokens(gold_toks: list[str], pred_toks: list[str]) -> float:
    same = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_toks), same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def _questions(dataset: dict):
    for article in dataset["data"]:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def evaluate_v1(dataset: dict, predictions: dict) -> dict:
    """evaluate-v1.1.py: {"exact_match", "f1"} in percent over all questions of the dataset
    (a question without a prediction scores 0); also "total" and "missing"."""
    golds = ((qa["id"], [a["text"] for a in qa["answers"]]) for qa in _questions(dataset))
    return score_v1(golds, predictions)


def score_v1(questions: Iterable[tuple[str, Sequence[str]]], predictions: dict) -> dict:
    """evaluate_v1 over (question id, gold answer texts) pairs: each question's best exact match
    and F1 over its answers, in percent, with "total" and "missing" (no prediction: 0)."""
    em = f1 = 0.0
    total = missing = 0
    for qid, golds in questions:
        total += 1
        if qid not in predictions:
            missing += 1
            continue
        pred = predictions[qid]
        em += max((exact_match(g, pred) for g in golds), default=0)
        f1 += max((f1_v1(g, pred) for g in golds), default=0.0)
    total_div = max(total, 1)
    return {
        "exact_match": 100.0 * em / total_div,
        "f1": 100.0 * f1 / total_div,
        "total": total,
        "missing": missing,
    }


def evaluate_v2(
    dataset: dict,
    predictions: dict,
    na_probs: dict | None = None,
    na_prob_thresh: float = 1.0,
) -> dict:
    """evaluate-v2.0.py.

    predictions {qid: text}; na_probs {qid: no-answer score} (run_squad's null_odds); a question
    whose score is above na_prob_thresh counts as answered with "no answer". Questions without a
    prediction are left out, as the official script does. Returns exact, f1, total, HasAns_*,
    NoAns_* and, when na_probs is given, best_exact, best_exact_thresh, best_f1, best_f1_thresh:
    the scores at the best threshold over the dataset.
    """
    has_ans = {qa["id"]: bool(qa["answers"]) for qa in _questions(dataset)}
    exact_raw, f1_raw = {}, {}
    for qa in _questions(dataset):
        qid = qa["id"]
        if qid not in predictions:
            continue
        golds = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])]
        golds = golds or [""]  # an unanswerable question: the right answer is the empty one
        pred = predictions[qid]
        exact_raw[qid] = max(exact_match(g, pred) for g in golds)
        f1_raw[qid] = max(f1_v2(g, pred) for g in golds)
    probs = na_probs if na_probs is not None else {k: 0.0 for k in predictions}
    exact = apply_no_answer_threshold(exact_raw, probs, has_ans, na_prob_thresh)
    f1 = apply_no_answer_threshold(f1_raw, probs, has_ans, na_prob_thresh)
    out = _eval_dict(exact, f1)
    for name, want in (("HasAns", True), ("NoAns", False)):
        qids = [q for q, h in has_ans.items() if h == want]
        if qids:
            out |= {f"{name}_{k}": v for k, v in _eval_dict(exact, f1, qids).items()}
    if na_probs is not None and exact_raw:
        out["best_exact"], out["best_exact_thresh"] = find_best_threshold(
            predictions, exact_raw, na_probs, has_ans
        )
        out["best_f1"], out["best_f1_thresh"] = find_best_threshold(
            predictions, f1_raw, na_probs, has_ans
        )
    return out


def apply_no_answer_threshold(scores: dict, na_probs: dict, has_ans: dict, thresh: float) -> dict:
    """Scores with questions whose na_prob > thresh answered "no answer": 1 if right, else 0."""
    return {
        qid: float(not has_ans[qid]) if na_probs[qid] > thresh else s for qid, s in scores.items()
    }


def _eval_dict(exact: dict, f1: dict, qids: list | None = None) -> dict:
    # As the official script: over the given qids (all must be scored), else over all scored.
    qids = list(exact) if qids is None else qids
    total = len(qids)
    if not total:
        return {"exact": 0.0, "f1": 0.0, "total": 0}
    return {
        "exact": 100.0 * sum(exact.get(q, 0.0) for q in qids) / total,
        "f1": 100.0 * sum(f1.get(q, 0.0) for q in qids) / total,
        "total": total,
    }


def find_best_threshold(
    predictions: dict, scores: dict, na_probs: dict, has_ans: dict
) -> tuple[float, float]:
    """The official threshold search: start from answering "no answer" everywhere (scoring the
    unanswerable questions), then lower the bar question by question in increasing na_prob
    order, keeping the best total. Returns (best score in percent of the scored questions, the
    na_prob threshold that gives it)."""
    score = best = sum(1 for h in has_ans.values() if not h)
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if predictions[qid] else 0
        score += diff
        if score > best:
            best, best_thresh = score, na_probs[qid]
    return 100.0 * best / len(scores), float(best_thresh)
