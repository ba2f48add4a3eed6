"""The TF Model Garden peer of the pretraining, inference and fine-tuning benchmarks, run by
bench/peer_worker.py.

TF Model Garden's (tf-models-official's) BertPretrainerV2 over its BertEncoderV2, with a
ClassificationHead for NSP, as its BERT pretraining experiment builds them, from the same config
as Cloze's side (the Hugging Face config.json dict bench/torch_peer.py gets too): its GELU in
the layers and the MLM transform (BERT's tanh form for "gelu_new", which is Cloze's "gelu";
exact for "gelu"), dropout 0.1 (the NSP head's too), the same initializer range. Trained as
Model Garden's MaskedLMTask trains it: the masked LM loss averaged over masked_lm_weights plus
the NSP loss, global-norm clipping at 1.0 inside its BERT optimizer (AdamWeightDecay: lr 1e-4
with a linear decay, eps 1e-6, weight decay 0.01 except LayerNorm and bias), and the steps of a
call in one tf.function's while loop, as its orbit trainer runs them (use_tf_while_loop). Under
--precision=bf16 the tf_keras policy is mixed_bfloat16 (the losses in float32); under fp16 it is
mixed_float16 with the optimizer in tf_keras' dynamic LossScaleOptimizer, as Model Garden's
performance.configure_optimizer wraps it, and its base task's train_step scales the loss and
unscales the gradients (the update skipped and the scale halved on an overflow).

Its encoder also builds a pooler it does not use for NSP (the classification head has its own
dense layer on [CLS]), so it holds hidden^2 + hidden parameters more than Cloze's model, and
computes that one (batch x hidden x hidden) product more: negligible work, but a parameter
count that is not Cloze's.

Peer with head="classifier" is the fine-tuning benchmark's side: BertClassifier over the same
BertEncoderV2 (its pooler, dropout 0.1, a dense layer to 2 classes: Cloze's classifier's
parameters exactly), the mean cross-entropy as its SentencePredictionTask computes it, lr 2e-5.
Encoder is the inference benchmark's side: Cloze's weights reach Model Garden's BertEncoder
through Model Garden's own converter of google-research/bert checkpoints (its docstring).

Model Garden is Keras 2 only (tf_keras): the worker runs with TF_USE_LEGACY_KERAS=1, which is
why it is a process of its own (the benchmark's own process runs Keras 3). Installed by
bench/requirements-model-garden.txt.
"""

from __future__ import annotations


class Peer:
    """BertPretrainerV2 (or, with head="classifier", BertClassifier), its optimizer, one fixed
    batch and a compiled loop of train steps."""

    def __init__(
        self,
        config: dict,
        batch: dict,
        precision: str,
        seed: int,
        threads: int,
        head: str = "pretraining",
    ):
        import numpy as np
        import tensorflow as tf
        import tf_keras
        from official.modeling.optimization import legacy_adamw
        from official.nlp.modeling import layers, models, networks

        approximate = {"gelu_new": True, "gelu": False}.get(config["hidden_act"])
        if approximate is None:
            raise ValueError(f"hidden_act {config['hidden_act']!r}: expected gelu_new or gelu")
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf_keras.mixed_precision.set_global_policy(
            {"bf16": "mixed_bfloat16", "fp16": "mixed_float16"}.get(precision, "float32")
        )
        tf_keras.utils.set_random_seed(seed)

        def gelu(x):
            return tf_keras.activations.gelu(x, approximate=approximate)

        init = tf_keras.initializers.TruncatedNormal(stddev=config["initializer_range"])
        encoder = networks.BertEncoderV2(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_attention_heads=config["num_attention_heads"],
            max_sequence_length=config["max_position_embeddings"],
            type_vocab_size=config["type_vocab_size"],
            inner_dim=config["intermediate_size"],
            inner_activation=gelu,
            output_dropout=config["hidden_dropout_prob"],
            attention_dropout=config["attention_probs_dropout_prob"],
            initializer=init,
        )
        self.inputs = {
            "input_word_ids": tf.constant(np.asarray(batch["input_ids"], np.int32)),
            "input_mask": tf.constant(np.asarray(batch["input_mask"], np.int32)),
            "input_type_ids": tf.constant(np.asarray(batch["segment_ids"], np.int32)),
        }
        loss_fn = tf_keras.losses.sparse_categorical_crossentropy
        if head == "pretraining":
            nsp = layers.ClassificationHead(
                inner_dim=config["hidden_size"],
                num_classes=2,
                dropout_rate=config["hidden_dropout_prob"],
                initializer=init,
                name="next_sentence",
            )
            self.model = models.BertPretrainerV2(
                encoder, mlm_activation=gelu, mlm_initializer=init, classification_heads=[nsp]
            )
            self.inputs["masked_lm_positions"] = tf.constant(
                np.asarray(batch["masked_lm_positions"], np.int32)
            )
            ids = tf.constant(np.asarray(batch["masked_lm_ids"], np.int32))
            weights = tf.constant(np.asarray(batch["masked_lm_weights"], np.float32))
            sentence = tf.constant(np.asarray(batch["next_sentence_labels"], np.int32).reshape(-1))

            def loss_of(out):
                mlm = loss_fn(ids, tf.cast(out["mlm_logits"], tf.float32), from_logits=True)
                mlm = tf.reduce_sum(mlm * weights) / (tf.reduce_sum(weights) + 1e-5)
                logits = tf.cast(out["next_sentence"], tf.float32)
                return mlm + tf.reduce_mean(loss_fn(sentence, logits, from_logits=True))

        else:
            # As its SentencePredictionTask builds it: the encoder's pooler, dropout 0.1, a
            # dense layer; the mean cross-entropy of the float32 logits.
            self.model = models.BertClassifier(
                encoder, num_classes=2, initializer=init, dropout_rate=0.1
            )
            labels = tf.constant(np.asarray(batch["label_ids"], np.int32).reshape(-1))

            def loss_of(out):
                logits = tf.cast(out, tf.float32)
                return tf.reduce_mean(loss_fn(labels, logits, from_logits=True))

        self.model(self.inputs)  # builds the weights
        self.optimizer = legacy_adamw.AdamWeightDecay(
            learning_rate=tf_keras.optimizers.schedules.PolynomialDecay(
                1e-4 if head == "pretraining" else 2e-5, 10_000, 0.0
            ),
            epsilon=1e-6,
            weight_decay_rate=0.01,
            exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"],
            gradient_clip_norm=1.0,
        )
        scaled = precision == "fp16"
        if scaled:  # performance.configure_optimizer(use_float16=True, loss_scale="dynamic")
            self.optimizer = tf_keras.mixed_precision.LossScaleOptimizer(self.optimizer)
        model, optimizer, inputs = self.model, self.optimizer, self.inputs

        def step():
            with tf.GradientTape() as tape:
                loss = loss_of(model(inputs, training=True))
                target = optimizer.get_scaled_loss(loss) if scaled else loss
            variables = model.trainable_variables
            grads = tape.gradient(target, variables)
            if not scaled:
                optimizer.apply_gradients(zip(grads, variables))
                return loss, tf.constant(False)
            scale = tf.identity(optimizer.loss_scale)
            optimizer.apply_gradients(zip(optimizer.get_unscaled_gradients(grads), variables))
            return loss, optimizer.loss_scale < scale  # an overflow halves the scale

        @tf.function
        def train(steps):
            losses = tf.TensorArray(tf.float32, size=steps)
            overflow = tf.TensorArray(tf.bool, size=steps)
            for i in tf.range(steps):
                loss, skipped = step()
                losses = losses.write(i, loss)
                overflow = overflow.write(i, skipped)
            return losses.stack(), overflow.stack()

        self._train = train
        self.versions = _versions()

    def count_params(self) -> int:
        return int(self.model.count_params())

    def train(self, steps: int) -> dict:
        """{"losses": [...], "overflow": [...]}: `steps` steps' losses and whether fp16's loss
        scale overflowed in each (peer_worker's train reply)."""
        import tensorflow as tf

        losses, overflow = self._train(tf.constant(steps, tf.int32))
        return {
            "losses": [float(x) for x in losses.numpy()],
            "overflow": [bool(x) for x in overflow.numpy()],
        }

    def get_num_threads(self) -> int:
        return _intra_op_threads()


class Encoder:
    """The inference side: Model Garden's BertEncoder holding Cloze's encoder's weights, which
    reach it the way a published BERT checkpoint reaches a Model Garden user. `model_dir` holds
    a google-research/bert checkpoint (bert_model.ckpt, bert_config.json: what Cloze's
    convert_checkpoint.py --to=tf1_bert writes); Model Garden's own converter
    (official/nlp/tools/tf2_bert_encoder_checkpoint_converter.py's convert_checkpoint) turns it
    into its object-based checkpoint of a BertEncoder, which is built here as that converter
    builds it (its activation from bert_config's hidden_act: "gelu" is the tanh form, as the
    original's and Cloze's) and restored, every variable matched. Passes run in a tf.function
    in inference mode, fed one fixed batch."""

    def __init__(self, model_dir: str, batch: dict, threads: int):
        import os

        import numpy as np
        import tensorflow as tf
        import tf_keras
        from official.legacy.bert import configs
        from official.modeling import tf_utils
        from official.nlp.modeling import networks
        from official.nlp.tools import tf2_bert_encoder_checkpoint_converter as converter

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        cfg = configs.BertConfig.from_json_file(os.path.join(model_dir, "bert_config.json"))
        converted = os.path.join(model_dir, "model_garden", "encoder")
        converter.convert_checkpoint(
            cfg,
            converted,
            os.path.join(model_dir, "bert_model.ckpt"),
            checkpoint_model_name="encoder",
            converted_model="encoder",
        )
        self.model = networks.BertEncoder(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            num_layers=cfg.num_hidden_layers,
            num_attention_heads=cfg.num_attention_heads,
            intermediate_size=cfg.intermediate_size,
            activation=tf_utils.get_activation(cfg.hidden_act),
            dropout_rate=cfg.hidden_dropout_prob,
            attention_dropout_rate=cfg.attention_probs_dropout_prob,
            max_sequence_length=cfg.max_position_embeddings,
            type_vocab_size=cfg.type_vocab_size,
            initializer=tf_keras.initializers.TruncatedNormal(stddev=cfg.initializer_range),
            embedding_width=cfg.embedding_size,
            dict_outputs=True,
        )
        saved = tf.train.latest_checkpoint(os.path.dirname(converted))
        restored = tf.train.Checkpoint(encoder=self.model).read(saved)
        restored.assert_existing_objects_matched().expect_partial()  # its save_counter unread
        self.inputs = {
            "input_word_ids": tf.constant(np.asarray(batch["input_ids"], np.int32)),
            "input_mask": tf.constant(np.asarray(batch["input_mask"], np.int32)),
            "input_type_ids": tf.constant(np.asarray(batch["segment_ids"], np.int32)),
        }
        model = self.model

        @tf.function
        def infer(inputs):
            out = model(inputs, training=False)
            return out["sequence_output"], out["pooled_output"]

        self._infer = infer
        self.versions = _versions()

    def count_params(self) -> int:
        return int(self.model.count_params())

    def get_num_threads(self) -> int:
        return _intra_op_threads()

    def infer(self, steps: int, save: str | None = None) -> None:
        """`steps` forward passes; the last one's outputs to the .npz file `save` if given."""
        import numpy as np

        for _ in range(steps):
            sequence_output, pooled_output = self._infer(self.inputs)
        sequence_output = sequence_output.numpy()  # waits for the last pass
        if save:
            np.savez(save, sequence_output=sequence_output, pooled_output=pooled_output.numpy())


def _intra_op_threads() -> int:
    import tensorflow as tf

    return tf.config.threading.get_intra_op_parallelism_threads()


def _versions() -> dict:
    import tensorflow as tf
    import tf_keras

    return {
        "tensorflow": tf.__version__,
        "tf_keras": tf_keras.__version__,
        "tf_models_official": _version("tf-models-official"),
    }


def _version(package: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
