"""Streaming pre-training data creation as an Apache Beam pipeline: the same shards, byte for byte.

For corpora that outgrow one machine. The pipeline runs the functions of the local streaming path
(data_prep/pretraining_shards.py) on an existing distributed engine, so for the same text,
vocabulary, flags, --chunk_bytes and seed it writes the same files as
`create_pretraining_data.py` without --beam, whatever the runner and the number of workers
(tested with the DirectRunner):

  files        (file index, path) for each input file, in --input_file order
  chunks       iter_file_chunks: each file cut into chunks of whole documents, named (file index,
               chunk index); one worker reads one file from start to end
  Reshuffle    spreads the chunks over the workers (else each stays fused to its file's reader)
  records      tokenize_chunk (the tokenizer, built once per worker) and
               chunk_records, the pure function of one chunk seeded from (seed, file, chunk)
  deal         record j of chunk (f, c) goes to shard shard_of(f, c, j); one element per chunk and
               shard: (shard, (f, c, records))
  GroupByKey   per shard (every shard keyed once more with no records, so empty shards exist too)
  write        a shard's blocks sorted by (f, c), its records framed (frame_records: the bytes of
               tf.io.TFRecordWriter) in that order under a temporary name, then renamed into place

A shard passes through one worker when it is written (as with any Beam file sink), so its records
are held there at once: choose enough output shards that one fits a worker's memory (the
original's advice of many shards for large corpora; a record is about 0.7 kB at sequence length
128, so English Wikipedia at --dupe_factor=10, some 260 M records, is about 180 MB a shard over
1,000 shards, by estimate). Every other step holds one chunk at a time.

Running it (the flags after --beam_options are Beam's own pipeline options):

  Locally, DirectRunner (in this process; for tests and small corpora the default path without
  --beam is faster):
    python data_prep/create_pretraining_data.py --beam --input_file='corpus/*.txt' \\
      --output_file=out/a.tfrecord,out/b.tfrecord --vocab_file=vocab.txt
    add --beam_options="--direct_num_workers=2 --direct_running_mode=multi_processing"
    for worker processes.

  Google Cloud Dataflow: inputs, outputs and a temp location on gs:// (read and written through
  tf.io.gfile), and workers that have this repository and requirements.txt, e.g. a container
  built FROM apache/beam_python3.11_sdk:2.77.0 with the repository copied in and
  `pip install -r requirements.txt`:
    --input_file='gs://b/corpus/*.txt' --output_file=gs://b/data/part-000.tfrecord,... \\
    --beam_options="--runner=DataflowRunner --project=P --region=R \\
      --temp_location=gs://b/tmp --sdk_container_image=IMAGE --experiments=use_runner_v2"

  Apache Flink: a Flink cluster's job manager, workers from the same image:
    --beam_options="--runner=FlinkRunner --flink_master=HOST:8081 \\
      --environment_type=DOCKER --environment_config=IMAGE"

  Apache Spark: a Spark master, the same:
    --beam_options="--runner=SparkRunner --spark_master_url=spark://HOST:7077 \\
      --environment_type=DOCKER --environment_config=IMAGE"

  (Flink and Spark also take --environment_type=LOOPBACK to run the Python code in the launching
  process, for trying a cluster out.) Only the DirectRunner is run here (no cluster can be
  reached from this project's machines); the other runners' flags are Beam's documented options.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence

from absl import logging

from data_prep.files import open_file, remove_files, replace_files
from data_prep.pretraining_shards import (
    ChunkSettings,
    TextChunk,
    chunk_records,
    frame_records,
    iter_file_chunks,
    shard_of,
    tokenize_chunk,
)


def read_chunks(item: tuple[int, str], chunk_bytes: int) -> Iterator[TextChunk]:
    """The chunks of input file `item` = (file index, path), as the local path cuts them."""
    file_index, path = item
    yield from iter_file_chunks(file_index, path, chunk_bytes, opener=open_file)


def deal(
    file_index: int, chunk_index: int, records: Sequence[bytes], num_shards: int
) -> Iterator[tuple[int, tuple[int, int, list[bytes]]]]:
    """(shard, (file index, chunk index, the chunk's records of that shard in order)) for every
    shard that gets records of the chunk: create_shards' dealing, one element per shard."""
    blocks: dict[int, list[bytes]] = {}
    for j, record in enumerate(records):
        blocks.setdefault(shard_of(file_index, chunk_index, j, num_shards), []).append(record)
    for shard in sorted(blocks):
        yield shard, (file_index, chunk_index, blocks[shard])


def write_shard(path: str, blocks) -> int:
    """Writes one shard: the blocks (file index, chunk index, records) in (file, chunk) order,
    framed as create_shards frames them, under a temporary name renamed into place when complete
    (a retried bundle rewrites it). Returns the records written. `None` blocks (the empty-shard
    markers) are skipped."""
    ordered = sorted((b for b in blocks if b is not None), key=lambda b: (b[0], b[1]))
    temporary = f"{path}.incomplete-{uuid.uuid4().hex[:12]}"
    count = 0
    try:
        with open_file(temporary, "wb") as out:
            for _, _, records in ordered:
                out.write(b"".join(frame_records(records)))
                count += len(records)
        replace_files([temporary], [path])
        logging.info("%s: %d records", path, count)
    except BaseException:
        remove_files([temporary])
        raise
    return count


def build(
    pipeline,
    input_files: Sequence[str],
    output_files: Sequence[str],
    make_tokenizer,
    settings: ChunkSettings,
    chunk_bytes: int = 1 << 20,
):
    """Adds the pipeline's steps to `pipeline` (an apache_beam.Pipeline). Returns the
    PCollection of (output path, records written), one element per shard.

    Args:
      input_files: text files (local or any tf.io.gfile filesystem), in order: the file index
        of each is part of its chunks' seeds, as in create_shards.
      output_files: the shards, in order.
      make_tokenizer: a picklable callable of no arguments making the tokenizer
        (pretraining_data.vocab_tokenizer's), shipped to the workers with the pipeline.
      settings, chunk_bytes: as create_shards takes them.
    """
    import apache_beam as beam

    num_shards = len(output_files)
    outputs = list(output_files)

    class ChunkRecords(beam.DoFn):
        """tokenize_chunk + chunk_records; the tokenizer made once per worker by make_tokenizer
        (FullTokenizer or SentencePieceTokenizer, as create_pretraining_data's workers: no
        TensorFlow)."""

        def setup(self):
            self.tokenizer = make_tokenizer()

        def process(self, chunk: TextChunk):
            documents = tokenize_chunk(chunk, self.tokenizer, settings.sentence_objective)
            records = chunk_records(chunk.file_index, chunk.chunk_index, documents, settings)
            yield from deal(chunk.file_index, chunk.chunk_index, records, num_shards)

    blocks = (
        pipeline
        | "Files" >> beam.Create(list(enumerate(input_files)))
        | "Chunks" >> beam.FlatMap(read_chunks, chunk_bytes)
        | "Spread" >> beam.Reshuffle()
        | "Records" >> beam.ParDo(ChunkRecords())
    )
    every_shard = pipeline | "Shards" >> beam.Create([(k, None) for k in range(num_shards)])
    return (
        (blocks, every_shard)
        | "Together" >> beam.Flatten()
        | "ByShard" >> beam.GroupByKey()
        | "Write" >> beam.MapTuple(lambda k, b: (outputs[k], write_shard(outputs[k], b)))
    )


def run(
    input_files: Sequence[str],
    output_files: Sequence[str],
    make_tokenizer,
    settings: ChunkSettings,
    chunk_bytes: int = 1 << 20,
    beam_options: Sequence[str] = (),
) -> None:
    """Runs the pipeline to completion with Beam's pipeline options `beam_options` (command-line
    style, e.g. ["--runner=DataflowRunner", ...]; none: the DirectRunner in this process)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    with beam.Pipeline(options=PipelineOptions(list(beam_options))) as pipeline:
        build(pipeline, input_files, output_files, make_tokenizer, settings, chunk_bytes)
