"""Entity-level scoring of token tagging with the conlleval definition, and CoNLL output files.

conlleval (the CoNLL-2000/2003 shared-task scorer, Tjong Kim Sang) counts an entity as correct
only when a predicted entity has the same type and both the same first and last token as a gold
one; precision = correct / predicted entities, recall = correct / gold entities, F1 their harmonic
mean, per type and over all types (micro-averaged), 0 where a denominator is 0. Its "accuracy" is
the share of tokens whose full tag (prefix and type) equals the gold tag, O tokens included.
Entities are read with conlleval's lenient rules (data_prep.conll.chunks): I-X after O starts an
entity, so IOB1, BIO and broken BIO are scored as conlleval.pl scores them. seqeval's default
mode reads tags the same way; its strict mode (mode="strict") instead drops entities that break
the scheme, so the two differ only on ill-formed predictions. tests/test_ner_eval.py checks this
module against conlleval.pl itself and against seqeval.
"""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from data_prep.conll import chunks

_WHITESPACE = re.compile(r"\s")


def _prf(correct: int, predicted: int, gold: int) -> dict:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "correct": correct,
        "predicted": predicted,
        "gold": gold,
    }


def evaluate(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict:
    """conlleval's scores of predicted tags against gold tags, sentence by sentence.

    Args:
      gold, predicted: one list of tags per sentence, equally long pairwise.
    Returns {"precision", "recall", "f1", "correct", "predicted", "gold" (entity counts),
    "accuracy" (token), "tokens", "correct_tags", "per_type": {type: {precision, recall, f1,
    correct, predicted, gold}}}; per_type holds every type found in gold or predictions.
    """
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    correct_by: collections.Counter = collections.Counter()
    gold_by: collections.Counter = collections.Counter()
    pred_by: collections.Counter = collections.Counter()
    tokens = correct_tags = 0
    for k, (g, p) in enumerate(zip(gold, predicted)):
        if len(g) != len(p):
            raise ValueError(f"sentence {k}: {len(g)} gold tags but {len(p)} predicted")
        gold_chunks, pred_chunks = set(chunks(g)), set(chunks(p))
        gold_by.update(c[0] for c in gold_chunks)
        pred_by.update(c[0] for c in pred_chunks)
        correct_by.update(c[0] for c in gold_chunks & pred_chunks)
        tokens += len(g)
        correct_tags += sum(a == b for a, b in zip(g, p))
    types = sorted(set(gold_by) | set(pred_by))
    overall = _prf(sum(correct_by.values()), sum(pred_by.values()), sum(gold_by.values()))
    return {
        **overall,
        "accuracy": correct_tags / tokens if tokens else 0.0,
        "tokens": tokens,
        "correct_tags": correct_tags,
        "per_type": {t: _prf(correct_by[t], pred_by[t], gold_by[t]) for t in types},
    }


def flat_results(scores: dict) -> dict:
    """evaluate()'s scores as flat `eval_results.txt` keys: precision, recall, f1,
    token_accuracy, entity counts, and precision_<type>, recall_<type>, f1_<type>."""
    out = {k: scores[k] for k in ("precision", "recall", "f1")}
    out["token_accuracy"] = scores["accuracy"]
    out |= {f"{k}_entities": scores[k] for k in ("gold", "predicted", "correct")}
    for t, s in scores["per_type"].items():
        out |= {f"{k}_{t}": s[k] for k in ("precision", "recall", "f1")}
    return out


def _percentages(correct: int, predicted: int, gold: int) -> tuple[float, float, float]:
    # In percent and in conlleval.pl's order of operations, so that the printed digits match.
    precision = 100 * correct / predicted if predicted else 0.0
    recall = 100 * correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def report(scores: dict) -> str:
    """The scores in conlleval.pl's printed layout, digit for digit (percentages, 2 decimals)."""
    p, r, f = _percentages(scores["correct"], scores["predicted"], scores["gold"])
    lines = [
        f"processed {scores['tokens']} tokens with {scores['gold']} phrases; found: "
        f"{scores['predicted']} phrases; correct: {scores['correct']}.",
    ]
    if scores["tokens"]:
        accuracy = 100 * scores["correct_tags"] / scores["tokens"]
        lines.append(
            f"accuracy: {accuracy:6.2f}%; precision: {p:6.2f}%; recall: {r:6.2f}%; FB1: {f:6.2f}"
        )
    for t, s in scores["per_type"].items():
        p, r, f = _percentages(s["correct"], s["predicted"], s["gold"])
        lines.append(
            f"{t:>17}: precision: {p:6.2f}%; recall: {r:6.2f}%; FB1: {f:6.2f}  {s['predicted']}"
        )
    return "\n".join(lines) + "\n"


def write_predictions(
    path: str | os.PathLike,
    words: Sequence[Sequence[str]],
    gold: Sequence[Sequence[str]] | None,
    predicted: Sequence[Sequence[str]],
) -> str:
    """Writes `token gold predicted` lines (or `token predicted` without gold), space-separated,
    a blank line between sentences: the input conlleval.pl reads. Whitespace inside a token
    (possible in tab-separated input) becomes "_" so that the columns stay apart. Atomic.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    golds = gold if gold is not None else [None] * len(words)
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for w, g, p in zip(words, golds, predicted, strict=True):
                for i, word in enumerate(w):
                    cols = [_WHITESPACE.sub("_", word), *([g[i]] if g is not None else []), p[i]]
                    f.write(" ".join(cols) + "\n")
                f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return str(path)


def tagging_loss(logits: np.ndarray, label_ids: np.ndarray, weights: np.ndarray) -> float:
    """Mean cross-entropy over the weighted positions. logits float (W, S, C); label_ids int
    (W, S); weights float (W, S), 0 for positions that carry no label."""
    logits = np.asarray(logits, np.float64)
    z = logits - logits.max(axis=-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))  # (W, S, C)
    picked = np.take_along_axis(log_probs, np.asarray(label_ids)[..., None], axis=-1)[..., 0]
    w = np.asarray(weights, np.float64)
    return float(-(picked * w).sum() / max(w.sum(), 1.0))
