"""The encoder-decoder network of section 3, as a KerasHub `Backbone`."""

import keras
import keras_hub
from keras import ops

from keras_transformer.layers import (
    DecoderBlock,
    EncoderBlock,
    LogitsBias,
    ScaledSharedEmbedding,
    SinusoidalPositionEncoding,
)
from keras_transformer.layers.cached_attention import (
    empty_keys_values,
    empty_slot_owners,
    expand_to_beams,
    record_position,
    visible_slots,
)
from keras_transformer.training.recipe import TrainingRecipe
from keras_transformer.utils import special_tokens


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerBackbone(keras_hub.models.Backbone):
    """The Transformer encoder and decoder stacks (Vaswani et al. 2017, 3.1).

    Source and target tokens go through one shared, scaled embedding (3.4)
    plus sinusoidal positions (3.5) and dropout (5.4), then N encoder layers and
    N decoder layers. The outputs are the final hidden states of both stacks;
    the task model `Transformer` turns decoder states into logits with the
    transposed embedding matrix.

    Table 3's configurations, in this class's names:

    | paper   | argument            | base | big  |
    | ------- | ------------------- | ---- | ---- |
    | N       | num_encoder_layers, num_decoder_layers | 6 | 6 |
    | d_model | hidden_dim          | 512  | 1024 |
    | d_ff    | intermediate_dim    | 2048 | 4096 |
    | h       | num_heads           | 8    | 16   |
    | P_drop  | dropout             | 0.1  | 0.3  |

    Args:
        vocabulary_size: size of the shared source/target subword vocabulary.
        num_encoder_layers: N for the encoder.
        num_decoder_layers: N for the decoder.
        num_heads: h, the number of attention heads; d_k = hidden_dim / h.
        hidden_dim: d_model.
        intermediate_dim: d_ff, the inner size of the feed-forward network.
        dropout: P_drop, on every sublayer output and on the embedding sums.
        attention_dropout: dropout on the attention weights; 0 in the paper
            (KerasHub's layers would reuse `dropout` there).
        max_sequence_length: the longest source (and target) in tokens that the
            model accepts; sinusoids have no limit, but the preprocessor, the
            translation buckets and the checks on input length use this bound.
        normalize_first: `False` (default) is the paper's Post-LN; `True` is
            Pre-LN, which adds a final LayerNorm to each stack.
        layer_norm_epsilon: epsilon of every LayerNorm.
        activation: the FFN's activation: ReLU in the paper (3.3); Opus-MT's
            base models use `"swish"`.
        position_encoding_layout: `"interleaved"` sines and cosines as in
            section 3.5, or `"concatenated"` as tensor2tensor and Marian
            store them (see `SinusoidalPositionEncoding`).
        pad_token_id, start_token_id, end_token_id, unk_token_id: the special
            ids of the vocabulary (`keras_transformer.utils.special_tokens` for the
            vocabularies this project trains; converted checkpoints record
            their own). Decoding starts from `start_token_id`, stops at
            `end_token_id` and never emits padding or the start token.
        use_logits_bias: add a learned bias to the logits (Marian's
            `final_logits_bias`); the paper has none.
        target_vocabulary_size: `None` (default) shares one vocabulary and
            one embedding matrix between source, target and output
            projection (section 3.4). A size gives the target its own
            vocabulary and embedding matrix (`target_token_embedding`), to
            which the output projection is tied, as in Marian checkpoints
            with `share_encoder_decoder_embeddings: false`; the special ids
            are then target ids, and `token_embedding` embeds the source.
        dtype: the variable/compute dtype or a `keras.DTypePolicy`.

    Example:
    >>> import numpy as np
    >>> backbone = TransformerBackbone(
    ...     vocabulary_size=100, num_encoder_layers=1, num_decoder_layers=1,
    ...     num_heads=2, hidden_dim=8, intermediate_dim=16)
    >>> out = backbone({
    ...     "encoder_token_ids": np.array([[2, 5, 6, 3]]),
    ...     "encoder_padding_mask": np.array([[1, 1, 1, 1]]),
    ...     "decoder_token_ids": np.array([[2, 7, 8]]),
    ...     "decoder_padding_mask": np.array([[1, 1, 1]]),
    ... })
    >>> tuple(out["decoder_sequence_output"].shape)
    (1, 3, 8)
    """

    def __init__(
        self,
        vocabulary_size: int,
        num_encoder_layers: int,
        num_decoder_layers: int,
        num_heads: int,
        hidden_dim: int,
        intermediate_dim: int,
        dropout: float = TrainingRecipe.dropout,
        attention_dropout: float = 0.0,
        max_sequence_length: int = 1024,
        normalize_first: bool = False,
        layer_norm_epsilon: float = 1e-6,
        activation: str = "relu",
        position_encoding_layout: str = "interleaved",
        pad_token_id: int = special_tokens.PAD_ID,
        start_token_id: int = special_tokens.START_ID,
        end_token_id: int = special_tokens.END_ID,
        unk_token_id: int = special_tokens.UNK_ID,
        use_logits_bias: bool = False,
        target_vocabulary_size: int | None = None,
        dtype=None,
        **kwargs,
    ):
        output_size = target_vocabulary_size or vocabulary_size
        special_ids = dict(pad=pad_token_id, start=start_token_id, end=end_token_id, unk=unk_token_id)
        outside = {name: i for name, i in special_ids.items() if not 0 <= i < output_size}
        if outside:
            side = "target vocabulary" if target_vocabulary_size else "vocabulary"
            raise ValueError(f"special token ids {outside} are outside the {side} of {output_size}.")
        if end_token_id in (pad_token_id, start_token_id):
            raise ValueError(
                f"end_token_id ({end_token_id}) must differ from pad_token_id ({pad_token_id}) "
                f"and start_token_id ({start_token_id}): decoding never emits those two."
            )
        if hidden_dim % num_heads:
            raise ValueError(
                f"hidden_dim ({hidden_dim}) must be divisible by num_heads "
                f"({num_heads}): d_k = d_model / h must be a whole number."
            )
        # === Layers ===
        self.token_embedding = ScaledSharedEmbedding(vocabulary_size, hidden_dim, dtype=dtype, name="token_embedding")
        self.target_token_embedding = None
        if target_vocabulary_size is not None:
            self.target_token_embedding = ScaledSharedEmbedding(
                target_vocabulary_size, hidden_dim, dtype=dtype, name="target_token_embedding"
            )
        self.position_encoding = SinusoidalPositionEncoding(
            layout=position_encoding_layout, dtype=dtype, name="position_encoding"
        )
        self.encoder_embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="encoder_embedding_dropout")
        self.decoder_embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="decoder_embedding_dropout")
        block_kwargs = dict(
            intermediate_dim=intermediate_dim,
            num_heads=num_heads,
            dropout=dropout,
            attention_dropout=attention_dropout,
            activation=activation,
            normalize_first=normalize_first,
            layer_norm_epsilon=layer_norm_epsilon,
            dtype=dtype,
        )
        self.encoder_blocks = [
            EncoderBlock(name=f"encoder_block_{i}", **block_kwargs) for i in range(num_encoder_layers)
        ]
        self.decoder_blocks = [
            DecoderBlock(name=f"decoder_block_{i}", **block_kwargs) for i in range(num_decoder_layers)
        ]
        # Pre-LN leaves the last residual sum unnormalised; Post-LN does not.
        self.encoder_final_norm = self.decoder_final_norm = None
        if normalize_first:
            self.encoder_final_norm = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=dtype, name="encoder_final_norm"
            )
            self.decoder_final_norm = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=dtype, name="decoder_final_norm"
            )

        # === Functional model ===
        encoder_token_ids = keras.Input((None,), dtype="int32", name="encoder_token_ids")
        encoder_padding_mask = keras.Input((None,), dtype="int32", name="encoder_padding_mask")
        decoder_token_ids = keras.Input((None,), dtype="int32", name="decoder_token_ids")
        decoder_padding_mask = keras.Input((None,), dtype="int32", name="decoder_padding_mask")

        encoder_output = self.encode(encoder_token_ids, encoder_padding_mask)
        x = self.embed_target(decoder_token_ids)
        for block in self.decoder_blocks:
            x = block(
                x,
                encoder_output,
                decoder_padding_mask=decoder_padding_mask,
                encoder_padding_mask=encoder_padding_mask,
            )
        if self.decoder_final_norm is not None:
            x = self.decoder_final_norm(x)
        super().__init__(
            inputs={
                "encoder_token_ids": encoder_token_ids,
                "encoder_padding_mask": encoder_padding_mask,
                "decoder_token_ids": decoder_token_ids,
                "decoder_padding_mask": decoder_padding_mask,
            },
            outputs={
                "encoder_sequence_output": encoder_output,
                "decoder_sequence_output": x,
            },
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_encoder_layers = num_encoder_layers
        self.num_decoder_layers = num_decoder_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.max_sequence_length = max_sequence_length
        self.normalize_first = normalize_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.activation = activation
        self.position_encoding_layout = position_encoding_layout
        self.pad_token_id = pad_token_id
        self.start_token_id = start_token_id
        self.end_token_id = end_token_id
        self.unk_token_id = unk_token_id
        self.use_logits_bias = use_logits_bias
        self.target_vocabulary_size = target_vocabulary_size
        # Made after the functional graph, which does not use it (logits are
        # the task's output): a layer assigned before it would go untracked
        # on the torch backend.
        self.logits_bias = LogitsBias(output_size, dtype=dtype, name="logits_bias") if use_logits_bias else None

    @property
    def decoder_token_embedding(self) -> ScaledSharedEmbedding:
        """The embedding of target tokens, tied to the output projection:
        `target_token_embedding` if the target has its own vocabulary, else
        the shared `token_embedding`."""
        return self.token_embedding if self.target_token_embedding is None else self.target_token_embedding

    def logits(self, hidden):
        """The pre-softmax projection: `hidden @ E^T` (section 3.4), plus the
        logits bias if the backbone has one."""
        logits = self.decoder_token_embedding(hidden, reverse=True)
        if self.logits_bias is not None:
            logits = self.logits_bias(logits)
        return logits

    def embed_source(self, token_ids, training=None):
        """The encoder's input: `Dropout(E[ids] * sqrt(d_model) + PE)` of source tokens (sections 3.4, 3.5, 5.4)."""
        return self._embed(token_ids, self.token_embedding, self.encoder_embedding_dropout, 0, training)

    def embed_target(self, token_ids, start_index=0, training=None):
        """The decoder's input: `Dropout(E[ids] * sqrt(d_model) + PE)` of target
        tokens (`decoder_token_embedding`), for positions from `start_index`."""
        return self._embed(
            token_ids, self.decoder_token_embedding, self.decoder_embedding_dropout, start_index, training
        )

    def _embed(self, token_ids, embedding, dropout, start_index, training):
        tokens = embedding(token_ids)
        positions = self.position_encoding(tokens, start_index=start_index)
        return tokens + positions if dropout is None else dropout(tokens + positions, training=training)

    def encode(self, token_ids, padding_mask, training=None):
        """The encoder stack: source token ids to the memory the decoder attends to."""
        x = self.embed_source(token_ids, training=training)
        for block in self.encoder_blocks:
            x = block(x, padding_mask=padding_mask, training=training)
        if self.encoder_final_norm is not None:
            x = self.encoder_final_norm(x)
        return x

    def cross_attention_cache(self, encoder_output) -> tuple:
        """Each decoder layer's cross-attention keys and values of the encoder
        output, `(keys, values)` per layer: computed once per sentence
        (recomputing them at every step would silently cost most of the
        decoding time)."""
        return tuple(block.cross_attention_cache(encoder_output) for block in self.decoder_blocks)

    def decode_step(
        self, token_ids, index, encoder_padding_mask, self_attention_cache, cross_attention_cache, step_logits=None
    ):
        """Decodes the tokens at position `index` with cached keys and values.

        Args:
            token_ids: `(rows, 1)` int tensor, the tokens at position `index`;
                `rows` is sentences, or in beam search sentences x beams (the
                beams of a sentence next to each other).
            index: scalar int, their position in the target sequence.
            encoder_padding_mask: `(sentences, source_length)`.
            self_attention_cache: as `empty_cache` makes it (and
                `expand_cache` for beams): the keys and values of the
                positions decoded so far; position `index`'s are written here.
            cross_attention_cache: `cross_attention_cache(encoder_output)`,
                one copy per sentence, which all its beams read.
            step_logits: how to turn the decoder states into logits;
                `logits` by default (a search may pass a faster way to the same logits).

        Returns:
            `(logits, self_attention_cache)`, logits `(rows, 1,
            vocabulary_size)`.
        """
        layer_caches, slot_owners = self_attention_cache["layers"], self_attention_cache["slot_owners"]
        # Values have `length * beams` slots for `length` positions.
        beams = ops.shape(layer_caches[0][1])[2] // ops.shape(slot_owners)[1]
        slot_owners = record_position(slot_owners, index, beams)
        visible = visible_slots(slot_owners, beams)
        x = self._embed(token_ids, self.decoder_token_embedding, None, index, None)  # no dropout in inference
        caches = []
        for block, self_cache, cross_cache in zip(self.decoder_blocks, layer_caches, cross_attention_cache):
            x, self_cache = block.decode_step(x, index, self_cache, cross_cache, encoder_padding_mask, visible)
            caches.append(self_cache)
        if self.decoder_final_norm is not None:
            x = self.decoder_final_norm(x)
        return (step_logits or self.logits)(x), {"slot_owners": slot_owners, "layers": tuple(caches)}

    def empty_cache(self, sentences, length) -> dict:
        """The self-attention cache of one hypothesis per sentence, for
        `length` positions, as `decode_step` takes it: each layer's keys and
        values (`cached_attention.empty_keys_values`), and which slot
        holds each decoded position (`layers.cached_attention`)."""
        head_dim = self.hidden_dim // self.num_heads
        layers = tuple(
            empty_keys_values(sentences, length, self.num_heads, head_dim, self.compute_dtype)
            for _ in range(self.num_decoder_layers)
        )
        return {"slot_owners": empty_slot_owners(sentences, length), "layers": layers}

    def expand_cache(self, cache: dict, beams: int) -> dict:
        """A cache of one hypothesis per sentence as one of `beams`
        hypotheses per sentence that share its history (beam search)."""
        layers, slot_owners = expand_to_beams(cache["layers"], cache["slot_owners"], beams)
        return {"slot_owners": slot_owners, "layers": layers}

    def reorder_cache(self, cache: dict, rows, length) -> dict:
        """`cache` with its hypotheses in the order of `rows` (beam search).
        Only the table of which slot holds each position moves; the keys and
        values stay where their beams wrote them."""
        return {"slot_owners": ops.take(cache["slot_owners"], rows, axis=0), "layers": cache["layers"]}

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_encoder_layers": self.num_encoder_layers,
                "num_decoder_layers": self.num_decoder_layers,
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "max_sequence_length": self.max_sequence_length,
                "normalize_first": self.normalize_first,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "activation": self.activation,
                "position_encoding_layout": self.position_encoding_layout,
                "pad_token_id": self.pad_token_id,
                "start_token_id": self.start_token_id,
                "end_token_id": self.end_token_id,
                "unk_token_id": self.unk_token_id,
                "use_logits_bias": self.use_logits_bias,
                "target_vocabulary_size": self.target_vocabulary_size,
            }
        )
        return config
