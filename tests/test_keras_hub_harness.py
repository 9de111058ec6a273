"""KerasHub's own model test harness, which every KerasHub model passes.

`keras_hub.src.tests.test_case.TestCase` checks what a KerasHub user relies
on: config and serialization round trips, eager and compiled calls on
variable lengths, mixed precision and quantization policies on every
sublayer, `tf.data` and Grain pipelines, `fit` and `predict` with the
preprocessor inside the model or split out, `.keras` saving, and presets.
"""

import keras
import numpy as np
from keras_hub.src.tests import test_case

import keras_transformer as kt
from helpers import PAIRS, TINY_CONFIG

SOURCES = [source for source, _ in PAIRS]
TARGETS = [target for _, target in PAIRS]
SEQUENCE_LENGTH = 16


class HarnessTestCase(test_case.TestCase):
    """Tiny models of the tests' corpus; the harness reads `self.init_kwargs`."""

    # tf.test.TestCase's deprecated `test_session` context manager is no test: pytest would collect it.
    test_session = None

    def setUp(self):
        super().setUp()
        keras.utils.set_random_seed(11)
        self.tokenizer = kt.train_tokenizer(SOURCES + TARGETS, vocabulary_size=64)
        self.vocabulary_size = self.tokenizer.vocabulary_size()
        # One layer a stack: the harness checks interfaces, and compiles many times.
        self.backbone_kwargs = {
            **TINY_CONFIG,
            "vocabulary_size": self.vocabulary_size,
            "num_encoder_layers": 1,
            "num_decoder_layers": 1,
        }
        self.preprocessor_kwargs = {
            "tokenizer": self.tokenizer,
            "encoder_sequence_length": SEQUENCE_LENGTH,
            "decoder_sequence_length": SEQUENCE_LENGTH,
        }
        self.train_data = ({"encoder_text": SOURCES[:4], "decoder_text": TARGETS[:4]},)
        preprocessor = kt.TransformerPreprocessor(**self.preprocessor_kwargs)
        self.token_ids = preprocessor(*self.train_data)[0]


class TransformerBackboneTest(HarnessTestCase):
    def setUp(self):
        super().setUp()
        self.init_kwargs = self.backbone_kwargs

    def test_backbone_basics(self):
        batch, length = self.token_ids["encoder_token_ids"].shape
        self.run_backbone_test(
            cls=kt.TransformerBackbone,
            init_kwargs=self.init_kwargs,
            input_data=self.token_ids,
            expected_output_shape={
                "encoder_sequence_output": (batch, length, TINY_CONFIG["hidden_dim"]),
                "decoder_sequence_output": (batch, length, TINY_CONFIG["hidden_dim"]),
            },
        )

    def test_saved_model(self):
        self.run_model_saving_test(cls=kt.TransformerBackbone, init_kwargs=self.init_kwargs, input_data=self.token_ids)


class TransformerPreprocessorTest(HarnessTestCase):
    def setUp(self):
        super().setUp()
        self.init_kwargs = self.preprocessor_kwargs

    def test_preprocessor_basics(self):
        (x, y, sample_weight) = self.run_preprocessor_test(
            cls=kt.TransformerPreprocessor,
            init_kwargs=self.init_kwargs,
            input_data=self.train_data,
            token_id_key="decoder_token_ids",
        )
        start, end = self.tokenizer.start_token_id, self.tokenizer.end_token_id
        source = self.tokenizer(SOURCES[0])
        self.assertAllEqual(x["encoder_token_ids"][0][: len(source) + 2], [start, *source, end])
        # Teacher forcing: the labels are the decoder's inputs shifted left.
        self.assertAllEqual(y[:, :-1], x["decoder_token_ids"][:, 1:])
        self.assertAllEqual(sample_weight, y != self.tokenizer.pad_token_id)


class TransformerTest(HarnessTestCase):
    def setUp(self):
        super().setUp()
        self.init_kwargs = {
            "backbone": kt.TransformerBackbone(**self.backbone_kwargs),
            "preprocessor": kt.TransformerPreprocessor(**self.preprocessor_kwargs),
        }

    def test_task_basics(self):
        self.run_task_test(
            cls=kt.Transformer,
            init_kwargs=self.init_kwargs,
            train_data=self.train_data,
            expected_output_shape=(len(SOURCES[:4]), SEQUENCE_LENGTH, self.vocabulary_size),
            # The harness checks which inputs `fit` and `predict` take; XLA would
            # only add minutes of compiling tiny steps (other tests train with it).
            compile_kwargs={"jit_compile": False},
        )

    def test_saved_model(self):
        self.run_model_saving_test(cls=kt.Transformer, init_kwargs=self.init_kwargs, input_data=self.token_ids)


class ShippedPresetTest(HarnessTestCase):
    """The shipped preset loads through every class, weights included: the
    first outputs are pinned (the same on every backend), so weights that
    load wrongly, or not at all, fail here. Retraining the preset changes them."""

    PRESET = "multi30k_en_de"
    SOURCE = "a dog runs on the grass ."

    def setUp(self):
        super().setUp()
        self.sentences = ({"encoder_text": [self.SOURCE], "decoder_text": ["ein hund rennt ."]},)
        self.preset_token_ids = kt.TransformerPreprocessor.from_preset(self.PRESET)(*self.sentences)[0]

    def test_task_preset(self):
        length = self.preset_token_ids["decoder_token_ids"].shape[1]
        self.run_preset_test(
            cls=kt.Transformer,
            preset=self.PRESET,
            input_data=self.preset_token_ids,
            expected_output_shape=(1, length, 10_000),
            expected_partial_output=np.array([-12.5372, -12.4575, 0.4322, 1.0282, -2.0097, 0.6847]),
        )

    def test_backbone_preset(self):
        source_length = self.preset_token_ids["encoder_token_ids"].shape[1]
        target_length = self.preset_token_ids["decoder_token_ids"].shape[1]
        self.run_preset_test(
            cls=kt.TransformerBackbone,
            preset=self.PRESET,
            input_data=self.preset_token_ids,
            expected_output_shape={
                "encoder_sequence_output": (1, source_length, 128),
                "decoder_sequence_output": (1, target_length, 128),
            },
            expected_partial_output={
                "encoder_sequence_output": np.array([0.0, 0.0263, -0.0023, 0.0389, 0.0175, 0.0494]),
                "decoder_sequence_output": np.array([-0.6643, -0.5330, -0.2728, 0.2314, 0.1380, 0.8871]),
            },
        )

    def test_preprocessor_preset(self):
        self.run_preset_test(cls=kt.TransformerPreprocessor, preset=self.PRESET, input_data=self.sentences)

    def test_tokenizer_preset(self):
        self.run_preset_test(
            cls=kt.TransformerTokenizer,
            preset=self.PRESET,
            input_data=[self.SOURCE],
            expected_output=[[5, 228, 1270, 62, 54, 599, 7447]],
        )
