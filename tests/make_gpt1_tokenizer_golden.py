"""Writes GPT-1's tokenizer files into tests/fixtures/openai_gpt_tiny/ (beside the tiny
OpenAIGPTLMHeadModel that tests/make_gpt_golden.py writes there) and what Hugging Face's
OpenAIGPTTokenizer makes of text with them.

The released GPT-1 vocabulary cannot be had offline (shared/DATA.md), so this is a stand-in in its
layout: a word-end BPE ("</w>" ending each word's last unit, `<unk>` for units it lacks) that
Hugging Face `tokenizers` learned from the README (lower-cased, accents stripped, BERT's
pre-tokenizer), saved as GPT-1's vocab.json + merges.txt. The reference no one here wrote is
transformers' OpenAIGPTTokenizer (5.24: `tokenizers`' BPE behind BERT's normalizer, lower-cased
with accents stripped, and BERT's pre-tokenizer; its 4.x versions did the same when ftfy or spaCy
was missing), which is the tokenization data_prep/bpe.WordEndBPE reproduces.

Files: vocab.json (at most the model's 400 entries), merges.txt, and tokenizer_golden.npz: every
25th training_text line, the TEXTS and UNSEEN (tokenizer_texts), their ids (tokenizer_ids, flat, and
tokenizer_offsets) and each one's convert_tokens_to_string(tokens) (tokenizer_decoded).

Run once, and again whenever the sizes change (it leaves the model files alone):
  pip install torch==2.13.0 transformers tokenizers  # in one command, ideally in a separate venv
  HF_HUB_OFFLINE=1 python tests/make_gpt1_tokenizer_golden.py
"""

from __future__ import annotations

from tests.make_gpt_golden import GPT1_FOLDER, TEXTS, VOCAB_SIZE
from tests.make_xlnet_golden import training_text

# Characters the vocabulary lacks (each unit then `<unk>`), CJK characters split off as words.
UNSEEN = ("Snow \u2603 fell in \u65e5\u672c, \u03a9mega!",)


def learn(folder) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=["<unk>"], end_of_word_suffix="</w>",
        limit_alphabet=120,
    )  # fmt: skip
    tokenizer.train_from_iterator(training_text().splitlines(), trainer)
    tokenizer.model.save(str(folder))  # vocab.json, merges.txt


def main() -> None:
    import numpy as np
    from transformers import OpenAIGPTTokenizer

    learn(GPT1_FOLDER)
    tokenizer = OpenAIGPTTokenizer.from_pretrained(str(GPT1_FOLDER))
    assert len(tokenizer.get_vocab()) <= VOCAB_SIZE
    texts = training_text().splitlines()[::25] + list(TEXTS) + list(UNSEEN)
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    decoded = [tokenizer.convert_tokens_to_string(tokenizer.convert_ids_to_tokens(i)) for i in ids]
    np.savez_compressed(
        GPT1_FOLDER / "tokenizer_golden.npz",
        tokenizer_texts=np.array(texts),
        tokenizer_ids=np.array([i for row in ids for i in row], np.int32),
        tokenizer_offsets=np.cumsum([0] + [len(row) for row in ids]),
        tokenizer_decoded=np.array(decoded),
    )
    unk = sum(row.count(tokenizer.get_vocab()["<unk>"]) for row in ids)
    size = len(tokenizer.get_vocab())
    print(f"wrote {GPT1_FOLDER}: {size} tokens, {len(texts)} texts, {unk} <unk>")


if __name__ == "__main__":
    main()
