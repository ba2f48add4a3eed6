"""Text-to-text fine-tuning data (T5, Raffel et al. 2020 sec. 2.4): every task as source text ->
target text.

  GLUE-style classification  data_prep/glue.py's readers; the source is "<task> sentence: a" or
                             "<task> sentence1: a sentence2: b", the target the label's word
                             ("negative" / "positive" for SST-2, as T5 writes them).
  tsv_seq2seq                train.tsv, dev.tsv, test.tsv of `source<TAB>target` lines (a
                             summarisation-style task; test.tsv's targets may be empty).
  squad                      SQuAD v1.1 as T5 casts it (Raffel et al. 2020, appendix D):
                             "question: q context: c" -> the answer's text, the first answer
                             the target and every answer kept to score (train-v1.1.json,
                             dev-v1.1.json; SQuAD has no public test split).
Then `encode_pairs` turns (source, target) texts into the four features of
data_prep/seq2seq_data.py, each side cut to its length with </s> kept last (and BART's <s> first).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from data_prep import glue, squad
from data_prep.errors import input_error
from data_prep.seq2seq_data import FEATURES, Seq2SeqVocab
from data_prep.tokenization import read_utf8_lines

TSV_SEQ2SEQ = "tsv_seq2seq"
SQUAD = "squad"
SQUAD_FILES = {"train": "train-v1.1.json", "dev": "dev-v1.1.json"}
# Label words of GLUE's binary tasks, as T5's preprocessors name them; label order of glue.py.
LABEL_WORDS = {
    "sst-2": ("negative", "positive"),
    "cola": ("unacceptable", "acceptable"),
    "mrpc": ("not_equivalent", "equivalent"),
    "qqp": ("not_duplicate", "duplicate"),
    "wnli": ("not_entailment", "entailment"),
}


@dataclasses.dataclass(frozen=True)
class Pair:
    """One example as text: where it was read (`path:line`), its submission index, the source,
    the target (None for unlabelled test rows), and for SQuAD every gold answer (the first is the
    target)."""

    guid: str
    index: str
    source: str
    target: str | None
    answers: tuple[str, ...] = ()


def label_words(task: glue.TaskSpec, words: Sequence[str] = ()) -> tuple[str, ...]:
    """The word each label is written as: `words` (one per label, in label order) when given,
    else T5's words for the task, else the labels themselves (MNLI's are already words)."""
    if task.kind != glue.CLASSIFICATION:
        raise ValueError(f"{task.name} is {task.kind}: text-to-text here covers classification")
    chosen = tuple(w.strip() for w in words) or LABEL_WORDS.get(task.name, task.labels)
    if len(chosen) != len(task.labels) or len(set(chosen)) != len(chosen) or not all(chosen):
        raise ValueError(
            f"--label_words: expected {len(task.labels)} distinct non-empty words for the labels "
            f"{list(task.labels)}, found {list(words)}"
        )
    return chosen


def source_text(task_name: str, text_a: str, text_b: str | None) -> str:
    """T5's input format: the task name as a prefix, then each field under its name."""
    prefix = task_name.replace("-", "")
    if text_b is None:
        return f"{prefix} sentence: {text_a}"
    return f"{prefix} sentence1: {text_a} sentence2: {text_b}"


def classification_pairs(
    task: glue.TaskSpec, examples: Sequence[glue.Example], words: Sequence[str]
) -> list[Pair]:
    by_label = dict(zip(task.labels, words))
    return [
        Pair(
            ex.guid,
            ex.index,
            source_text(task.name, ex.text_a, ex.text_b),
            None if ex.label is None else by_label[ex.label],
        )
        for ex in examples
    ]


def read_tsv_pairs(path: str | os.PathLike, labelled: bool = True) -> list[Pair]:
    """`source<TAB>target` lines (no header); the index is the row from 0. A line without
    exactly one tab, an empty source, or (labelled) an empty target is an error naming the file
    and line; blank lines are skipped. An unlabelled file may hold sources only."""
    pairs = []
    for n, line in read_utf8_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) > 2 or (labelled and len(fields) != 2):
            raise input_error(f"{path}:{n}", "source<TAB>target (one tab)", f"{len(fields)} fields")
        source, target = fields[0].strip(), (fields[1].strip() if len(fields) == 2 else "")
        if not source or (labelled and not target):
            raise input_error(f"{path}:{n}", "a non-empty source and target", repr(line[:80]))
        pairs.append(Pair(f"{path}:{n}", str(len(pairs)), source, target if labelled else None))
    if not pairs:
        raise input_error(str(path), "at least one source<TAB>target line", "an empty file")
    return pairs


def read_squad_pairs(path: str | os.PathLike) -> list[Pair]:
    """A SQuAD v1.1 file's questions in file order, as T5's `squad` preprocessor casts them:
    source "question: q context: c", target the first answer's text, index the question id. A
    question without an answer (SQuAD v2.0's unanswerable ones) is an error naming the file and
    its JSON path."""
    pairs = []
    for _, paragraph, where, qa in squad.iter_questions(squad.load_squad_json(path), str(path)):
        golds = tuple(a["text"] for a in qa["answers"])
        if qa.get("is_impossible") or not golds:
            raise input_error(
                f"{path}: {where}",
                "a SQuAD v1.1 question with at least one answer",
                "an unanswerable question (SQuAD v2.0: use run_squad.py)",
            )
        source = f"question: {qa['question']} context: {paragraph['context']}"
        pairs.append(Pair(f"{path}: {where}", qa["id"], source, golds[0], golds))
    if not pairs:
        raise input_error(str(path), "at least one SQuAD question", "none")
    return pairs


def read_pairs(
    task_name: str, split: str, data_dir: str, words: Sequence[str] = ()
) -> tuple[list[Pair], str]:
    """The (pairs, source description) of split "train", "dev" or "test" of a task: a GLUE-style
    classification task (its first split of that kind), tsv_seq2seq or squad. Raises InputError
    for a missing file or bad rows, ValueError for a task or split text-to-text does not cover."""
    if task_name.lower() == SQUAD:
        if split not in SQUAD_FILES:
            raise ValueError(
                f"{SQUAD} has no {split} split here: --do_eval decodes and scores "
                f"{SQUAD_FILES['dev']}"
            )
        path = Path(data_dir) / SQUAD_FILES[split]
        return read_squad_pairs(path), str(path)
    if task_name.lower().replace("-", "_") == TSV_SEQ2SEQ:
        path = Path(data_dir) / f"{split}.tsv"
        if not path.is_file():
            raise input_error(str(path), f"the {TSV_SEQ2SEQ} {split} file", "no such file")
        return read_tsv_pairs(path, labelled=split != "test"), str(path)
    task = glue.get_task(task_name)
    chosen = label_words(task, words)
    spec = {"train": task.train, "dev": task.dev[0], "test": task.test[0] if task.test else None}
    if spec[split] is None:
        raise ValueError(f"{task.name} has no {split} split")
    data = glue.read_split(task, spec[split], data_dir)
    return classification_pairs(task, data.examples, chosen), data.source


def _cut(ids: list[int], length: int, vocab: Seq2SeqVocab) -> tuple[list[int], bool]:
    """ids cut to fit `length` with the vocabulary's wrapping (<s> for BART, </s>)."""
    room = length - 1 - (vocab.bos_id is not None)
    return vocab.wrap(ids[:room]), len(ids) > room


def encode_pairs(
    pairs: Sequence[Pair], vocab: Seq2SeqVocab, max_seq_length: int, max_target_length: int
) -> tuple[dict, int]:
    """The four features (int32 (N, S) and (N, T), padded with <pad>) of the pairs and how many
    sources or targets were truncated. Each side is `text </s>`, or `<s> text </s>` with a
    vocabulary that has a <s> (BART). Unlabelled pairs get an empty target (</s> only)."""
    arrays = {
        k: np.full((len(pairs), n), vocab.pad_id if "ids" in k else 0, np.int32)
        for k, n in zip(FEATURES, (max_seq_length,) * 2 + (max_target_length,) * 2)
    }
    cut = 0
    for row, pair in enumerate(pairs):
        source, a = _cut(vocab.encode(pair.source), max_seq_length, vocab)
        target, b = _cut(vocab.encode(pair.target or ""), max_target_length, vocab)
        cut += a or b
        arrays["input_ids"][row, : len(source)] = source
        arrays["input_mask"][row, : len(source)] = 1
        arrays["target_ids"][row, : len(target)] = target
        arrays["target_mask"][row, : len(target)] = 1
    return arrays, cut
