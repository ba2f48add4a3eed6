"""Encoder-decoder denoising data (T5, BART): corpus documents -> (encoder inputs, decoder targets).

The token ids are byte-level BPE (data_prep/bpe.py, GPT-2's files) with the special tokens an
encoder-decoder needs appended after the BPE vocabulary (`Seq2SeqVocab`): <pad> (also the decoder
start, as in T5), </s>, <mask> (BART), <s> (BART's sequence start, only when asked for) and the
sentinels <extra_id_i>, counted down from the vocabulary's end as T5 does. Tokens already in
encoder.json under those names keep their ids (a RoBERTa / BART vocab.json: <s> 0, <pad> 1,
</s> 2, <mask> last).

  read_sentence_documents  corpus documents as lists of sentences (lm_data's reader)
  chunk_sentences          consecutive sentences grouped into chunks of at most N tokens
  t5_chunk_length          the longest raw chunk whose span corruption fits both lengths
  t5_instance, bart_instance  one chunk -> (inputs, targets), each ending with </s> (BART's
                           also starting with <s>, as the released BART's were)
  create_instances         documents -> instances, pure given the rng
  write_seq2seq_tfrecords  TFRecords with input_ids, input_mask, target_ids, target_mask
  seq2seq_dataset          batches of those four features for training or evaluation

Making records imports no TensorFlow, as data_prep/lm_data.py's blocks (the same bytes as
tf.train.Example through tf.io.TFRecordWriter, tested; protobuf's serialization took longer than
the noising here), so create_seq2seq_data.py forks its tokenizing workers. The readers import it
when called.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from data_prep import bpe, lm_data, noising
from data_prep.errors import input_error
from data_prep.pretraining_shards import int64_example, packed_varints, write_round_robin

if TYPE_CHECKING:
    import tensorflow as tf

PAD, EOS, MASK, BOS = "<pad>", "</s>", "<mask>", "<s>"
# T5 reserves 100 sentinels (Raffel et al. 2020, its released vocabulary's extra_ids).
NUM_SENTINELS = 100
NOISINGS = ("t5_span", "bart_infill")
FEATURES = ("input_ids", "input_mask", "target_ids", "target_mask")
WRITE_BATCH = 512  # instances serialized together (packed_varints works on a whole batch)


def sentinel_name(i: int) -> str:
    return f"<extra_id_{i}>"


@dataclasses.dataclass(frozen=True)
class Seq2SeqVocab:
    """A byte-level BPE tokenizer (or a released T5's SentencePiece model: from_spiece) plus the
    special ids of an encoder-decoder.

    size: the vocabulary the model needs (T5Config.vocab_size at least this); pad_id doubles as
    the decoder start id (T5Config.decoder_start_token_id), eos_id ends inputs and targets.
    bos_id: BART's <s>, which starts its inputs and targets (None: T5, which has none).
    mask_id: BART's <mask> (None: a SentencePiece T5's vocabulary, which has none).
    """

    tokenizer: bpe.ByteLevelBPE
    pad_id: int
    eos_id: int
    mask_id: int | None
    sentinel_ids: tuple[int, ...]
    size: int
    bos_id: int | None = None

    @classmethod
    def from_bpe(
        cls, tokenizer: bpe.ByteLevelBPE, num_sentinels: int = NUM_SENTINELS, bos: bool = False
    ):
        """bos: also a <s> (BART), placed after <mask> so T5's ids are the same either way."""
        encoder = tokenizer.encoder
        next_id = len(encoder)  # GPT-2's layout: ids are 0 .. len - 1

        def special(name):
            nonlocal next_id
            if name in encoder:
                return encoder[name]
            next_id += 1
            return next_id - 1

        pad, eos, mask = special(PAD), special(EOS), special(MASK)
        bos_id = special(BOS) if bos else None
        # Sentinel 0 gets the highest id, as T5's extra_id_0 is the vocabulary's last entry.
        missing = [i for i in range(num_sentinels) if sentinel_name(i) not in encoder]
        top = next_id + len(missing) - 1
        ids = []
        for i in range(num_sentinels):
            if sentinel_name(i) in encoder:
                ids.append(encoder[sentinel_name(i)])
            else:
                ids.append(top)
                top -= 1
        size = max(next_id + len(missing), max(encoder.values()) + 1)
        return cls(tokenizer, pad, eos, mask, tuple(ids), size, bos_id)

    @classmethod
    def from_files(
        cls, encoder_file, merges_file, num_sentinels: int = NUM_SENTINELS, bos: bool = False
    ):
        tokenizer = bpe.ByteLevelBPE.from_files(encoder_file, merges_file)
        return cls.from_bpe(tokenizer, num_sentinels, bos)

    @classmethod
    def from_spiece(cls, model_file, num_sentinels: int = NUM_SENTINELS):
        """A released T5's vocabulary: its SentencePiece model's pieces (the library's own, as
        Hugging Face's T5Tokenizer: spiece.SentencePieceTokenizer without preprocessing), its
        <pad> and </s>, and num_sentinels <extra_id_i> after the pieces, extra_id_0 the last
        (T5Tokenizer's extra_ids). Raises InputError naming the file without <pad> or </s>."""
        from data_prep import spiece

        tokenizer = spiece.SentencePieceTokenizer(model_file, preprocess=False)
        missing = [t for t in (PAD, EOS) if t not in tokenizer.vocab]
        if missing:
            where = str(model_file)
            raise input_error(where, f"T5's pieces {[PAD, EOS]}", f"a model without {missing}")
        n = len(tokenizer.vocab)
        sentinels = tuple(n + num_sentinels - 1 - i for i in range(num_sentinels))
        pad, eos = tokenizer.vocab[PAD], tokenizer.vocab[EOS]
        return cls(tokenizer, pad, eos, None, sentinels, n + num_sentinels)

    def special_names(self) -> dict[int, str]:
        names = {self.pad_id: PAD, self.eos_id: EOS}
        if self.mask_id is not None:
            names[self.mask_id] = MASK
        if self.bos_id is not None:
            names[self.bos_id] = BOS
        return names | {t: sentinel_name(i) for i, t in enumerate(self.sentinel_ids)}

    def wrap(self, ids: Sequence[int]) -> list[int]:
        """One sequence as the model reads it: `<s> ids </s>` with a bos_id (BART), else
        `ids </s>` (T5)."""
        start = [] if self.bos_id is None else [self.bos_id]
        return start + list(ids) + [self.eos_id]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: Iterable[int], stop_at_eos: bool = True) -> str:
        """Text of ids: stops at the first </s> (stop_at_eos), drops <pad> and <s>, writes the
        other special tokens by name."""
        names, out, run = self.special_names(), [], []
        for i in (int(x) for x in ids):
            if i == self.eos_id and stop_at_eos:
                break
            if i in names:
                out.append(self.tokenizer.decode(run))
                run = []
                if i not in (self.pad_id, self.bos_id):
                    out.append(names[i])
            else:
                run.append(i)
        return "".join(out) + self.tokenizer.decode(run)

    def check_config(self, config, where: str, decoder_start_id: int | None = None) -> None:
        """Refuses a T5Config (or BartConfig) whose vocabulary or special ids do not fit this
        vocabulary. decoder_start_id: None = pad_id (T5's convention); BART starts from eos_id.
        With a bos_id the config's bos_token_id must be it."""
        expected = {
            "pad_token_id": self.pad_id,
            "eos_token_id": self.eos_id,
            "decoder_start_token_id": self.pad_id if decoder_start_id is None else decoder_start_id,
        }
        if self.bos_id is not None:
            expected["bos_token_id"] = self.bos_id
        wrong = {k: getattr(config, k) for k, v in expected.items() if getattr(config, k) != v}
        if config.vocab_size < self.size or wrong:
            raise input_error(
                where,
                f"vocab_size >= {self.size} and {expected} (the BPE vocabulary's special ids)",
                f"vocab_size {config.vocab_size}" + (f" and {wrong}" if wrong else ""),
            )


def read_sentence_documents(paths: Sequence[str]) -> Iterator[list[str]]:
    """Each corpus document (one sentence a line, blank lines between documents) as its lines."""
    for text in lm_data.read_lm_documents(paths):
        yield text.split("\n")


def encode_sentences(vocab: Seq2SeqVocab, sentences: Sequence[str]) -> list[list[int]]:
    """Each sentence's ids, with its line break kept so decoding gives the lines back (a byte-level
    BPE's; a SentencePiece model has no line break, and its pieces start each word anew)."""
    if isinstance(vocab.tokenizer, bpe.ByteLevelBPE):
        return [vocab.encode(s + "\n") for s in sentences]
    return [vocab.encode(s) for s in sentences]


def encode_document(vocab: Seq2SeqVocab, text: str) -> list[list[int]]:
    """encode_sentences of one of lm_data.read_lm_documents' texts (its sentences joined by
    line breaks), as read_sentence_documents gives them."""
    return encode_sentences(vocab, text.split("\n"))


def chunk_sentences(sentences: Sequence[Sequence[int]], length: int) -> list[list[list[int]]]:
    """Groups consecutive sentences into chunks of at most `length` tokens; a sentence longer than
    that is cut into pieces of `length`. Every token is kept, in order."""
    chunks, current, used = [], [], 0
    for sentence in sentences:
        pieces = [list(sentence[i : i + length]) for i in range(0, len(sentence), length)]
        for piece in pieces:
            if used + len(piece) > length and current:
                chunks.append(current)
                current, used = [], 0
            current.append(piece)
            used += len(piece)
    if current:
        chunks.append(current)
    return chunks


def t5_lengths(n: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """(inputs, targets) lengths, </s> included, of span-corrupting n tokens: deterministic in n
    (noising.t5_span_corruption's counts)."""
    num_noise = min(max(int(round(n * noise_density)), 1), n - 1)
    num_spans = max(int(round(num_noise / mean_noise_span_length)), 1)
    num_spans = min(num_spans, num_noise, n - num_noise)
    return n - num_noise + num_spans + 1, num_noise + num_spans + 1


def t5_chunk_length(
    max_seq_length: int,
    max_target_length: int,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
) -> int:
    """The longest raw chunk whose corrupted inputs and targets fit (T5's random_spans_helper
    does this search for its 512 / 114 lengths)."""
    best = 0
    for n in range(2, 4 * (max_seq_length + max_target_length)):
        i, t = t5_lengths(n, noise_density, mean_noise_span_length)
        if i <= max_seq_length and t <= max_target_length:
            best = n
    if best == 0:
        raise ValueError(
            f"no chunk of 2 or more tokens fits inputs of {max_seq_length} and targets of "
            f"{max_target_length} ids after span corruption"
        )
    return best


def t5_instance(
    tokens: Sequence[int],
    vocab: Seq2SeqVocab,
    rng: np.random.Generator,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
) -> tuple[list[int], list[int]]:
    """T5 span corruption of one chunk (Raffel et al. 2020, sec. 3.1.4), each side ending in
    </s>."""
    inputs, targets = noising.t5_span_corruption(
        tokens, vocab.sentinel_ids, rng, noise_density, mean_noise_span_length
    )
    return inputs + [vocab.eos_id], targets + [vocab.eos_id]


def bart_instance(
    sentences: Sequence[Sequence[int]],
    vocab: Seq2SeqVocab,
    rng: np.random.Generator,
    mask_ratio: float = 0.3,
    poisson_lambda: float = 3.0,
    permute: bool = False,
) -> tuple[list[int], list[int]]:
    """BART's noising of one chunk (Lewis et al. 2020, sec. 2.2): the sentences permuted
    (permute), then text infilling; the target is the original chunk. Both are `<s> ... </s>`,
    the layout the released BART was pretrained on (fairseq's and Hugging Face's: the decoder
    then reads `</s> <s> ...`, the targets shifted right after decoder_start_token_id = </s>)."""
    if vocab.bos_id is None:
        raise ValueError("bart_instance: expected a Seq2SeqVocab with a <s> (from_bpe bos=True)")
    original = [t for s in sentences for t in s]
    if permute:
        sentences, _ = noising.permute_sentences(list(sentences), rng)
    shuffled = [t for s in sentences for t in s]
    noised, _ = noising.bart_text_infilling(
        shuffled, vocab.mask_id, rng, mask_ratio, poisson_lambda
    )
    return vocab.wrap(noised), vocab.wrap(original)


@dataclasses.dataclass(frozen=True)
class NoisingSettings:
    noising: str  # one of NOISINGS
    max_seq_length: int
    max_target_length: int
    noise_density: float = 0.15  # T5 sec. 3.3.4
    mean_noise_span_length: float = 3.0
    mask_ratio: float = 0.3  # BART sec. 2.2 / its released recipe
    poisson_lambda: float = 3.0
    permute_sentences: bool = False

    def __post_init__(self):
        if self.noising not in NOISINGS:
            raise ValueError(f"noising: expected one of {NOISINGS}, found {self.noising!r}")
        if self.permute_sentences and self.noising != "bart_infill":
            raise ValueError("permute_sentences is BART's: use it with noising bart_infill")

    def chunk_length(self) -> int:
        if self.noising == "t5_span":
            return t5_chunk_length(
                self.max_seq_length,
                self.max_target_length,
                self.noise_density,
                self.mean_noise_span_length,
            )
        # BART's target is <s> chunk </s>; infilling shortens the input in all but rare cases
        # (instances whose input would not fit are dropped and counted).
        length = min(self.max_seq_length, self.max_target_length) - 2
        if length < 2:
            raise ValueError(
                f"no chunk of 2 or more tokens fits inputs of {self.max_seq_length} and targets "
                f"of {self.max_target_length} ids with BART's <s> and </s>"
            )
        return length


def create_instances(
    documents: Iterable[Sequence[Sequence[int]]],
    vocab: Seq2SeqVocab,
    settings: NoisingSettings,
    rng: np.random.Generator,
    stats: dict | None = None,
) -> Iterator[tuple[list[int], list[int]]]:
    """Yields (inputs, targets) for every chunk of every document (documents: lists of sentence
    ids). Chunks of fewer than 2 tokens are skipped; the same rng state gives the same output.
    `stats` (optional) counts chunks, too_short and too_long (BART inputs over max_seq_length)."""
    stats = {} if stats is None else stats
    for key in ("instances", "too_short", "too_long"):
        stats.setdefault(key, 0)
    length = settings.chunk_length()
    for sentences in documents:
        for chunk in chunk_sentences(sentences, length):
            n = sum(len(s) for s in chunk)
            if n < 2:
                stats["too_short"] += 1
                continue
            if settings.noising == "t5_span":
                inputs, targets = t5_instance(
                    [t for s in chunk for t in s],
                    vocab,
                    rng,
                    settings.noise_density,
                    settings.mean_noise_span_length,
                )
            else:
                inputs, targets = bart_instance(
                    chunk,
                    vocab,
                    rng,
                    settings.mask_ratio,
                    settings.poisson_lambda,
                    settings.permute_sentences,
                )
            if len(inputs) > settings.max_seq_length or len(targets) > settings.max_target_length:
                stats["too_long"] += 1
                continue
            stats["instances"] += 1
            yield inputs, targets


def serialize_seq2seq_examples(
    instances: Sequence[tuple[Sequence[int], Sequence[int]]],
    max_seq_length: int,
    max_target_length: int,
    pad_id: int,
) -> list[bytes]:
    """Each (inputs, targets) as a tf.train.Example of the four FEATURES, padded with pad_id
    (ids and masks of the whole batch in numpy)."""
    n = len(instances)
    arrays = {
        "input_ids": np.full((n, max_seq_length), pad_id, np.int64),
        "input_mask": np.zeros((n, max_seq_length), np.int64),
        "target_ids": np.full((n, max_target_length), pad_id, np.int64),
        "target_mask": np.zeros((n, max_target_length), np.int64),
    }
    for row, (inputs, targets) in enumerate(instances):
        for ids, key, limit in (
            (inputs, "input", max_seq_length),
            (targets, "target", max_target_length),
        ):
            if len(ids) > limit:
                raise ValueError(f"{len(ids)} {key} ids do not fit the length {limit}")
            arrays[f"{key}_ids"][row, : len(ids)] = ids
            arrays[f"{key}_mask"][row, : len(ids)] = 1
    packed = {key: packed_varints(values) for key, values in arrays.items()}
    return [int64_example({key: packed[key][row] for key in FEATURES}) for row in range(n)]


def seq2seq_feature_spec(max_seq_length: int, max_target_length: int) -> dict:
    import tensorflow as tf

    lengths = (max_seq_length, max_seq_length, max_target_length, max_target_length)
    return {k: tf.io.FixedLenFeature([n], tf.int64) for k, n in zip(FEATURES, lengths)}


def write_seq2seq_tfrecords(
    instances: Iterable[tuple[Sequence[int], Sequence[int]]],
    output_files: Sequence[str],
    max_seq_length: int,
    max_target_length: int,
    pad_id: int,
) -> int:
    """Writes instances round-robin over the output files (instance n to file n mod the file
    count); returns how many were written."""
    return write_round_robin(
        instances,
        lambda batch: serialize_seq2seq_examples(batch, max_seq_length, max_target_length, pad_id),
        output_files,
        WRITE_BATCH,
    )


def read_seq2seq_records(path: str) -> Iterator[tuple[list[int], list[int]]]:
    """The (inputs, targets) of each record, padding removed by the masks."""
    import tensorflow as tf

    for raw in tf.data.TFRecordDataset(path):
        f = tf.train.Example.FromString(raw.numpy()).features.feature
        values = {k: list(f[k].int64_list.value) for k in FEATURES}
        yield (
            [i for i, m in zip(values["input_ids"], values["input_mask"]) if m],
            [i for i, m in zip(values["target_ids"], values["target_mask"]) if m],
        )


def seq2seq_file_lengths(files: Sequence[str]) -> tuple[int, int, int]:
    """(max_seq_length, max_target_length, largest id) of the first record of each file, which
    must agree; raises InputError naming the file for another kind of record or an empty file."""
    import tensorflow as tf

    found = None
    for path in files:
        for raw in tf.data.TFRecordDataset(path).take(1):
            feats = tf.train.Example.FromString(raw.numpy()).features.feature
            if sorted(feats) != sorted(FEATURES):
                raise input_error(
                    path,
                    f"seq2seq records with features {list(FEATURES)} "
                    "(data_prep/create_seq2seq_data.py)",
                    f"{sorted(feats)}",
                )
            ids = [max(feats[k].int64_list.value) for k in ("input_ids", "target_ids")]
            lengths = (
                len(feats["input_ids"].int64_list.value),
                len(feats["target_ids"].int64_list.value),
            )
            if found is not None and lengths != found[:2]:
                raise input_error(path, f"lengths {found[:2]} as the other files", f"{lengths}")
            found = (*lengths, max(ids, default=0) if found is None else max(found[2], *ids))
            break
        else:
            raise input_error(path, "at least one record", "an empty file")
    if found is None:
        raise ValueError("no input files")
    return found


def seq2seq_dataset(
    files: Sequence[str],
    batch_size: int,
    max_seq_length: int,
    max_target_length: int,
    is_training: bool,
    seed: int = 12345,
    num_shards: int = 1,
    shard_index: int = 0,
) -> tf.data.Dataset:
    """Batches of the four features as int32 (B, S) and (B, T). Training repeats and shuffles
    with a fixed seed; evaluation is one pass. The remainder is dropped (equal replica slices)."""
    import tensorflow as tf

    records = tf.data.TFRecordDataset(list(files))
    if num_shards > 1:
        records = records.shard(num_shards, shard_index)
    if is_training:
        records = records.repeat().shuffle(10_000, seed=seed, reshuffle_each_iteration=True)
    spec = seq2seq_feature_spec(max_seq_length, max_target_length)

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        return {k: tf.cast(v, tf.int32) for k, v in parsed.items()}

    batches = records.batch(batch_size, drop_remainder=True)
    return batches.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(
        tf.data.AUTOTUNE
    )
