"""GLUE, SWAG and a user's own TSV task: readers for the official file layouts, pair packing into
BERT inputs, and GLUE submission files.

Tasks (Wang et al. 2019, table 1; SWAG: Zellers et al. 2018), with the files each reads from
`--data_dir` as the GLUE download script lays them out:
  cola   train.tsv dev.tsv (no header: source, label, original mark, sentence), test.tsv
  sst-2  train.tsv dev.tsv (sentence, label), test.tsv (index, sentence)
  mrpc   train.tsv dev.tsv (Quality, #1 ID, #2 ID, #1 String, #2 String), test.tsv (index, ...)
  sts-b  train.tsv dev.tsv (index ... sentence1 sentence2 score), test.tsv; regression in [0, 5]
  qqp    train.tsv dev.tsv (id qid1 qid2 question1 question2 is_duplicate), test.tsv (id ...)
  mnli   train.tsv, dev_matched.tsv + dev_mismatched.tsv, test_matched.tsv + test_mismatched.tsv,
         and the AX diagnostic when it is found beside them (AX.tsv or diagnostic/diagnostic.tsv)
  qnli   (index question sentence label), rte and wnli (index sentence1 sentence2 label)
  ax     the diagnostic only (predict with an MNLI model): AX.tsv or diagnostic.tsv
  swag   train.csv val.csv test.csv (quoted CSV: sent1, sent2, ending0..3, label); 4 choices
  tsv    train.tsv dev.tsv test.tsv of the user: label<TAB>text_a[<TAB>text_b], no header,
         labels from --label_list (test.tsv: the same columns, its labels are ignored)

Files are split on tabs only, with no quote handling, as the original reader (csv quotechar=None):
GLUE sentences hold unbalanced quotes. Every problem names the file and line: a header missing or
unexpected, a row with a different number of fields than the header, a label outside the task's
list, an empty file. Rows with bad fields or labels can instead be skipped and counted
(`skip_bad_rows`, train and dev only: a submission needs every test row).

Packing follows the original `convert_single_example`: `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`,
segment ids 0 then 1, and when too long the longer side loses its last token first.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from data_prep.errors import InputError, input_error
from data_prep.tokenization import UNK_TOKEN, read_utf8_lines

logger = logging.getLogger(__name__)

CLASSIFICATION, REGRESSION, MULTIPLE_CHOICE = "classification", "regression", "multiple_choice"
# How many skipped rows or truncated examples a warning lists by file and line.
SHOWN = 5


@dataclasses.dataclass(frozen=True)
class Example:
    """One labelled or unlabelled example, with where it came from.

    guid: where it was read, `path:line` (or `tfds name:split:row`), for messages.
    index: the id its GLUE submission row carries (the file's index column, else the row from 0).
    text_a, text_b: the one or two texts (text_b None for single-sentence tasks). For multiple
      choice, text_a is the context and choice i is `text_b + " " + endings[i]`.
    label: the label as written in the file (a float's text for regression), None for test rows.
    """

    guid: str
    index: str
    text_a: str
    text_b: str | None = None
    label: str | None = None
    endings: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Layout:
    """Columns of one official file.

    columns: with a header, the names that must appear in it; without one, every column in order.
    text_a ... index: column names (index None: rows are numbered from 0).
    min_fields: only for the headerless `tsv` task, where text_b is optional.
    """

    columns: tuple[str, ...]
    has_header: bool
    text_a: str
    text_b: str | None = None
    label: str | None = None
    index: str | None = None
    endings: tuple[str, ...] = ()
    delimiter: str = "\t"
    min_fields: int | None = None


@dataclasses.dataclass(frozen=True)
class Split:
    """One file of a task: a name (train, dev, matched, test ...), candidate paths relative to
    data_dir (the first that exists is read), its layout, the GLUE submission file name for test
    splits, and where tensorflow-datasets keeps it."""

    name: str
    files: tuple[str, ...]
    layout: Layout
    submission: str | None = None
    optional: bool = False
    tfds_split: str | None = None
    tfds_name: str | None = None  # when not the task's own builder (AX beside MNLI)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """A task: its kind, labels (in id order), GLUE metrics and splits.

    labels: label texts in id order for classification; () for regression; the choice numbers
      for multiple choice. metrics: names from training/metrics.py; the first dev split's mean of
      them (GLUE's task score) picks the best checkpoint.
    tfds_name / tfds_text: the tensorflow-datasets builder and the feature names of text_a, text_b.
    """

    name: str
    kind: str
    labels: tuple[str, ...]
    metrics: tuple[str, ...]
    train: Split | None
    dev: tuple[Split, ...]
    test: tuple[Split, ...]
    tfds_name: str | None = None
    tfds_text: tuple[str, str | None] = ("sentence", None)

    @property
    def num_choices(self) -> int:
        return len(self.labels) if self.kind == MULTIPLE_CHOICE else 0

    @property
    def num_outputs(self) -> int:
        """Width of the model's output: classes, 1 for regression and per choice."""
        return len(self.labels) if self.kind == CLASSIFICATION else 1


@dataclasses.dataclass
class SplitData:
    """What was read for one split: examples plus the rows skipped (`where: why` strings)."""

    split: Split
    source: str
    examples: list[Example]
    skipped: list[str] = dataclasses.field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# The tasks
# ---------------------------------------------------------------------------------------------

_BINARY = ("0", "1")
_NLI = ("contradiction", "entailment", "neutral")  # the original run_classifier's order
_QNLI = ("entailment", "not_entailment")


def _headed(a: str, b: str | None, label: str | None, index: str | None = "index", **kw) -> Layout:
    """A layout with a header row; the named columns must appear in it."""
    needed = tuple(c for c in (index, a, b, label) if c) + tuple(kw.get("endings", ()))
    return Layout(needed, True, text_a=a, text_b=b, label=label, index=index, **kw)


def _glue(name, kind, labels, metrics, *, labelled, test, submission, tfds) -> TaskSpec:
    """A GLUE task with train.tsv, dev.tsv and test.tsv; tfds = (builder, text_a, text_b)."""
    return TaskSpec(
        name,
        kind,
        labels,
        metrics,
        train=Split("train", ("train.tsv",), labelled, tfds_split="train"),
        dev=(Split("dev", ("dev.tsv",), labelled, tfds_split="validation"),),
        test=(Split("test", ("test.tsv",), test, submission, tfds_split="test"),),
        tfds_name=tfds[0],
        tfds_text=tfds[1:],
    )


_PAIR_TEST = _headed("sentence1", "sentence2", None)  # RTE, WNLI, MNLI and AX test files
# The GLUE download script writes the diagnostic to glue_data/diagnostic/diagnostic.tsv; the
# current GLUE site serves it as AX.tsv. Beside MNLI it is optional.
_AX_FILES = (
    "AX.tsv",
    "diagnostic.tsv",
    "diagnostic/diagnostic.tsv",
    "../diagnostic/diagnostic.tsv",
)
_AX_SPLIT = Split("ax", _AX_FILES, _PAIR_TEST, "AX.tsv", True, "test", "glue/ax")
_MNLI = _headed("sentence1", "sentence2", "gold_label")


def _swag(label: str | None) -> Layout:
    """SWAG's CSV (train.csv, val.csv, test.csv): context sent1, then sent2 + each ending."""
    endings = ("ending0", "ending1", "ending2", "ending3")
    return _headed("sent1", "sent2", label, index=None, delimiter=",", endings=endings)


TASKS: dict[str, TaskSpec] = {
    "cola": _glue(
        "cola", CLASSIFICATION, _BINARY, ("mcc",),
        labelled=Layout(("source", "label", "original_label", "sentence"), False, "sentence",
                        label="label"),
        test=_headed("sentence", None, None),
        submission="CoLA.tsv",
        tfds=("glue/cola", "sentence", None),
    ),
    "sst-2": _glue(
        "sst-2", CLASSIFICATION, _BINARY, ("accuracy",),
        labelled=_headed("sentence", None, "label", index=None),
        test=_headed("sentence", None, None),
        submission="SST-2.tsv",
        tfds=("glue/sst2", "sentence", None),
    ),
    "mrpc": _glue(
        "mrpc", CLASSIFICATION, _BINARY, ("f1", "accuracy"),
        labelled=_headed("#1 String", "#2 String", "Quality", index=None),
        test=_headed("#1 String", "#2 String", None),
        submission="MRPC.tsv",
        tfds=("glue/mrpc", "sentence1", "sentence2"),
    ),
    "sts-b": _glue(
        "sts-b", REGRESSION, (), ("pearson", "spearman"),
        labelled=_headed("sentence1", "sentence2", "score"),
        test=_PAIR_TEST,
        submission="STS-B.tsv",
        tfds=("glue/stsb", "sentence1", "sentence2"),
    ),
    "qqp": _glue(
        "qqp", CLASSIFICATION, _BINARY, ("f1", "accuracy"),
        labelled=_headed("question1", "question2", "is_duplicate", index="id"),
        test=_headed("question1", "question2", None, index="id"),
        submission="QQP.tsv",
        tfds=("glue/qqp", "question1", "question2"),
    ),
    "mnli": TaskSpec(
        "mnli", CLASSIFICATION, _NLI, ("accuracy",),
        train=Split("train", ("train.tsv",), _MNLI, tfds_split="train"),
        dev=(
            Split("matched", ("dev_matched.tsv",), _MNLI, tfds_split="validation_matched"),
            Split("mismatched", ("dev_mismatched.tsv",), _MNLI, tfds_split="validation_mismatched"),
        ),
        test=(
            Split("matched", ("test_matched.tsv",), _PAIR_TEST, "MNLI-m.tsv",
                  tfds_split="test_matched"),
            Split("mismatched", ("test_mismatched.tsv",), _PAIR_TEST, "MNLI-mm.tsv",
                  tfds_split="test_mismatched"),
            _AX_SPLIT,
        ),
        tfds_name="glue/mnli",
        tfds_text=("premise", "hypothesis"),
    ),
    "qnli": _glue(
        "qnli", CLASSIFICATION, _QNLI, ("accuracy",),
        labelled=_headed("question", "sentence", "label"),
        test=_headed("question", "sentence", None),
        submission="QNLI.tsv",
        tfds=("glue/qnli", "question", "sentence"),
    ),
    "rte": _glue(
        "rte", CLASSIFICATION, _QNLI, ("accuracy",),
        labelled=_headed("sentence1", "sentence2", "label"),
        test=_PAIR_TEST,
        submission="RTE.tsv",
        tfds=("glue/rte", "sentence1", "sentence2"),
    ),
    "wnli": _glue(
        "wnli", CLASSIFICATION, _BINARY, ("accuracy",),
        labelled=_headed("sentence1", "sentence2", "label"),
        test=_PAIR_TEST,
        submission="WNLI.tsv",
        tfds=("glue/wnli", "sentence1", "sentence2"),
    ),
    # The diagnostic has no public labels: predict it with an MNLI model (GLUE scores it by R3,
    # a Matthews correlation over the three classes).
    "ax": TaskSpec(
        "ax", CLASSIFICATION, _NLI, ("mcc",),
        train=None,
        dev=(),
        test=(dataclasses.replace(_AX_SPLIT, files=_AX_FILES[:2], optional=False),),
        tfds_name="glue/ax",
        tfds_text=("premise", "hypothesis"),
    ),
    "swag": TaskSpec(
        "swag", MULTIPLE_CHOICE, ("0", "1", "2", "3"), ("accuracy",),
        train=Split("train", ("train.csv",), _swag("label")),
        dev=(Split("dev", ("val.csv",), _swag("label")),),
        test=(Split("test", ("test.csv",), _swag(None), "SWAG.tsv"),),
    ),
}  # fmt: skip
_TSV_LAYOUT = Layout(
    ("label", "text_a", "text_b"), False, "text_a", "text_b", "label", None, min_fields=2
)


def get_task(name: str, label_list: Sequence[str] = ()) -> TaskSpec:
    """The TaskSpec for `--task_name` (case and '-' / '_' ignored: SST-2, sst2, sst_2).

    `tsv` needs `label_list` (at least two distinct labels); other tasks refuse one.
    Raises ValueError naming the known tasks.
    """
    key = name.lower().replace("_", "").replace("-", "")
    if key == "tsv":
        labels = tuple(str(x).strip() for x in label_list if str(x).strip())
        if len(labels) < 2 or len(set(labels)) != len(labels):
            raise ValueError(
                f"--task_name=tsv needs --label_list with at least two distinct labels, found "
                f"{list(label_list)}"
            )
        layout = _TSV_LAYOUT
        return TaskSpec(
            "tsv",
            CLASSIFICATION,
            labels,
            ("accuracy",),
            Split("train", ("train.tsv",), layout),
            (Split("dev", ("dev.tsv",), layout),),
            (
                Split(
                    "test",
                    ("test.tsv",),
                    dataclasses.replace(layout, label=None),
                    "predictions.tsv",
                ),
            ),
        )
    by_key = {k.replace("-", ""): v for k, v in TASKS.items()}
    if key not in by_key:
        raise ValueError(f"unknown task {name!r}; expected one of {[*TASKS, 'tsv']}")
    if label_list:
        raise ValueError(f"--label_list is only for --task_name=tsv; {name} has fixed labels")
    return by_key[key]


# ---------------------------------------------------------------------------------------------
# Reading files
# ---------------------------------------------------------------------------------------------


def find_split_file(split: Split, data_dir: str | os.PathLike) -> Path | None:
    """The first of the split's candidate files that exists under data_dir, else None."""
    for name in split.files:
        path = Path(data_dir) / name
        if path.is_file():
            return path
    return None


def _rows(path: Path, delimiter: str):
    """Yields (line number, fields) of a TSV (split on tabs, no quoting) or a quoted CSV."""
    if delimiter == "\t":
        for number, text in read_utf8_lines(path):
            yield number, text.split("\t")
        return
    try:
        handle = open(path, encoding="utf-8-sig", newline="")
    except OSError as e:
        raise input_error(str(path), "a readable file", e.strerror or str(e)) from None
    with handle:
        reader = csv.reader(handle, delimiter=delimiter)
        start = 1
        try:
            for fields in reader:
                # A quoted field may span lines; name the line the record starts on.
                yield start, fields
                start = reader.line_num + 1
        except (csv.Error, UnicodeDecodeError) as e:
            raise input_error(f"{path}:{start}", "CSV text in UTF-8", str(e)) from None


def _short(fields: list[str], delimiter: str = "\t", width: int = 80) -> str:
    text = delimiter.join(fields)
    return repr(text if len(text) <= width else text[:width] + "...")


def read_file(
    path: str | os.PathLike,
    layout: Layout,
    labels: tuple[str, ...] = (),
    regression: bool = False,
    skip_bad_rows: bool = False,
    task_name: str = "",
) -> tuple[list[Example], list[str]]:
    """Reads one file in `layout` into Examples.

    Args:
      path: the file.
      layout: its columns (see Layout).
      labels: allowed label texts (classification and multiple choice); ignored for regression.
      regression: labels must parse as floats.
      skip_bad_rows: skip (and count) a row with the wrong number of fields, a bad label or an
        empty text instead of raising.
      task_name: named in messages.
    Returns (examples, skipped) with skipped a list of `path:line: reason` strings.
    Raises InputError naming the file and line: an empty file, a missing or unexpected header,
    and (unless skip_bad_rows) a bad row.
    """
    path = Path(path)
    what = f"the official {task_name} layout" if task_name else "the expected layout"
    rows = _rows(path, layout.delimiter)
    first = next(rows, None)
    if first is None:
        raise input_error(str(path), f"rows in {what}", "an empty file")
    if layout.has_header:
        number, header = first
        header = [h.strip() for h in header]
        missing = [c for c in layout.columns if c not in header]
        if missing:
            raise input_error(
                f"{path}:{number}",
                f"a header row naming the columns {list(layout.columns)} ({what})",
                f"{_short(header, layout.delimiter)} (no column {missing})",
            )
        position = {c: header.index(c) for c in layout.columns}
        num_fields = len(header)
        data = rows
    else:
        position = {c: i for i, c in enumerate(layout.columns)}
        num_fields = len(layout.columns)

        def chain():
            yield first
            yield from rows

        data = chain()

    examples: list[Example] = []
    skipped: list[str] = []
    pair_fields = None  # the headerless tsv task: 2 or 3 fields, fixed by the first row
    for row_index, (number, fields) in enumerate(data):
        where = f"{path}:{number}"
        problem = None
        if layout.min_fields is not None:
            if pair_fields is None and layout.min_fields <= len(fields) <= num_fields:
                pair_fields = len(fields)
            expected = pair_fields or f"{layout.min_fields} to {num_fields}"
            if len(fields) != pair_fields:
                problem = (f"{expected} tab-separated fields", f"{len(fields)}")
        elif len(fields) != num_fields:
            expected = f"{num_fields} fields" + (" as the header" if layout.has_header else "")
            problem = (expected, f"{len(fields)}: {_short(fields, layout.delimiter)}")
        label = None
        if problem is None and layout.label:
            label = fields[position[layout.label]].strip()
            if regression:
                try:
                    float(label)
                except ValueError:
                    problem = ("a number as the label", repr(label))
            elif label not in labels:
                problem = (f"a label in {list(labels)}", repr(label))
                if not layout.has_header and not examples and row_index == 0:
                    raise input_error(
                        where,
                        f"a data row ({task_name or 'this'} file has no header row) with a label "
                        f"in {list(labels)}",
                        f"{_short(fields, layout.delimiter)}, which looks like a header",
                    )
        if problem is None:
            text_b = None
            if (
                layout.text_b
                and layout.text_b in position
                and position[layout.text_b] < len(fields)
            ):
                text_b = fields[position[layout.text_b]].strip()
            example = Example(
                guid=where,
                index=fields[position[layout.index]].strip() if layout.index else str(row_index),
                text_a=fields[position[layout.text_a]].strip(),
                text_b=text_b,
                label=label,
                endings=tuple(fields[position[e]].strip() for e in layout.endings),
            )
            if not example.text_a and not example.text_b:
                problem = ("some text", "empty text fields")
        if problem is not None:
            if not skip_bad_rows:
                hint = (
                    " (or pass --skip_bad_rows to skip and count such rows)" if layout.label else ""
                )
                raise InputError(f"{where}: expected {problem[0]}, found {problem[1]}{hint}")
            skipped.append(f"{where}: expected {problem[0]}, found {problem[1]}")
            continue
        examples.append(example)
    if not examples:
        raise input_error(
            str(path), f"at least one data row in {what}", f"none ({len(skipped)} skipped)"
        )
    return examples, skipped


def read_split(
    task: TaskSpec,
    split: Split,
    data_dir: str | os.PathLike | None = None,
    tfds_name: str | None = None,
    tfds_data_dir: str | None = None,
    skip_bad_rows: bool = False,
) -> SplitData | None:
    """Reads one split from data_dir, or from tensorflow-datasets when tfds_name is given.

    Returns None for an optional split whose file is absent (AX beside MNLI). Test splits never
    skip rows. A skipped row is logged as a counted warning naming the first few lines.
    Raises InputError for a missing file or bad content.
    """
    if tfds_name:
        return read_tfds_split(task, split, tfds_name, tfds_data_dir)
    path = find_split_file(split, data_dir)
    if path is None:
        if split.optional:
            return None
        raise input_error(
            str(Path(data_dir) / split.files[0]),
            f"the {task.name} {split.name} file",
            "no such file" + (f" (also tried {list(split.files[1:])})" if split.files[1:] else ""),
        )
    is_test = split.submission is not None
    examples, skipped = read_file(
        path,
        split.layout,
        task.labels,
        task.kind == REGRESSION,
        skip_bad_rows and not is_test,
        task.name,
    )
    if skipped:
        logger.warning(
            "%s: skipped %d of %d rows (first %s)",
            path,
            len(skipped),
            len(skipped) + len(examples),
            "; ".join(skipped[:SHOWN]),
        )
    return SplitData(split, str(path), examples, skipped)


def tfds_builder(name: str) -> str:
    """`glue/sst2:2.0.0` -> `glue/sst2` (the builder without its version)."""
    return name.split(":")[0].strip()


def read_tfds_split(
    task: TaskSpec, split: Split, tfds_name: str, data_dir: str | None = None
) -> SplitData:
    """Loads one split of a GLUE task through tensorflow-datasets (needs the network the first
    time, or a prepared data_dir; tests use tfds.testing.mock_data).

    Labels: TFDS ClassLabel ids become the task's label texts by name where the names agree
    (MNLI, QNLI, RTE), else by id (the 0/1 tasks, whose TFDS ids are the GLUE file labels); -1
    (test) becomes None; STS-B keeps its float.
    """
    import tensorflow_datasets as tfds

    if task.tfds_name is None:
        raise ValueError(f"task {task.name} has no tensorflow-datasets builder; use --data_dir")
    wanted = split.tfds_name or task.tfds_name
    given = tfds_builder(tfds_name)
    name = tfds_name if given == wanted else wanted  # keep a version pin on the task's builder
    if given != task.tfds_name:
        raise ValueError(f"--tfds_name={tfds_name}: expected {task.tfds_name} for task {task.name}")
    if split.tfds_split is None:
        raise ValueError(f"{task.name} {split.name} has no tensorflow-datasets split")
    ds, info = tfds.load(
        name, split=split.tfds_split, with_info=True, data_dir=data_dir, shuffle_files=False
    )
    label_feature = info.features["label"] if "label" in info.features else None
    names = tuple(getattr(label_feature, "names", ()) or ())
    by_name = bool(names) and set(names) == set(task.labels)
    a_key, b_key = task.tfds_text
    examples = []
    for row, ex in enumerate(tfds.as_numpy(ds)):
        label = None
        if label_feature is not None and split.submission is None:
            raw = ex["label"]
            if task.kind == REGRESSION:
                label = repr(float(raw))
            elif int(raw) >= 0:
                label = names[int(raw)] if by_name else task.labels[int(raw)]
        examples.append(
            Example(
                guid=f"{name}:{split.tfds_split}:{row}",
                index=str(int(ex["idx"])) if "idx" in ex else str(row),
                text_a=ex[a_key].decode("utf-8"),
                text_b=ex[b_key].decode("utf-8") if b_key else None,
                label=label,
            )
        )
    if not examples:
        raise input_error(f"{name}:{split.tfds_split}", "at least one example", "none")
    return SplitData(split, f"{name}:{split.tfds_split}", examples)


# ---------------------------------------------------------------------------------------------
# Packing into BERT inputs
# ---------------------------------------------------------------------------------------------


def truncate_pair(tokens_a: list, tokens_b: list, max_tokens: int) -> tuple[list, list]:
    """Drops the last token of the longer list (b on a tie) until both fit in max_tokens.

    The original's `_truncate_seq_pair`: a token lost from the longer text costs less
    information than one from a short text. Returns new lists; the inputs are not changed.
    """
    a, b = list(tokens_a), list(tokens_b)
    while len(a) + len(b) > max_tokens:
        if len(a) > len(b):
            a.pop()
        else:
            b.pop()
    return a, b


@dataclasses.dataclass(frozen=True)
class Packing:
    """How a model's special tokens frame one text or a pair: `start a end` or
    `start a middle b end`, `start a middle` in segment 0 and `b end` in `second_segment`;
    padding is `pad`'s id (None: id 0, BERT's [PAD] in every published vocabulary); `unk` is
    the unknown token (conll.encode_sentences gives it to a word with no pieces). `tail`:
    tokens after `end` in `tail_segment` with no `start` (XLNet's `a <sep> b <sep> <cls>`,
    xlnet_packing); the first of the tail, else `start`, is where a span model reads "no
    answer" (null_index)."""

    start: str | None
    middle: tuple[str, ...]
    end: str
    second_segment: int
    pad: str | None = None
    unk: str = UNK_TOKEN
    tail: tuple[str, ...] = ()
    tail_segment: int = 0

    @property
    def head(self) -> list[str]:
        return [] if self.start is None else [self.start]

    @property
    def pair_specials(self) -> int:
        return len(self.head) + len(self.middle) + 1 + len(self.tail)

    @property
    def pair_form(self) -> str:
        """A pair as these tokens frame it, for messages: "[CLS] a [SEP] b [SEP]"."""
        return " ".join([*self.head, "a", *self.middle, "b", self.end, *self.tail])

    def null_index(self, length: int) -> int:
        """Where the no-answer token sits in a packed pair of `length` tokens (unpadded)."""
        return length - len(self.tail) if self.tail else 0

    def pad_id(self, tokenizer) -> int:
        """The id inputs are padded with in `tokenizer`'s vocabulary."""
        return 0 if self.pad is None else tokenizer.convert_tokens_to_ids([self.pad])[0]


# BERT sec. 3, fig. 2: [CLS] a [SEP] b [SEP], segment ids 0 then 1.
BERT_PACKING = Packing("[CLS]", ("[SEP]",), "[SEP]", 1)
# RoBERTa (fairseq's and Hugging Face's RobertaTokenizer): <s> a </s></s> b </s>, one segment
# type, padded with <pad>.
ROBERTA_PACKING = Packing("<s>", ("</s>", "</s>"), "</s>", 0, "<pad>", "<unk>")
# ALBERT (google-research/albert, Hugging Face's AlbertTokenizer): BERT's layout with its
# SentencePiece model's [CLS] and [SEP], padded with <pad> (id 0).
ALBERT_PACKING = Packing("[CLS]", ("[SEP]",), "[SEP]", 1, "<pad>", "<unk>")


def xlnet_packing(sep: str, cls: str, unk: str = UNK_TOKEN) -> Packing:
    """XLNet's pair layout (its released classifier_utils.py and squad code, Hugging Face's
    XLNetTokenizer): `a <sep> b <sep> <cls>`, segments 0, 1 and SEG_ID_CLS 2 for <cls>; padded
    with id 0 (input_mask hides it). sep / cls: the vocabulary's names for them."""
    return Packing(None, (sep,), sep, 1, None, unk, tail=(cls,), tail_segment=2)


def load_tokenizer(vocab_file, do_lower_case: bool, lower_case_given: bool = True):
    """(tokenizer, packing) of a run script's --vocab_file: a byte-level BPE folder is a RoBERTa
    checkpoint's vocabulary (bpe.RobertaTokenizer with ROBERTA_PACKING; cased, lower-cased only
    when do_lower_case was given explicitly, `lower_case_given`); a SentencePiece model (a
    `.model` file or a folder with spiece.model) an ALBERT checkpoint's (spiece.py's
    tokenization, lower-cased as ALBERT unless --do_lower_case=false, with ALBERT_PACKING);
    anything else a WordPiece vocab.txt (tokenization.FullTokenizer with BERT_PACKING). Raises
    InputError naming the file."""
    from data_prep import bpe, spiece, tokenization

    if model := spiece.model_file(vocab_file):
        tokenizer = spiece.SentencePieceTokenizer(model, do_lower_case)
        p = ALBERT_PACKING
        missing = [t for t in (p.start, p.end, p.pad, p.unk) if t not in tokenizer.vocab]
        if missing:
            raise input_error(
                str(model), f"ALBERT's pieces {[p.start, p.end, p.pad, p.unk]}",
                f"a SentencePiece model without {missing} (an XLNet's? XLNet configs read it "
                "in run_classifier)",
            )  # fmt: skip
        return tokenizer, ALBERT_PACKING
    if bpe.folder_files(vocab_file) is not None:
        lower = do_lower_case and lower_case_given
        return bpe.RobertaTokenizer.from_folder(vocab_file, lower), ROBERTA_PACKING
    return tokenization.FullTokenizer(vocab_file, do_lower_case), BERT_PACKING


def elmo_packing_error(packing: Packing, vocab_file) -> str | None:
    """Why an ELMo biLM cannot read this vocabulary (a RoBERTa BPE folder), or None."""
    if packing == BERT_PACKING:
        return None
    return (
        f"--vocab_file={vocab_file} is a byte-level BPE folder (RoBERTa's); an ELMo biLM reads "
        "the WordPiece vocab.txt it was pretrained on"
    )


def packing_mismatch(packing: Packing, config, config_file) -> str | None:
    """A warning when RoBERTa's packing meets a config whose positions start at 0: RoBERTa's
    checkpoints number them from 2 (BertConfig.position_offset), which convert_checkpoint.py
    --from=hf writes into the config it converts. None otherwise."""
    if packing == ROBERTA_PACKING and not getattr(config, "position_offset", 0):
        return (
            f"{config_file} has no position_offset, but --vocab_file is a RoBERTa BPE folder: "
            "RoBERTa checkpoints number positions from 2 (convert_checkpoint.py --from=hf writes "
            "position_offset into the config it converts)"
        )
    return None


def pack(
    tokens_a: list[str],
    tokens_b: list[str] | None,
    max_seq_length: int,
    packing: Packing = BERT_PACKING,
):
    """`[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` (or another `packing`), truncated to
    max_seq_length.

    Returns (tokens, segment_ids, truncated): segment id 0 for `[CLS] a [SEP]`, 1 for `b [SEP]`
    (BERT sec. 3, fig. 2); truncated is True when tokens were dropped.
    """
    p = packing
    tail = [p.tail_segment] * len(p.tail)
    if tokens_b is None:
        a = tokens_a[: max_seq_length - len(p.head) - 1 - len(p.tail)]  # room for [CLS] [SEP]
        segments = [0] * (len(p.head) + len(a) + 1) + tail
        return [*p.head, *a, p.end, *p.tail], segments, len(a) < len(tokens_a)
    a, b = truncate_pair(tokens_a, tokens_b, max_seq_length - p.pair_specials)
    tokens = [*p.head, *a, *p.middle, *b, p.end, *p.tail]
    segments = [0] * (len(p.head) + len(a) + len(p.middle)) + [p.second_segment] * (len(b) + 1)
    return tokens, segments + tail, len(a) + len(b) < len(tokens_a) + len(tokens_b)


@dataclasses.dataclass
class Encoded:
    """Padded model inputs for a list of examples.

    features: input_ids, input_mask, segment_ids int32 (N, S), or (N, C, S) for multiple choice;
      label_ids int32 (N,), or float32 (N,) for regression (0 for unlabelled rows).
    truncated: guids of the examples that lost tokens.
    """

    features: dict
    truncated: list[str]


def label_id(task: TaskSpec, label: str | None):
    """The label's id (classification, multiple choice) or value (regression); 0 when None."""
    if label is None:
        return 0.0 if task.kind == REGRESSION else 0
    if task.kind == REGRESSION:
        return float(label)
    return task.labels.index(label)


def second_texts(ex: Example, num_choices: int) -> list[str | None]:
    """The texts paired with ex.text_a, one sequence each: [text_b] (None for a single text),
    or for multiple choice `text_b + " " + ending` per ending (InputError naming the example
    when it holds other than num_choices endings)."""
    if not num_choices:
        return [ex.text_b]
    if len(ex.endings) != num_choices:
        raise input_error(ex.guid, f"{num_choices} endings", f"{len(ex.endings)}")
    return [f"{ex.text_b or ''} {e}" for e in ex.endings]


def encode_examples(
    examples: Sequence[Example],
    task: TaskSpec,
    tokenizer,
    max_seq_length: int,
    packing: Packing = BERT_PACKING,
) -> Encoded:
    """Tokenizes and packs examples into fixed-length arrays (see Encoded).

    tokenizer: a FullTokenizer or bpe.RobertaTokenizer (tokenize, convert_tokens_to_ids), with
    the packing of its special tokens. max_seq_length must leave room for the special tokens of
    a pair (3 for BERT, 4 for RoBERTa).
    """
    if max_seq_length < packing.pair_specials:
        raise ValueError(
            f"max_seq_length must be at least {packing.pair_specials}, found {max_seq_length}"
        )
    n, s = len(examples), max_seq_length
    c = task.num_choices
    shape = (n, c, s) if c else (n, s)
    ids = np.full(shape, packing.pad_id(tokenizer), np.int32)
    mask = np.zeros(shape, np.int32)
    segments = np.zeros(shape, np.int32)
    labels = np.zeros((n,), np.float32 if task.kind == REGRESSION else np.int32)
    truncated = []
    for i, ex in enumerate(examples):
        tokens_a = tokenizer.tokenize(ex.text_a)
        pairs = [
            (tokens_a, tokenizer.tokenize(b) if b is not None else None)
            for b in second_texts(ex, c)
        ]
        cut = False
        for j, (a, b) in enumerate(pairs):
            tokens, seg, was_cut = pack(a, b, s, packing)
            cut |= was_cut
            where = (i, j) if c else (i,)
            k = len(tokens)
            ids[(*where, slice(0, k))] = tokenizer.convert_tokens_to_ids(tokens)
            mask[(*where, slice(0, k))] = 1
            segments[(*where, slice(0, k))] = seg
        if cut:
            truncated.append(ex.guid)
        labels[i] = label_id(task, ex.label)
    features = {"input_ids": ids, "input_mask": mask, "segment_ids": segments, "label_ids": labels}
    return Encoded(features, truncated)


def log_truncation(name: str, encoded: Encoded, max_seq_length: int) -> None:
    """A counted warning naming the first truncated examples by file and line."""
    if encoded.truncated:
        n = len(encoded.features["label_ids"])
        logger.warning(
            "%s: %d of %d examples were longer than max_seq_length=%d and were truncated "
            "(longer text first), e.g. %s",
            name,
            len(encoded.truncated),
            n,
            max_seq_length,
            ", ".join(encoded.truncated[:SHOWN]),
        )


def pad_for_batches(features: dict, multiple: int) -> dict:
    """Pads every array to a multiple of `multiple` rows with all-zero rows and adds
    `is_real_example` (int32 (N',): 1 for the original rows, 0 for padding), as the original
    pads its eval and predict sets so every batch is full and every replica gets a slice."""
    n = len(features["label_ids"])
    total = max(multiple, -(-n // multiple) * multiple)
    out = {}
    for key, value in features.items():
        pad = np.zeros((total - n, *value.shape[1:]), value.dtype)
        out[key] = np.concatenate([value, pad])
    out["is_real_example"] = np.concatenate([np.ones(n, np.int32), np.zeros(total - n, np.int32)])
    return out


def label_values(task: TaskSpec, examples: Sequence[Example]) -> np.ndarray:
    """Labels of labelled examples as ids (int64) or values (float64 for regression), (N,)."""
    dtype = np.float64 if task.kind == REGRESSION else np.int64
    return np.array([label_id(task, ex.label) for ex in examples], dtype)


def write_tfrecord(path: str | os.PathLike, features: dict, regression: bool = False) -> int:
    """Writes encoded features (see Encoded) as the original's train.tf_record, atomically.

    Returns the number of records. Same features, same bytes.
    """
    import tensorflow as tf

    from data_prep import features as specs

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    n = len(features["label_ids"])
    try:
        with tf.io.TFRecordWriter(str(tmp)) as writer:
            for i in range(n):
                writer.write(
                    specs.serialize_classifier_example(
                        features["input_ids"][i],
                        features["input_mask"][i],
                        features["segment_ids"][i],
                        features["label_ids"][i],
                        regression=regression,
                    )
                )
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n


def dynamic_padding_setting(
    requested: bool, explicit: bool, reasons, flag: str = "dynamic_padding"
) -> bool:
    """Whether a fine-tuning script cuts its batches (features.trim_to_longest): `requested` (its
    --dynamic_padding, or the `flag` named) unless one of `reasons`, (applies, why) pairs,
    applies. A request given explicitly where one applies raises ValueError naming the first;
    the default turns off."""
    why = next((why for applies, why in reasons if applies), None)
    if why and requested and explicit:
        raise ValueError(f"--{flag}: not here ({why}); drop the flag")
    return requested and why is None


# --group_by_length's group: 50 batches, as Hugging Face's LengthGroupedSampler's megabatches.
LENGTH_GROUP_BATCHES = 50


def length_group_batches(
    group_by_length: bool, dynamic_padding: bool, padding_flag: str = "dynamic_padding"
) -> int:
    """The batches a fine-tuning script's training input sorts by length at a time
    (features.classifier_dataset's `length_group_batches`): LENGTH_GROUP_BATCHES under
    --group_by_length, else 0. Raises ValueError when training batches are not cut (nothing to
    gain), naming `padding_flag`, the script's flag that cuts them."""
    if group_by_length and not dynamic_padding:
        raise ValueError(f"--group_by_length: needs --{padding_flag}, which is off here (grouped "
                         "batches gain only by being cut); drop the flag")  # fmt: skip
    if not group_by_length:
        return 0
    logger.info(
        "--group_by_length: training examples sorted by length %d batches at a time",
        LENGTH_GROUP_BATCHES,
    )
    return LENGTH_GROUP_BATCHES


def log_real_tokens(name: str, input_mask, max_seq_length: int, cut: str | None) -> None:
    """Logs the share of a split's positions that are real tokens (input_mask (N, S) of 1 / 0);
    `cut` names what a batch is cut to under --dynamic_padding ("example", "window"), None when
    batches keep max_seq_length."""
    import numpy as np

    logger.info(
        "%s: %.1f%% of the %d positions are real tokens%s",
        name,
        100 * float(np.mean(input_mask)),
        max_seq_length,
        f"; each batch is cut to its longest {cut} (--dynamic_padding)" if cut else "",
    )


def eval_batches(features: dict, batch_size: int, num_shards: int = 1, shard_index: int = 0):
    """In-order batches of an eval or predict set for one worker, padded to full global batches.

    features: encoded arrays (N rows). The set is padded to a multiple of batch_size (the global
    batch) with `is_real_example` 0 rows, cut into per-worker batches of batch_size / num_shards,
    and worker k takes batches k, k + num_shards, ...: gathering a step's outputs over workers
    then gives consecutive rows. Returns a tf.data.Dataset of dicts of (batch_size / num_shards,
    ...) tensors.
    """
    import tensorflow as tf

    if batch_size % num_shards:
        raise ValueError(f"batch size {batch_size} is not divisible by {num_shards} workers")
    padded = pad_for_batches(features, batch_size)
    dataset = tf.data.Dataset.from_tensor_slices(padded).batch(batch_size // num_shards)
    return dataset.shard(num_shards, shard_index) if num_shards > 1 else dataset


# ---------------------------------------------------------------------------------------------
# Submission files
# ---------------------------------------------------------------------------------------------


def prediction_texts(task: TaskSpec, outputs: np.ndarray) -> list[str]:
    """Model outputs -> what a GLUE submission row holds.

    outputs: float (N, C) logits for classification and multiple choice, (N,) or (N, 1) scores
    for regression. Classification gives the label text (e.g. "entailment", "1"), regression
    the score with 3 decimals, multiple choice the chosen ending's number.
    """
    outputs = np.asarray(outputs)
    if task.kind == REGRESSION:
        return [f"{float(x):.3f}" for x in outputs.reshape(-1)]
    return [task.labels[int(i)] for i in np.argmax(outputs, axis=-1)]


def write_submission(path: str | os.PathLike, indices: Sequence[str], predictions: Sequence[str]):
    """Writes `index<TAB>prediction` with that header (GLUE's submission format), atomically."""
    if len(indices) != len(predictions):
        raise ValueError(f"{len(indices)} indices but {len(predictions)} predictions")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write("index\tprediction\n")
            for i, p in zip(indices, predictions):
                f.write(f"{i}\t{p}\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_submission(path: str | os.PathLike, header: str = "index\tprediction"):
    """Reads a submission file (or another two-column TSV with `header`) back:
    [(index, prediction)]; checks the header and that every row has two fields."""
    rows = read_utf8_lines(path)
    first = next(rows, None)
    if first is None or first[1] != header:
        found = "an empty file" if first is None else repr(first[1])
        raise input_error(f"{path}:1", f"the header {header!r}", found)
    out = []
    for number, text in rows:
        fields = text.split("\t")
        if len(fields) != 2:
            raise input_error(f"{path}:{number}", f"two fields as {header!r}", repr(text))
        out.append((fields[0], fields[1]))
    return out
