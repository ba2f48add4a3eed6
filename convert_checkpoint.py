"""Converts BERT checkpoints between google-research/bert TF1, Hugging Face and Cloze, and exports
SavedModels that take raw strings.

Example (the real all-MiniLM-L6-v2 from Hugging Face files into a Cloze checkpoint):
  python convert_checkpoint.py --from=hf --to=cloze --input_dir=all-MiniLM-L6-v2/ \
    --output_dir=converted/minilm

--from: tf1_bert  a folder with bert_model.ckpt.*, bert_config.json, vocab.txt (Google's release)
        tf1_albert  google-research/albert's release: model.ckpt-best.* (or a `checkpoint` file),
                  albert_config.json, and --vocab_file (ALBERT ships a SentencePiece model; a
                  vocab is only needed for the checks and exports that use one)
        tf1_electra google-research/electra's release folder (a `checkpoint` file and the
                  checkpoint it names) and an ELECTRA config (--bert_config_file, e.g.
                  configs/electra_small.json; the original ships none); the pretraining
                  checkpoint gives generator and discriminator, a discriminator-only one the
                  encoder.
        tf1_gpt2  OpenAI's GPT-2 release (github.com/openai/gpt-2's download_model.py): model.ckpt.*
                  (or a `checkpoint` file), hparams.json, encoder.json + vocab.bpe (copied along);
                  --to=cloze, hf or tf1_gpt2
        bilm_hdf5 a published ELMo (bilm-tf's dump_weights, as AllenNLP's Elmo reads it):
                  weights.hdf5 (or one *_weights.hdf5, or --init_checkpoint naming the file) and
                  options.json (or one *_options.json); --to=cloze (the biLM under
                  `model/encoder`: run_classifier, run_ner and extract_features read words with
                  it, no vocab needed) or bilm_hdf5
        hf        a folder with model.safetensors (or a shard index), config.json, vocab.txt;
                  config.json's model_type says the family: bert, roberta (positions from
                  pad_token_id + 1), distilbert (DistilBertModel / DistilBertFor*: the encoder
                  as a BERT whose token-type rows are zero; its heads are not read), albert or
                  electra (the discriminator; its head and a
                  generator, a separate model there, are not read), bart
                  (BartForConditionalGeneration / BartModel; --to=cloze only, no vocab.txt
                  needed: vocab.json and merges.txt are copied as encoder.json and vocab.bpe),
                  xlnet (XLNetLMHeadModel / XLNetModel / a task model's encoder, or a fine-tuned
                  XLNetForQuestionAnswering with its span heads: run_squad's XLNetBeamSpanQA;
                  spiece.model is copied along, run_classifier's --vocab_file), gpt2
                  (GPT2LMHeadModel / GPT2Model) or openai-gpt (GPT-1: OpenAIGPTLMHeadModel /
                  OpenAIGPTModel; task heads and causal-mask buffers are not read; a GPT-2's
                  vocab.json + merges.txt are copied as encoder.json + vocab.bpe), or t5
                  (T5ForConditionalGeneration / T5Model: t5-small's relu, T5 v1.1's and
                  FLAN-T5's gated-gelu with their own lm_head; spiece.model is copied along,
                  run_text2text's --vocab_file)
        cloze     a Cloze output folder or checkpoint prefix, with bert_config.json or
                  model_config.json beside it (or --bert_config_file); BERT, ALBERT, ELECTRA
                  or BART, XLNet, GPT or T5 (a run_pretraining / run_text2text checkpoint; --to=hf
                  or cloze, a GPT-2 also tf1_gpt2), or an ELMo options.json (--to=bilm_hdf5
                  or cloze; run_pretraining's softmax is not converted), told by the config's
                  keys
        keras_hub a keras-hub BertBackbone preset folder (config.json, model.weights.h5,
                  assets/tokenizer/vocabulary.txt), e.g. one written by --to=keras_hub
--to:   cloze        ckpt-1 + bert_config.json + vocab.txt; any run script takes the folder as
                     --init_checkpoint (a RoBERTa's vocab.json + merges.txt, or an ALBERT's
                     spiece.model, in --input_dir are copied along, here and to hf / keras /
                     tf1: the folder is then also the run scripts' --vocab_file)
        hf           (a BART checkpoint: BartForConditionalGeneration's model.safetensors +
                     config.json, encoder.json / vocab.bpe copied as vocab.json / merges.txt;
                     an XLNet: XLNetLMHeadModel's, or XLNetForQuestionAnswering's for
                     run_squad's beam head, spiece.model copied along; a GPT:
                     GPT2LMHeadModel's (pre-LN) or OpenAIGPTLMHeadModel's (post-LN), its
                     config's bos / eos the vocabulary's <|endoftext|>, tokenizer_config.json
                     naming GPT2Tokenizer, or OpenAIGPTTokenizer for GPT-1's word-end BPE;
                     a T5: T5ForConditionalGeneration's, spiece.model copied along)
                     model.safetensors + config.json + vocab.txt (or RoBERTa's vocab.json +
                     merges.txt, RobertaTokenizer) + tokenizer_config.json, as
                     transformers writes the family: BertModel / BertForPreTraining, RobertaModel /
                     RobertaForMaskedLM (a config with position_offset), AlbertModel /
                     AlbertForPreTraining, ElectraModel / ElectraForPreTraining (a pretrainer's
                     generator goes to generator/ as an ElectraForMaskedLM)
        tf1_bert     bert_model.ckpt.* with the original names + bert_config.json + vocab.txt
        tf1_albert   model.ckpt.* with google-research/albert's names + albert_config.json
        tf1_electra  model.ckpt.* with google-research/electra's names + electra_config.json
                     (Cloze's ELECTRA config; the original ships none)
        bilm_hdf5    an ELMo biLM as bilm-tf and AllenNLP's Elmo read it: weights.hdf5 (no
                     softmax; the character table's padding row 0 is implied) + options.json
        tf1_gpt2     OpenAI's GPT-2 layout: model.ckpt.* with src/model.py's names, hparams.json
                     (its five keys), encoder.json + vocab.bpe (a pre-LN GPT with the tanh GELU,
                     inner size 4H and epsilon 1e-5: what the released code computes)
        saved_model  a SavedModel with raw-string signatures (needs --vocab_file or vocab.txt;
                     or a RoBERTa's vocab.json + merges.txt in --input_dir: byte-level BPE in
                     the graph, cased unless --do_lower_case is given explicitly)
        keras        model.keras (+ bert_config.json, vocab.txt)
        keras_hub    (a GPT-2: GPT2Backbone + GPT2Tokenizer of its BPE, GPT2CausalLM.from_preset
                     loads it; a T5 keras-hub's T5Backbone computes: T5Backbone + T5Tokenizer of
                     its spiece.model)
                     a keras-hub preset: keras_hub.models.BertBackbone.from_preset(output_dir)
                     and BertTokenizer.from_preset(output_dir) load it offline (encoder only;
                     needs a vocab). keras-hub's BertBackbone always computes the tanh GELU, so
                     hidden_act=gelu_exact (Hugging Face models) is refused unless
                     --allow_gelu_approximation, and other activations always are.
Files named by --init_checkpoint, --bert_config_file and --vocab_file replace the ones looked for
in --input_dir. Everything is written to a temporary folder beside --output_dir and renamed into
place only when the whole conversion succeeded; an existing non-empty --output_dir is refused.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from absl import app, flags, logging

FORMATS_IN = [
    "tf1_bert",
    "tf1_albert",
    "tf1_electra",
    "tf1_gpt2",
    "bilm_hdf5",
    "hf",
    "cloze",
    "keras_hub",
]
FORMATS_OUT = [
    "cloze",
    "hf",
    "tf1_bert",
    "tf1_albert",
    "tf1_electra",
    "tf1_gpt2",
    "bilm_hdf5",
    "saved_model",
    "keras",
    "keras_hub",
]
# The formats that hold one family only; cloze, hf and keras hold every family.
FAMILY_OF_FORMAT = {
    "tf1_bert": "bert",
    "tf1_albert": "albert",
    "tf1_electra": "electra",
    "tf1_gpt2": "gpt",
    "bilm_hdf5": "elmo",
    "saved_model": "bert",
    "keras_hub": "bert",
}
# The config file written beside each TF1 format's checkpoint (the name its --from reads).
TF1_CONFIG_NAMES = {
    "tf1_bert": "bert_config.json",
    "tf1_albert": "albert_config.json",
    "tf1_electra": "electra_config.json",
}

flags.DEFINE_enum("from", None, FORMATS_IN, "Format of the checkpoint to read.")
flags.DEFINE_enum("to", None, FORMATS_OUT, "Format to write.")
flags.DEFINE_string("input_dir", None, "Folder holding the checkpoint, its config and vocab.txt.")
flags.DEFINE_string(
    "init_checkpoint",
    None,
    "The checkpoint itself: a TF checkpoint prefix or folder (tf1_bert, cloze), or a "
    ".safetensors file / shard index (hf). Default: found in --input_dir.",
)
flags.DEFINE_string(
    "bert_config_file",
    None,
    "Model config: bert_config.json field names, or a Hugging Face config.json for --from=hf. "
    "Default: found in --input_dir.",
)
flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt. Default: --input_dir/vocab.txt.")
flags.DEFINE_string("output_dir", None, "Folder to create (must be absent or empty).")
flags.DEFINE_bool("do_lower_case", True, "Whether the vocab is uncased (SavedModel tokenizer).")
flags.DEFINE_integer("max_seq_length", 128, "SavedModel: longest [CLS] ... [SEP] input it makes.")
flags.DEFINE_integer(
    "encoder_branches",
    1,
    "--to=saved_model: the exported encoder runs its layers as this many independent row slices "
    "of each batch (any batch size; run_pretraining's flag of the same name): the same outputs up "
    "to float rounding, 1.06-1.16x the sequences/s of L4/H256 at batch 32 on 2 CPU cores "
    "(README).",
)
flags.DEFINE_bool(
    "remove_padding",
    False,
    "--to=saved_model: the exported encoder runs its layers on each batch's real tokens alone "
    "(run_classifier's flag of the same name): the same outputs at real tokens up to float "
    "rounding, zeros at padding positions.",
)
flags.DEFINE_bool(
    "trust_pickle",
    False,
    "Allow reading a PyTorch pickle (.bin/.pt). Pickles can run code when loaded: only for files "
    "you trust; safetensors needs no such trust.",
)
flags.DEFINE_bool(
    "allow_gelu_approximation",
    False,
    "--to=keras_hub: write a model with hidden_act=gelu_exact into keras-hub's BertBackbone, "
    "which computes the tanh approximation of GELU; its outputs then differ slightly.",
)
flags.DEFINE_string(
    "skip_variables",
    None,
    "Regex of source variables to leave out on purpose (e.g. '^classifier\\.' for a fine-tuned "
    "Hugging Face classifier); they are listed in the summary. Default: any unused variable is an "
    "error.",
)
FLAGS = flags.FLAGS

# Where each format keeps its config inside --input_dir, in order of preference.
CONFIG_NAMES = {
    "tf1_bert": ("bert_config.json",),
    "tf1_albert": ("albert_config.json",),
    "tf1_electra": ("electra_config.json",),
    "tf1_gpt2": ("hparams.json",),
    "bilm_hdf5": ("options.json", "*_options.json"),
    "hf": ("config.json",),
    "cloze": ("bert_config.json", "model_config.json"),
    "keras_hub": ("config.json",),
}
# Where a keras-hub preset keeps its WordPiece vocabulary.
KERAS_HUB_VOCAB = Path("assets", "tokenizer", "vocabulary.txt")


def find_config(source_format: str, input_dir: str | None, checkpoint: str | None) -> Path:
    """The config file: --bert_config_file, else the format's usual name in --input_dir (or beside
    the checkpoint). Raises InputError naming the places looked at."""
    from data_prep.errors import input_error

    if FLAGS.bert_config_file:
        path = Path(FLAGS.bert_config_file)
        if not path.is_file():
            raise input_error(str(path), "a config file (--bert_config_file)", "no such file")
        return path
    folders = [Path(input_dir)] if input_dir else []
    if checkpoint:
        ckpt = Path(checkpoint)
        folders.append(ckpt if ckpt.is_dir() else ckpt.parent)
    looked = []
    for folder in folders:
        for name in CONFIG_NAMES[source_format]:
            looked.append(str(folder / name))
            found = sorted(folder.glob(name)) if "*" in name else [folder / name]
            if len(found) > 1:
                names = ", ".join(f.name for f in found)
                raise input_error(str(folder / name), "one config file", f"{len(found)}: {names}")
            if found and found[0].is_file():
                return found[0]
    raise input_error(
        " or ".join(looked) or "--bert_config_file", "a model config file", "no such file"
    )


def find_vocab(input_dir: str | None) -> Path | None:
    from data_prep.errors import input_error

    if FLAGS.vocab_file:
        path = Path(FLAGS.vocab_file)
        if not path.is_file():
            raise input_error(str(path), "a vocab file (--vocab_file)", "no such file")
        return path
    for name in ("vocab.txt", KERAS_HUB_VOCAB):
        if input_dir and (Path(input_dir) / name).is_file():
            return Path(input_dir) / name
    return None


def check_keras_hub_lowercase(preset_dir) -> None:
    """Refuses --do_lower_case disagreeing with a keras-hub preset's tokenizer, so exports that
    carry a tokenizer (hf, saved_model, keras_hub) tokenize as the preset did."""
    from data_prep.errors import input_error
    from modeling import checkpoints

    lowercase = checkpoints.keras_hub_lowercase(preset_dir)
    if lowercase is not None and lowercase != FLAGS.do_lower_case:
        raise input_error(
            f"{Path(preset_dir) / 'tokenizer.json'}: config.lowercase",
            f"{FLAGS.do_lower_case} (--do_lower_case)",
            f"{lowercase}; pass --do_lower_case={lowercase} to keep the preset's tokenization",
        )


def check_target_family(config, target_format: str, where: str) -> None:
    """Refuses writing a model into a format of another family (e.g. ALBERT as --to=tf1_bert),
    and a RoBERTa position offset or LayerNorm epsilon into a format that cannot hold it."""
    from data_prep.errors import input_error
    from modeling import albert, electra, layers

    family = {albert.AlbertConfig: "albert", electra.ElectraConfig: "electra"}.get(
        type(config), "bert"
    )
    want = FAMILY_OF_FORMAT.get(target_format)
    if want and want != family:
        fits = [f for f in FORMATS_OUT if FAMILY_OF_FORMAT.get(f, family) == family]
        raise input_error(
            f"--to={target_format}",
            f"a format for this {family.upper()} model of {where}: one of {fits}",
            f"--to={target_format}, which holds {want.upper()} models only",
        )
    if target_format not in ("tf1_bert", "keras_hub"):
        return
    # RoBERTa's fields, which these two formats' BERT fixes at BERT's values.
    for name, fixed, why in (
        ("position_offset", 0, "numbers positions from 0"),
        ("layer_norm_eps", layers.LAYER_NORM_EPSILON, "computes LayerNorm with a fixed epsilon"),
    ):
        value = getattr(config, name, fixed)
        if value != fixed:
            raise input_error(
                f"--to={target_format}",
                f"a format that keeps {name}={value} of {where} (cloze, hf, keras, saved_model)",
                f"--to={target_format}, whose BERT {why}",
            )


def own_module_family(config_file) -> str | None:
    """ "bart", "xlnet", "gpt" or "t5" when the config (Hugging Face's or Cloze's names) is of a
    family whose module converts it whole (convert_by_module), "elmo" for an ELMo options.json
    (convert_elmo), else None."""
    from modeling import bart, checkpoints, elmo, gpt, t5, xlnet

    values = checkpoints.read_json(config_file)
    if elmo.is_elmo_config(values):
        return "elmo"
    if bart.is_bart_config(values):
        return "bart"
    if xlnet.is_xlnet_config(values) or values.get("model_type") == "xlnet":
        return "xlnet"
    if gpt.is_gpt_config(values) or values.get("model_type") in gpt.HF_MODEL_TYPES:
        return "gpt"
    if t5.is_t5_config(values):
        return "t5"
    return None


def module_vocab_files(family: str, input_dir, target_format: str) -> list:
    """(file in --input_dir, name in the output) of the vocabulary a convert_by_module family
    carries along: XLNet's and T5's spiece.model (one name everywhere); BART's and GPT's
    byte-level BPE files, each found under either naming (bpe.BPE_FILE_NAMES) and written as
    Hugging Face's vocab.json + merges.txt for --to=hf, else as OpenAI's encoder.json +
    vocab.bpe (which create_seq2seq_data, create_lm_data and OpenAI's GPT-2 code read)."""
    from data_prep import bpe

    if not input_dir:
        return []
    if family in ("xlnet", "t5"):
        model = Path(input_dir) / "spiece.model"
        return [(model, "spiece.model")] if model.is_file() else []
    out = []
    for k, copy in enumerate(bpe.BPE_FILE_NAMES[target_format == "hf"]):
        found = [Path(input_dir, names[k]) for names in bpe.BPE_FILE_NAMES]
        out += [(file, copy) for file in found if file.is_file()][:1]
    return out


def module_family(family: str):
    """(display name, module, config from Hugging Face's config.json values, Cloze config class,
    model class) of a family convert_by_module converts."""
    from modeling import bart, gpt, t5, xlnet

    return {
        "bart": ("BART", bart, bart.BartConfig.from_hf_config, bart.BartConfig, bart.BartModel),
        "xlnet": ("XLNet", xlnet, xlnet.config_from_hf, xlnet.XLNetConfig, xlnet.XLNetPretrainer),
        "gpt": ("GPT", gpt, gpt.config_from_hf, gpt.GptConfig, gpt.GptLM),
        "t5": ("T5", t5, t5.config_from_hf, t5.T5Config, t5.T5Model),
    }[family]


def load_xlnet_span_qa(source, config, config_file):
    """run_squad's XLNetBeamSpanQA checkpoint (prefix or folder) -> (model, prefix read); an
    InputError naming the path when it is neither that nor an XLNet pretraining checkpoint."""
    from data_prep.errors import input_error
    from modeling import checkpoints, xlnet

    try:
        return checkpoints.load_whole(xlnet.XLNetBeamSpanQA(config), source)
    except ValueError as e:
        where = f"a Cloze XLNet pretraining or run_squad checkpoint of {config_file}"
        raise input_error(str(source), where, str(e)) from None


def convert_by_module(
    family, source_format, target_format, config_file, input_dir, checkpoint
) -> None:
    """BART, XLNet, GPT or T5 between a Cloze checkpoint (run_pretraining's, run_text2text's) and
    Hugging Face's files (model.safetensors + config.json of a BartForConditionalGeneration, an
    XLNetLMHeadModel, a GPT2LMHeadModel, an OpenAIGPTLMHeadModel or a
    T5ForConditionalGeneration), both ways, by the family's
    module (load_hf / save_hf) and checkpoints.load_whole / save_whole. The vocabulary files in
    --input_dir are copied under the target's names."""
    from data_prep.errors import input_error
    from modeling import checkpoints

    name, module, from_hf, config_class, model_class = module_family(family)
    targets = {"gpt": ["hf", "cloze", "tf1_gpt2", "keras_hub"], "t5": ["hf", "cloze", "keras_hub"]}
    targets = targets.get(family, ["hf", "cloze"])
    if target_format not in targets:
        where = f"--to={target_format}"
        raise input_error(where, f"one of {targets} for a {name} model", target_format)
    values = checkpoints.read_json(config_file)
    if "model_type" in values:  # Hugging Face's config.json, with its bookkeeping keys
        config = from_hf(values, str(config_file))
    else:
        config = config_class.from_dict(values, str(config_file))
    if "tf1_gpt2" in (source_format, target_format):
        try:
            module.check_tf1(config)
        except ValueError as e:  # before the slow part
            where = "a config OpenAI's GPT-2 code computes"
            raise input_error(str(config_file), where, str(e)) from None
    source = checkpoint or input_dir
    if source_format == "hf":
        model, report = module.load_hf(
            source, config, str(config_file), FLAGS.skip_variables, FLAGS.trust_pickle
        )
        summary = report.summary()
    elif source_format == "tf1_gpt2":
        model, report = module.load_tf1(source, config, str(config_file), FLAGS.skip_variables)
        summary = report.summary()
    else:
        try:
            model, prefix = checkpoints.load_whole(model_class(config), source)
        except ValueError as e:
            if family != "xlnet":
                where = f"a Cloze {name} checkpoint of {config_file}"
                raise input_error(str(source), where, str(e)) from None
            # run_squad's fine-tuned XLNet with the released span head.
            model, prefix = load_xlnet_span_qa(source, config, config_file)
        summary = f"read the Cloze checkpoint {prefix}"
    with checkpoints.AtomicOutputDir(FLAGS.output_dir) as tmp:
        if target_format == "tf1_gpt2":
            module.save_tf1(model, tmp)
        elif target_format == "keras_hub":
            try:
                module.save_keras_hub(model, tmp, input_dir)
            except ValueError as e:
                where = f"a {name} keras-hub can hold"
                raise input_error(str(config_file), where, str(e)) from None
        elif target_format == "hf":
            # A GPT's config names its <|endoftext|> id, as GPT-2's names 50256.
            extra = {}
            if family == "gpt":  # GPT-1's word-end BPE names its own tokenizer class
                eos, kind = module.end_of_text_id(input_dir), module.tokenizer_class(input_dir)
                extra = {"eos_token_id": eos, "tokenizer": kind}
            try:
                module.save_hf(model, tmp, **extra)
            except ValueError as e:  # a setting Hugging Face's model cannot hold
                where = f"a {name} Hugging Face can hold"
                raise input_error(str(config_file), where, str(e)) from None
        else:
            checkpoints.save_whole(model, tmp)
            (tmp / "bert_config.json").write_text(config.to_json_string())
        for file, copy in module_vocab_files(family, input_dir, target_format):
            if target_format != "keras_hub":  # a preset keeps them in its assets
                shutil.copyfile(file, tmp / copy)
        written = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
    print(f"converted {name} --from={source_format} to --to={target_format}")
    print(summary)
    print(f"wrote {FLAGS.output_dir}: {', '.join(written)}")


def find_hdf5_weights(input_dir, checkpoint) -> Path:
    """--from=bilm_hdf5's weights: --init_checkpoint (the .hdf5 file), else --input_dir's
    weights.hdf5 or its one *_weights.hdf5 (the published files' names)."""
    from data_prep.errors import input_error

    if checkpoint:
        if not Path(checkpoint).is_file():
            raise input_error(checkpoint, "ELMo's weights.hdf5 (--init_checkpoint)", "no such file")
        return Path(checkpoint)
    folder = Path(input_dir)
    found = [folder / "weights.hdf5"] if (folder / "weights.hdf5").is_file() else []
    found = found or sorted(folder.glob("*_weights.hdf5"))
    if len(found) != 1:
        names = ", ".join(f.name for f in found) or "none"
        where = str(folder / "weights.hdf5") + " or one *_weights.hdf5"
        raise input_error(where, "ELMo's weights (bilm-tf's weights.hdf5)", names)
    return found[0]


def convert_elmo(source_format, target_format, config_file, input_dir, checkpoint) -> None:
    """An ELMo biLM between bilm-tf's published files (options.json + weights.hdf5, which
    AllenNLP's Elmo reads) and a Cloze checkpoint (run_pretraining's ElmoLM, whose softmax is
    left out, or a converted biLM: `model/encoder`, what run_classifier, run_ner and
    extract_features load), both ways. A WordPiece vocab.txt in --input_dir (or --vocab_file)
    goes along; a biLM whose options.json counts a vocabulary (n_tokens_vocab) spells it into
    its character table from that file, and without one reads words alone (n_tokens_vocab is
    dropped from the written config)."""
    import tensorflow as tf

    from data_prep import tokenization
    from data_prep.errors import input_error
    from modeling import checkpoints, elmo
    from training import trainer

    if target_format not in ("cloze", "bilm_hdf5"):
        where = f"--to={target_format}"
        raise input_error(where, "cloze or bilm_hdf5 for an ELMo biLM", target_format)
    values, notes = checkpoints.read_json(config_file), []
    if source_format == "bilm_hdf5" and isinstance(values, dict):  # bilm-tf's training wrote
        values, dropped = elmo.options_from_bilm_tf(values)
        if dropped:
            notes.append(f"{config_file}: bilm-tf's run settings not kept: {', '.join(dropped)}")
    config = elmo.ElmoConfig.from_dict(values, str(config_file))
    if "bilm_hdf5" in (source_format, target_format) and config.char_cnn is None:
        expected = "an ELMo with a character CNN (the weights.hdf5 layout holds one)"
        raise input_error(str(config_file), expected, "no char_cnn: a token-embedding biLM")
    vocab_file = find_vocab(input_dir)
    if source_format == "bilm_hdf5":
        if config.n_tokens_vocab is not None and vocab_file is None:
            notes.append(
                f"{config_file} counts a vocabulary (n_tokens_vocab={config.n_tokens_vocab}) "
                "but none was given (--vocab_file): the biLM reads words through its character "
                "CNN alone, and n_tokens_vocab is left out of the written config"
            )
            config = config.replace(n_tokens_vocab=None)
        weights = find_hdf5_weights(input_dir, checkpoint)
        bilm, report = elmo.load_hdf5(weights, config, str(config_file), FLAGS.skip_variables)
        if config.n_tokens_vocab is not None:
            try:
                bilm.set_char_table(list(tokenization.load_vocab(vocab_file)))
            except ValueError as e:
                where = f"the vocabulary of {config_file}"
                raise input_error(str(vocab_file), where, str(e)) from None
        summary = report.summary()
    else:
        bilm = elmo.ElmoBiLM(config, name="encoder")
        bilm.build()
        source = checkpoint or input_dir
        try:  # run_pretraining's ElmoLM or a converted biLM: both hold model/encoder
            prefix = trainer.restore_model_weights(tf.train.Checkpoint(encoder=bilm), source)
        except ValueError as e:
            where = f"a Cloze ELMo checkpoint of {config_file}"
            raise input_error(str(source), where, str(e)) from None
        summary = f"read the Cloze checkpoint {prefix} (its biLM; a softmax is not converted)"
    with checkpoints.AtomicOutputDir(FLAGS.output_dir) as tmp:
        if target_format == "bilm_hdf5":
            elmo.save_hdf5(bilm, tmp)
        else:
            tf.train.Checkpoint(model=tf.train.Checkpoint(encoder=bilm)).save(str(tmp / "ckpt"))
            (tmp / "bert_config.json").write_text(config.to_json_string())
        if vocab_file is not None:
            shutil.copyfile(vocab_file, tmp / "vocab.txt")
        written = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
    print(f"converted ELMo --from={source_format} to --to={target_format}")
    print(summary)
    for note in notes:
        logging.warning(note)
    print(f"wrote {FLAGS.output_dir}: {', '.join(written)}")


def check_serving_inputs(config, config_where: str, bpe_files) -> None:
    """Refuses --max_seq_length beyond the config's positions (after a RoBERTa's offset) and a
    RoBERTa BPE vocabulary (bpe_files, when it is the SavedModel's) beyond the embedding table."""
    from data_prep import bpe
    from modeling import bert

    if FLAGS.max_seq_length < 3:
        raise app.UsageError(f"--max_seq_length={FLAGS.max_seq_length}: expected at least 3")
    size = None
    if bpe_files:
        size = max(bpe.RobertaTokenizer.from_folder(Path(bpe_files[0]).parent).vocab.values()) + 1
    bert.check_run_fits(config, config_where, FLAGS.max_seq_length, size)


def convert(source_format: str, target_format: str) -> None:
    from data_prep import bpe, spiece
    from data_prep.errors import input_error
    from modeling import checkpoints

    input_dir, checkpoint = FLAGS.input_dir, FLAGS.init_checkpoint
    if input_dir and not os.path.isdir(input_dir):
        raise input_error(input_dir, "a folder (--input_dir)", "no such folder")
    config_file = find_config(source_format, input_dir, checkpoint)
    vocab_file = find_vocab(input_dir)
    # A RoBERTa checkpoint's byte-level BPE (vocab.json + merges.txt) goes along under its
    # Hugging Face names, so the output folder is the run scripts' --vocab_file.
    bpe_files = bpe.folder_files(input_dir) if input_dir else None
    # An ALBERT's SentencePiece model goes along too (run scripts read the folder's spiece.model).
    spiece_file = spiece.model_file(input_dir) if input_dir else None
    own_module = source_format in ("hf", "cloze") and own_module_family(config_file)
    if source_format in ("tf1_gpt2", "bilm_hdf5"):
        own_module = FAMILY_OF_FORMAT[source_format]
    if (
        vocab_file is None
        and target_format in ("hf", "saved_model", "keras_hub")
        and not own_module
        and not (bpe_files and target_format in ("hf", "saved_model"))
        and not (spiece_file and target_format == "hf")
    ):
        raise input_error(
            str(Path(input_dir or ".") / "vocab.txt"),
            f"a vocab file for --to={target_format} (or --vocab_file)",
            "no such file",
        )
    checkpoints.check_output_dir(FLAGS.output_dir)  # before the slow part

    if own_module == "elmo":
        return convert_elmo(source_format, target_format, config_file, input_dir, checkpoint)
    if own_module:
        return convert_by_module(
            own_module, source_format, target_format, config_file, input_dir, checkpoint
        )
    if source_format in ("hf", "cloze"):
        # Either field set and any family, told by the keys (checkpoints.read_any_config).
        config = checkpoints.read_any_config(config_file)
    elif source_format == "keras_hub":
        config = checkpoints.read_keras_hub_config(config_file)
        check_keras_hub_lowercase(input_dir or checkpoint)
    elif source_format == "tf1_albert":
        from modeling import albert

        config = albert.AlbertConfig.from_json_file(config_file)
    elif source_format == "tf1_electra":
        from modeling import electra

        config = electra.ElectraConfig.from_json_file(config_file)
    else:
        from modeling import bert

        config = bert.BertConfig.from_json_file(config_file)
    check_target_family(config, target_format, str(config_file))
    if vocab_file is not None:
        checkpoints.check_vocab_size(vocab_file, config, str(config_file))
    if target_format == "saved_model":  # refused here, before the slow part
        check_serving_inputs(config, str(config_file), None if vocab_file else bpe_files)
    if target_format == "keras_hub":  # refused here, before the slow part
        checkpoints.check_keras_hub_config(config, str(config_file), FLAGS.allow_gelu_approximation)
    source = checkpoint or input_dir
    args = (source, config, str(config_file), FLAGS.skip_variables)
    if source_format == "tf1_bert":
        model, report = checkpoints.load_tf1_bert(*args)
    elif source_format == "tf1_albert":
        model, report = checkpoints.load_tf1_albert(*args)
    elif source_format == "tf1_electra":
        model, report = checkpoints.load_tf1_electra(*args)
    elif source_format == "hf":
        model, report = checkpoints.load_hf(*args, trust_pickle=FLAGS.trust_pickle)
    elif source_format == "keras_hub":
        model, report = checkpoints.load_keras_hub(*args)
    else:
        model, report = checkpoints.load_cloze(*args)

    with checkpoints.AtomicOutputDir(FLAGS.output_dir) as tmp:
        if target_format == "cloze":
            checkpoints.save_cloze(model, tmp)
        elif target_format in TF1_CONFIG_NAMES:
            checkpoints.save_tf1(model, tmp)
        elif target_format == "hf":
            kind = "wordpiece" if vocab_file else ("bpe" if bpe_files else "sentencepiece")
            _, notes = checkpoints.save_hf(model, tmp, FLAGS.do_lower_case, kind)
            report.notes += notes
        elif target_format == "saved_model":
            if FLAGS.encoder_branches > 1 or FLAGS.remove_padding:
                from modeling import bert

                bert.set_encoder_branches(model, FLAGS.encoder_branches)
                bert.set_remove_padding(model, FLAGS.remove_padding)
            if vocab_file is None:  # a RoBERTa's BPE folder: cased unless asked explicitly
                vocab, lower = input_dir, FLAGS.do_lower_case and FLAGS["do_lower_case"].present
            else:
                vocab, lower = vocab_file, FLAGS.do_lower_case
            checkpoints.export_saved_model(model, tmp, vocab, lower, FLAGS.max_seq_length)
        elif target_format == "keras_hub":
            report.notes += checkpoints.export_keras_hub(
                model, tmp, vocab_file, FLAGS.do_lower_case, FLAGS.allow_gelu_approximation
            )
        else:
            checkpoints.export_keras(model, tmp / "model.keras")
        if target_format in ("cloze", "keras", *TF1_CONFIG_NAMES):
            name = TF1_CONFIG_NAMES.get(target_format, "bert_config.json")
            (tmp / name).write_text(config.to_json_string())
        # saved_model and keras_hub keep the vocab in their assets/.
        if vocab_file is not None and target_format not in ("saved_model", "keras_hub"):
            shutil.copyfile(vocab_file, tmp / "vocab.txt")
        if bpe_files and target_format in ("cloze", "hf", "keras", *TF1_CONFIG_NAMES):
            for source, name in zip(bpe_files, bpe.BPE_FILE_NAMES[1]):
                shutil.copyfile(source, tmp / name)
        if spiece_file and target_format in ("cloze", "hf", "keras", *TF1_CONFIG_NAMES):
            shutil.copyfile(spiece_file, tmp / "spiece.model")
        written = sorted(p.relative_to(tmp) for p in tmp.rglob("*") if p.is_file())
        sizes = {str(p): (tmp / p).stat().st_size for p in written}

    print(f"converted --from={source_format} to --to={target_format}")
    print(f"config: {config_file}" + (f"; vocab: {vocab_file}" if vocab_file else ""))
    for note in report.notes:
        if note.startswith("WARNING"):
            logging.warning(note)
    print(report.summary())
    print(f"wrote {FLAGS.output_dir}:")
    for name, size in sizes.items():
        print(f"  {name} ({size:,} bytes)")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    for name in ("from", "to", "output_dir"):
        if not FLAGS[name].value:
            raise app.UsageError(f"--{name} is required")
    if not (FLAGS.input_dir or FLAGS.init_checkpoint):
        raise app.UsageError("--input_dir or --init_checkpoint is required")
    if FLAGS.encoder_branches < 1 or (FLAGS.encoder_branches > 1 and FLAGS.to != "saved_model"):
        raise app.UsageError(
            f"--encoder_branches={FLAGS.encoder_branches}: expected 1, or more with "
            f"--to=saved_model (found --to={FLAGS.to})"
        )
    if FLAGS.remove_padding and FLAGS.to != "saved_model":
        raise app.UsageError(
            f"--remove_padding: an execution setting of --to=saved_model (found --to={FLAGS.to})"
        )
    from data_prep.errors import InputError

    try:
        convert(FLAGS["from"].value, FLAGS.to)
    except InputError as e:
        # The user's input is wrong: say where and what, without a traceback.
        print(f"convert_checkpoint.py: error: {e}", file=sys.stderr)
        print(f"nothing was written to {FLAGS.output_dir}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
