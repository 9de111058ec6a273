"""What `Transformer` decodes with: `generate`, `translate` and their compiled searches."""

from functools import partial

import numpy as np

from keras_transformer.generation.batches import (
    concatenate,
    decoder_padded_to,
    is_dataset,
    pack_prompts,
    prompt_positions,
    strip_prefixes,
    target_token_ids,
    text_batch,
    token_id_batch,
)
from keras_transformer.generation.decoding import resolve_jit_compile
from keras_transformer.generation.search_runner import SearchRunner
from keras_transformer.generation.settings import SearchSettings, beam_size_of
from keras_transformer.generation.translation import join_segments, source_segments, to_list, tokenize, translate_texts
from keras_transformer.models.search_cache import SearchCache, SearchMode
from keras_transformer.models.transformer_backbone import TransformerBackbone

# Sentences end long before section 6.1's source + 50 limit (Multi30k: 13 to
# 36 tokens), and every search step reads the whole output buffer. So
# `generate` first searches with a buffer this much longer than the padded
# source, and searches again with the full buffer only if a sentence was not
# finished within it.
FIRST_BUFFER_EXTRA = 16


class TransformerGeneration:
    """`Transformer`'s decoding: `generate` and `translate` (section 6.1's
    beam search or greedy search), KerasHub's `generate_step`, and the
    compiled searches, one per search configuration."""

    def _search_runner(self) -> SearchRunner:
        """The searches of the current `SearchMode`, made at first use."""
        mode = self._search_mode()
        runners = self._search_cache.runners
        if mode not in runners:
            runners[mode] = SearchRunner(self, mode.jit_compile, mode.eagerly)
        return runners[mode]

    def _search_mode(self) -> SearchMode:
        """How searches run now: `compile(jit_compile=...)` resolved (XLA on
        TensorFlow unless it said otherwise, whatever training chose for a
        bfloat16 model) and `run_eagerly`, which may change between calls."""
        return SearchMode(bool(self.run_eagerly), resolve_jit_compile(self._search_cache.jit_compile))

    @property
    def compiled_searches(self) -> dict:
        """The searches compiled so far for the current `run_eagerly` and
        `jit_compile`, by `(SearchSettings, with_completion)`, and
        `(SearchSettings, with_completion, num_hypotheses)` for n-best ones."""
        return dict(self._search_runner().functions)

    def forget_compiled_searches(self) -> None:
        """Drops the compiled searches: the next `generate` traces its search
        anew, e.g. after the layers' code changed."""
        self._search_cache = SearchCache(self._search_cache.jit_compile)

    @property
    def default_search(self) -> SearchSettings:
        """The search of `generate` and `translate` when none is given:
        section 6.1's, with `compile(sampler=...)`'s beam size."""
        return SearchSettings(beam_size=beam_size_of(self.sampler))

    def _search_settings(self, search, beam_size, alpha, max_extra_length) -> SearchSettings:
        """`search` (by default `default_search`) with the fields given as arguments."""
        return (search or self.default_search).overridden(
            beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length
        )

    def make_generate_function(self):
        """The compiled search of `compile(sampler=...)` (KerasHub's API):
        `{"encoder_token_ids", "encoder_padding_mask", "decoder_token_ids"}`
        arrays in (with a `decoder_padding_mask`, the decoder ids are a
        prompt the search continues, as `generate_preprocess` packs it),
        `{"decoder_token_ids", "decoder_padding_mask"}` out."""
        self.generate_function = self._search_runner().function(self.default_search)
        return self.generate_function

    def generate_step(self, inputs: dict, stop_token_ids=None) -> dict:
        """One batch through the search of `compile(sampler=...)` (KerasHub's
        API); the search always stops at the backbone's end token."""
        _check_stop_token_ids(self.backbone, stop_token_ids)
        return self.make_generate_function()(inputs)

    def generate(
        self,
        inputs,
        max_length: int | None = None,
        stop_token_ids="auto",
        strip_prompt: bool = False,
        *,
        search: SearchSettings | None = None,
        beam_size: int | None | str = "auto",
        alpha: float | None = None,
        max_extra_length: int | None = None,
        target_language: str | None = None,
        split_sentences: bool = True,
        source_language: str | None = None,
        num_hypotheses: int = 1,
    ):
        """Translates one batch.

        Args:
            inputs: a string or list of strings (with a preprocessor);
                KerasHub's `{"encoder_text": [...], "decoder_text": [...]}`,
                whose decoder text is a forced target prefix (the
                translation continues it, as CTranslate2's `target_prefix`);
                a dict of `encoder_token_ids` and `encoder_padding_mask`
                arrays, optionally with a prompt (`decoder_token_ids` and
                `decoder_padding_mask`: the start token and a prefix); or a
                `tf.data.Dataset` of batches of these, whose outputs come
                back together. See `keras_transformer.generation.batches`.
            max_length: the output buffer, start token included; by default
                the padded source length + `max_extra_length`, so that no
                sentence is cut short of section 6.1's limit (searched first
                with a shorter buffer, and again only if a sentence did not
                finish within it: the same translations, faster).
            stop_token_ids: KerasHub's argument; `"auto"`, `None` or the
                backbone's end token (the search stops there and only there).
            strip_prompt: KerasHub's argument: leave the target prefix out
                of the outputs.
            search: the `SearchSettings` (beam size, length penalty, output
                limit); by default `default_search`, section 6.1's beam
                search with `compile(sampler=...)`'s beam size.
            beam_size: beams per sentence, or `None` for greedy search,
                instead of `search`'s; `"auto"` keeps `search`'s.
            alpha: the length penalty exponent instead of `search`'s.
            max_extra_length: at most source length + this many tokens,
                instead of `search`'s.
            target_language: for a multilingual Opus-MT model, the language
                to translate into (`"deu"`), whose token (`>>deu<<`) is put
                before each text without one; by default the tokenizer's own
                `target_language`. See `translate`.
            split_sentences, source_language: as in `translate`: texts
                without a target prefix are translated sentence by sentence
                (all in this one batch) and joined back with their spacing.
            num_hypotheses: with beam search, the n best translations of
                each sentence, best first (CTranslate2's `num_hypotheses`),
                at most the beam size; a text of several sentences gets as
                its i-th the i-th of each sentence (its best where it has fewer).

        Returns:
            Strings (with a preprocessor; one string for one string in), or
            `{"decoder_token_ids", "decoder_padding_mask"}` arrays. With
            `num_hypotheses` > 1, a list of translations in place of each
            string (those the search finished: one at least), or arrays
            `(batch, n, length)` and `hypothesis_found` `(batch, n)`.
        """
        _check_stop_token_ids(self.backbone, stop_token_ids)
        settings = self._search_settings(search, beam_size, alpha, max_extra_length)
        if is_dataset(inputs):
            options = dict(
                target_language=target_language, split_sentences=split_sentences, source_language=source_language
            )
            results = [
                self.generate(batch, max_length, stop_token_ids, strip_prompt, search=settings, **options)
                for batch in inputs.as_numpy_iterator()
            ]
            return concatenate(results, self.backbone.pad_token_id)
        texts = text_batch(inputs)
        segments = None  # a text's sentences, when it is split into them
        if texts is None:
            token_ids = token_id_batch(inputs)
        elif texts.prefixes is None and split_sentences and self.preprocessor is not None:
            segments = source_segments(
                self, texts.sources, target_language=target_language, source_language=source_language
            )
            if not segments:  # only empty texts
                return "" if texts.single else [""] * len(texts.sources)
            token_ids = self.preprocessor.pack_sources([segment.token_ids for segment in segments])
        else:
            if self.preprocessor is None:
                raise ValueError(
                    "This model has no preprocessor, so generate() needs token ids: "
                    "a dict with 'encoder_token_ids' and 'encoder_padding_mask'."
                )
            tokenizer = self.preprocessor.tokenizer
            sources = tokenizer.with_target_language(texts.sources, target_language)
            token_ids = self.preprocessor.pack_sources(tokenize(tokenizer, sources))
            if texts.prefixes is not None:
                backbone = self.backbone
                prefixes = target_token_ids(tokenizer, texts.prefixes)
                token_ids.update(pack_prompts(prefixes, backbone.start_token_id, backbone.pad_token_id))
        run_search = partial(self._search, token_ids, settings, num_hypotheses=num_hypotheses)
        # The buffer holds the longer of the source and the target prompt (both
        # padded to few widths, so that few searches are compiled), and more.
        prompt_length = token_ids["decoder_token_ids"].shape[1] if "decoder_token_ids" in token_ids else 0
        source_length = max(token_ids["encoder_token_ids"].shape[1], prompt_length)
        outputs = None
        if max_length is None:
            first_buffer, max_length = _default_buffers(source_length, prompt_length, settings)
            if first_buffer is not None:
                outputs = run_search(first_buffer, with_completion=True)
                if outputs.pop("complete").all():
                    outputs = decoder_padded_to(outputs, max_length, self.backbone.pad_token_id)
                else:
                    outputs = None
        elif max_length <= (prefix_positions := prompt_positions(token_ids)):
            raise ValueError(
                f"max_length={max_length} leaves no room after the target prefix ({prefix_positions} positions, "
                "start token included); raise it or leave it out."
            )
        if outputs is None:
            outputs = run_search(max_length)
        found = outputs.pop("hypothesis_found", None)
        if found is not None:  # n-best: one row per hypothesis, a sentence's next to each other
            outputs = {key: value.reshape(-1, value.shape[-1]) for key, value in outputs.items()}
        if strip_prompt and prompt_length:
            prompt_mask = np.repeat(token_ids["decoder_padding_mask"], num_hypotheses, axis=0)
            outputs = strip_prefixes(outputs, prompt_mask, self.backbone.pad_token_id)
        if self.preprocessor is None:
            if found is None:
                return outputs
            batch = len(found)
            return {key: value.reshape(batch, num_hypotheses, -1) for key, value in outputs.items()} | {
                "hypothesis_found": found
            }
        translations = self.preprocessor.generate_postprocess(outputs)
        translations = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in to_list(translations)]
        if found is not None:
            translations = [
                [text for text, kept in zip(translations[row * num_hypotheses :], finished) if kept]
                for row, finished in enumerate(found)
            ]
        if segments is not None and found is not None:
            per_rank = [
                join_segments(len(texts.sources), segments, [best[min(rank, len(best) - 1)] for best in translations])
                for rank in range(num_hypotheses)
            ]
            translations = [list(ranked) for ranked in zip(*per_rank)]
        elif segments is not None:
            translations = join_segments(len(texts.sources), segments, translations)
        return translations[0] if texts is not None and texts.single else translations

    def _search(
        self,
        token_ids: dict,
        settings: SearchSettings,
        buffer_length: int,
        with_completion: bool = False,
        num_hypotheses: int = 1,
    ) -> dict:
        """One search of a batch with an output buffer of `buffer_length`."""
        inputs = {
            **token_ids,
            "decoder_token_ids": np.zeros((len(token_ids["encoder_token_ids"]), buffer_length), "int32"),
        }
        if "decoder_padding_mask" in token_ids:  # a target prefix, which the search continues
            # A buffer narrower than the padded prompt leaves out only padding (generate checks it).
            prompt = {key: token_ids[key][:, :buffer_length] for key in ("decoder_token_ids", "decoder_padding_mask")}
            inputs.update(decoder_padded_to(prompt, buffer_length, self.backbone.pad_token_id))
        return self._search_runner().run(inputs, settings, with_completion, num_hypotheses)

    def compile_searches(self, token_ids: dict, search: SearchSettings | None = None, num_hypotheses: int = 1) -> None:
        """Compiles, by running them once, the searches `generate(token_ids,
        search=search)` may run for a batch of this shape: the one with the
        short first buffer and the one with the full buffer. A server calls
        this for each shape it decodes before it takes requests.

        Args:
            token_ids: `{"encoder_token_ids", "encoder_padding_mask"}` arrays
                of the batch size and source width to compile for.
            search: the `SearchSettings` (by default `default_search`).
            num_hypotheses: see `generate`.
        """
        settings = search or self.default_search
        first_buffer, full_buffer = _default_buffers(token_ids["encoder_token_ids"].shape[1], 0, settings)
        if first_buffer is not None:
            self._search(token_ids, settings, first_buffer, with_completion=True, num_hypotheses=num_hypotheses)
        self._search(token_ids, settings, full_buffer, num_hypotheses=num_hypotheses)

    def translate(
        self,
        texts,
        *,
        search: SearchSettings | None = None,
        beam_size: int | None | str = "auto",
        alpha: float | None = None,
        max_extra_length: int | None = None,
        batch_size: int = 32,
        too_long: str = "split",
        verbose: int | str = "auto",
        target_language: str | None = None,
        split_sentences: bool = True,
        source_language: str | None = None,
    ) -> list[str] | str:
        """Translates texts, sentence by sentence, in batches of similar length.

        Inputs are checked before anything runs; a bad item is named by its
        index. A text with no tokens translates to `""` without running the
        model; `bytes` are decoded as UTF-8. Each text's sentences (see
        `generation.sentences`) are translated each on its own, in the same
        batches as all others, and joined back with the whitespace between
        them (`"A. B.\\n\\nC."`: three joined by `" "` and `"\\n\\n"`).

        The longest source the model takes is `min(backbone.max_sequence_length,
        preprocessor.encoder_sequence_length) - 2` tokens (`<s>` and `</s>`
        take two). A longer input follows `too_long`, never silently:

        - `"split"` (default): cut it into sentences (also with
          `split_sentences=False`), a sentence that is still too long into
          pieces of at most that many tokens (at word starts where possible),
          translate the parts and join them (pieces of a sentence with
          spaces);
        - `"truncate"`: keep its first tokens, with a warning that counts the
          inputs cut;
        - `"error"`: raise a `ValueError` naming the first such input.

        At most `batch_size` sentences are decoded at a time: memory stays bounded.

        Args:
            texts: a string, or a list (any iterable) of strings.
            search, beam_size, alpha, max_extra_length: see `generate`.
            batch_size: sentences decoded together (beams multiply this).
            too_long: `"split"`, `"truncate"` or `"error"`, see above.
            verbose: `"auto"` shows a `keras.utils.Progbar` when there are more
                than a few batches, 1 always, 0 never.
            target_language: for a multilingual Opus-MT model (its
                vocabulary has tokens such as `>>deu<<`), the language to
                translate into, e.g. `"deu"`; by default the tokenizer's
                `target_language` (`big_en_de` fixes German). A text that
                starts with its own token (`">>nld<< ..."`) keeps it, and is
                tokenized as `transformers`' `MarianTokenizer` does; each
                sentence of it gets that token.
            split_sentences: each sentence on its own (default), or each text whole.
            source_language: the ISO 639-1 code of the texts' language
                (`"en"`), whose abbreviations ("Dr.", "z. B.") end no
                sentence; by default generic rules.

        Returns:
            The translations, in the order of `texts` (a string for a string).

        Raises:
            TypeError: `texts` or one of its items is not a string (or bytes).
            ValueError: an item is not valid UTF-8, or is too long with
                `too_long="error"`; a multilingual model got no language or
                an unknown one (the message lists its languages); a model of
                one target language got a language.
        """
        return translate_texts(
            self,
            texts,
            search=self._search_settings(search, beam_size, alpha, max_extra_length),
            batch_size=batch_size,
            too_long=too_long,
            verbose=verbose,
            target_language=target_language,
            split_sentences=split_sentences,
            source_language=source_language,
        )

    @property
    def max_source_tokens(self) -> int:
        """The longest source `translate` takes whole, in tokens (<s> </s> left
        out; Marian's sources have no <s>)."""
        limit = self.backbone.max_sequence_length
        if self.preprocessor is not None and self.preprocessor.encoder_sequence_length:
            limit = min(limit, self.preprocessor.encoder_sequence_length)
        return limit - (2 if self.preprocessor is None or self.preprocessor.source_start_token else 1)


def _default_buffers(source_length: int, prompt_length: int, settings: SearchSettings) -> tuple[int | None, int]:
    """The output buffers `generate` searches with when given no `max_length`:
    the short first one (`None` where it would be no shorter) and the full one."""
    full = max(source_length + settings.max_extra_length, prompt_length + 1)
    first = source_length + FIRST_BUFFER_EXTRA
    return (first if first < full else None), full


def _check_stop_token_ids(backbone: TransformerBackbone, stop_token_ids) -> None:
    if stop_token_ids in ("auto", None):
        return
    if isinstance(stop_token_ids, (list, tuple)) and list(stop_token_ids) == [backbone.end_token_id]:
        return
    raise ValueError(
        f"The search stops at the end token ({backbone.end_token_id}) and only there; got "
        f"stop_token_ids={stop_token_ids!r}. Pass 'auto'."
    )
