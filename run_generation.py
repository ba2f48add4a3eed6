"""Continues text with a GPT: run_pretraining's, or a published GPT-2 that convert_checkpoint.py
converted (as GPT-2's released generate_unconditional_samples.py and
interactive_conditional_samples.py do).

Example (a converted GPT-2, whose folder is config, checkpoint and BPE at once):
  python run_generation.py --bert_config_file=converted/gpt2/bert_config.json \\
    --init_checkpoint=converted/gpt2 --vocab_file=converted/gpt2 --input_file=prompts.txt \\
    --output_file=out/samples.jsonl --max_new_tokens=40 --top_k=40 --num_samples=2

--input_file holds one prompt a line; an empty line asks for an unconditional sample (the
prompt is <|endoftext|> alone, as GPT-2's unconditional samples start). Each prompt gets
--num_samples continuations of --max_new_tokens tokens, each cut before its first
<|endoftext|> (a converted GPT-1, whose word-end BPE has none, runs the full length and takes no
empty prompt). --temperature=0 decodes greedily; otherwise tokens are drawn after
--top_k / --top_p filtering (modeling/gpt.filter_logits), from stateless random ops keyed by
--seed, the batch and the step: the same file and flags give the same text. --output_file gets
one JSON object a line: {"line", "sample", "prompt", "text", "ids"} (ids: the new tokens),
written under a temporary name and renamed at the end. A prompt whose tokens and
--max_new_tokens exceed the config's n_ctx is refused, naming its line.
"""

from __future__ import annotations

import json
import time

from absl import app, flags, logging

flags.DEFINE_string("input_file", None, "Text file: one prompt a line (empty: unconditional).")
flags.DEFINE_string("output_file", None, "JSON lines output, one object per sample.")
flags.DEFINE_string("bert_config_file", None, "GPT config (OpenAI's hparams.json names).")
flags.DEFINE_string("init_checkpoint", None, "Cloze GPT checkpoint (prefix or folder).")
flags.DEFINE_string(
    "vocab_file",
    None,
    "The GPT's BPE (GPT-2's byte-level or GPT-1's word-end one): a folder with encoder.json + "
    "vocab.bpe (or vocab.json + merges.txt), or the encoder.json with vocab.bpe beside it.",
)
flags.DEFINE_integer("max_new_tokens", 40, "Tokens generated after each prompt.")
flags.DEFINE_float("temperature", 1.0, "Softmax temperature; 0 decodes greedily.")
flags.DEFINE_integer("top_k", 0, "Keep the k most likely tokens (0: all).")
flags.DEFINE_float("top_p", 1.0, "Keep the most likely tokens up to this probability (1: all).")
flags.DEFINE_integer("num_samples", 1, "Continuations per prompt.")
flags.DEFINE_integer("batch_size", 8, "Sequences decoded together (prompts of one length).")
flags.DEFINE_integer("seed", 12345, "Seed of the sampling.")
flags.mark_flags_as_required(
    ["input_file", "output_file", "bert_config_file", "init_checkpoint", "vocab_file"]
)
for _name in ("max_new_tokens", "num_samples", "batch_size"):
    flags.register_validator(_name, lambda n: n >= 1, "must be at least 1")
flags.register_validator("temperature", lambda t: t >= 0, "must be at least 0")
flags.register_validator("top_k", lambda k: k >= 0, "must be at least 0")
flags.register_validator("top_p", lambda p: 0 < p <= 1, "must be in (0, 1]")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from tqdm import tqdm

    from data_prep import bpe, files, tokenization
    from data_prep.errors import InputError, input_error
    from modeling import checkpoints, gpt
    from training import gpt_finetuning, trainer

    try:
        values = checkpoints.read_json(FLAGS.bert_config_file)
        if not gpt.is_gpt_config(values):
            raise input_error(
                FLAGS.bert_config_file,
                "a GPT config (OpenAI's hparams.json names; T5 and BART generate through "
                "run_text2text.py)",
                f"keys {sorted(values)[:6]}",
            )
        config = gpt.GptConfig.from_dict(values, FLAGS.bert_config_file)
        tokenizer = gpt_finetuning.load_bpe(FLAGS.vocab_file)
        # GPT-1's word-end BPE has no <|endoftext|>: its continuations run the full length.
        end = tokenizer.encoder.get(bpe.GPT2_END_OF_TEXT)
        if end is None and not isinstance(tokenizer, bpe.WordEndBPE):
            raise input_error(FLAGS.vocab_file, f"the token {bpe.GPT2_END_OF_TEXT!r}", "none")
        if max(tokenizer.encoder.values()) >= config.n_vocab:
            raise input_error(
                FLAGS.vocab_file,
                f"ids below the config's n_vocab {config.n_vocab}",
                f"ids up to {max(tokenizer.encoder.values())}",
            )
        lines = [line for _, line in tokenization.read_utf8_lines(FLAGS.input_file)]
        prompts = []
        for number, line in enumerate(lines, 1):
            where = f"{FLAGS.input_file}:{number}"
            if not line and end is None:
                expected = "a prompt (an unconditional sample starts from <|endoftext|>, which "
                raise input_error(where, expected + "this vocabulary lacks)", "an empty line")
            ids = tokenizer.encode(line) if line else [end]
            if not ids:
                raise input_error(where, "a prompt with tokens", "none after tokenization")
            if len(ids) + FLAGS.max_new_tokens > config.n_ctx:
                raise input_error(
                    f"{FLAGS.input_file}:{number}",
                    f"a prompt of at most {config.n_ctx - FLAGS.max_new_tokens} tokens (n_ctx "
                    f"{config.n_ctx} less --max_new_tokens)",
                    f"{len(ids)} tokens",
                )
            prompts.append(ids)
    except InputError as e:
        raise SystemExit(f"run_generation: {e}") from None
    if not prompts:
        raise SystemExit(f"run_generation: {FLAGS.input_file}: expected prompts, found none")

    model = gpt.GptLM(config)
    model.build()
    loaded, _ = trainer.init_from_checkpoint(model, FLAGS.init_checkpoint)
    logging.info("GPT (%s-LN, %d layers) from %s", config.layer_norm_position, config.n_layer,
                 loaded)  # fmt: skip
    rows = [ids for ids in prompts for _ in range(FLAGS.num_samples)]
    t0 = time.time()
    with tqdm(total=len(rows), desc="generating", unit=" samples", mininterval=2.0) as bar:
        new = gpt.continue_prompts(
            model, rows, FLAGS.max_new_tokens, FLAGS.batch_size, stop_id=end,
            progress=bar.update, temperature=FLAGS.temperature, top_k=FLAGS.top_k,
            top_p=FLAGS.top_p, seed=FLAGS.seed,
        )  # fmt: skip
    seconds = time.time() - t0

    def write(paths):
        with open(paths[0], "w", encoding="utf-8") as f:
            for row, ids in enumerate(new):
                line, sample = divmod(row, FLAGS.num_samples)
                text = tokenizer.decode(ids)
                record = {"line": line + 1, "sample": sample, "prompt": lines[line],
                          "text": text, "ids": ids}  # fmt: skip
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        return len(new)

    files.make_parent_folders([FLAGS.output_file])
    files.write_atomically([FLAGS.output_file], write)
    tokens = len(rows) * FLAGS.max_new_tokens
    logging.info("%d samples, %d tokens decoded in %.1f s (%.0f tokens/s); wrote %s", len(rows),
                 tokens, seconds, tokens / max(seconds, 1e-9), FLAGS.output_file)  # fmt: skip


if __name__ == "__main__":
    app.run(main)
