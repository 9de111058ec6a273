"""Translating any number of texts of any length, in batches of similar length.

`translate_texts` is what `Transformer.translate` runs: it checks every
input, splits each text into its sentences (`source_segments`; the server
splits its requests' texts there too), cuts sentences longer than the model
takes at word starts or truncates or refuses them as asked, sorts the pieces
by length, decodes them `batch_size` at a time with the model's `generate`
(every batch of a call the same size, so that they share compiled searches),
and joins the translations back into texts, with each text's own spacing
between its sentences (`join_segments`), in the order given. A multilingual
model's target-language token (`>>deu<<`) starts every piece of a text.
"""

import warnings
from typing import NamedTuple

import keras

from keras_transformer.generation import sentences
from keras_transformer.generation.settings import SearchSettings
from keras_transformer.utils.language_tags import split_language_tag

TOO_LONG_POLICIES = ("split", "truncate", "error")
PROGRESS_MIN_BATCHES = 3  # a progress bar beyond this many batches
WORD_START = "\u2581"  # SentencePiece's "▁", which begins a piece that begins a word


def translate_texts(
    model,
    texts,
    *,
    search: SearchSettings,
    batch_size: int,
    too_long: str,
    verbose: int | str,
    target_language: str | None = None,
    split_sentences: bool = True,
    source_language: str | None = None,
) -> list[str] | str:
    """See `Transformer.translate`; `model` is a `Transformer`."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size}.")
    if model.preprocessor is None:
        raise ValueError("translate() needs a model with a preprocessor; use generate() with token ids.")
    single = isinstance(texts, (str, bytes))
    texts = check_texts([texts] if single else texts)
    segments = source_segments(
        model,
        texts,
        too_long=too_long,
        target_language=target_language,
        split_sentences=split_sentences,
        source_language=source_language,
    )

    order = sorted(range(len(segments)), key=lambda s: len(segments[s].token_ids))
    num_batches = -(-len(segments) // batch_size)
    if verbose == "auto":
        verbose = int(num_batches > PROGRESS_MIN_BATCHES)
    progress = keras.utils.Progbar(len(segments), verbose=verbose, unit_name="sentence")
    outputs = [""] * len(segments)
    for start in range(0, len(segments), batch_size):
        batch = order[start : start + batch_size]
        sources = [segments[s].token_ids for s in batch]
        if start > 0:
            # The last batch, when partial, is filled up with copies of its
            # longest source: a batch size of its own would compile a new
            # search (seconds), which costs more than decoding the copies.
            sources += sources[-1:] * (batch_size - len(sources))
        translations = model.generate(model.preprocessor.pack_sources(sources), search=search)
        for s, text in zip(batch, translations):
            outputs[s] = text
        progress.add(len(batch))

    results = join_segments(len(texts), segments, outputs)
    return results[0] if single else results


class Segment(NamedTuple):
    """One row to decode: a sentence (or a piece of one) of `texts[text_index]`."""

    text_index: int
    token_ids: list[int]
    spacing: str = ""  # what the text has between it and the next segment


def source_segments(
    model,
    texts: list[str],
    *,
    too_long: str = "split",
    target_language: str | None = None,
    max_tokens: int | None = None,
    split_sentences: bool = True,
    source_language: str | None = None,
) -> list[Segment]:
    """Each of `texts` (checked strings) as the `Segment`s to decode: its
    sentences (`split_sentences`, in `source_language`), or the whole text,
    each of at most `max_tokens` tokens (by default the most the model takes)
    as `too_long` says; an empty text has none. A multilingual model's
    language token starts each one."""
    if too_long not in TOO_LONG_POLICIES:
        raise ValueError(f"too_long must be one of {TOO_LONG_POLICIES}; got {too_long!r}.")
    max_tokens = model.max_source_tokens if max_tokens is None else min(max_tokens, model.max_source_tokens)
    if max_tokens < 1:
        raise ValueError(
            f"This model takes sources of at most {max_tokens} tokens: raise the "
            "preprocessor's encoder_sequence_length or the backbone's max_sequence_length."
        )
    tokenizer = model.preprocessor.tokenizer
    multilingual = bool(tokenizer.language_tag_ids())  # else ">>" starts no language token, but a quote
    sources = []  # (text index, source, spacing after it)
    for index, text in enumerate(tokenizer.with_target_language(texts, target_language)):
        tag, body = split_language_tag(text) if multilingual else (None, text)
        if split_sentences:
            parts = sentences.split_sentences(body, source_language)
        else:
            parts = [(body.strip(), "")] if body.strip() else []
        # A text's language token starts each of its sentences.
        sources.extend((index, f"{tag} {part}" if tag else part, space) for part, space in parts)
    token_ids = tokenize(tokenizer, [source for _, source, _ in sources]) if sources else []
    return _fitted(tokenizer, sources, token_ids, max_tokens, too_long, source_language)


def join_segments(num_texts: int, segments: list[Segment], translations: list[str]) -> list[str]:
    """The translation of each text: its segments' translations, in order,
    joined by the spacing the text had between them."""
    parts = [([], []) for _ in range(num_texts)]
    for segment, text in zip(segments, translations):
        parts[segment.text_index][0].append(text)
        parts[segment.text_index][1].append(segment.spacing)
    return [sentences.join_sentences(*text_parts) for text_parts in parts]


def _fitted(tokenizer, sources, token_ids, max_tokens, too_long, source_language) -> list[Segment]:
    """`Segment`s of `sources` (`(text index, source, spacing)`) and their
    `token_ids`, each of at most `max_tokens` tokens as `too_long` says."""
    too_long_inputs = sorted({sources[s][0] for s, ids in enumerate(token_ids) if len(ids) > max_tokens})
    if too_long_inputs and too_long == "error":
        first = too_long_inputs[0]
        longest = max(len(ids) for (index, _, _), ids in zip(sources, token_ids) if index == first)
        raise ValueError(
            f"texts[{first}] has {longest} tokens, more than the {max_tokens} this "
            f"model takes ({len(too_long_inputs)} input(s) are too long); pass "
            "too_long='split' or too_long='truncate'."
        )
    if too_long_inputs and too_long == "truncate":
        warnings.warn(
            f"{len(too_long_inputs)} input(s) longer than {max_tokens} tokens were truncated to "
            f"{max_tokens} tokens (texts[{too_long_inputs[0]}] first); too_long='split' "
            "translates them whole.",
            stacklevel=5,
        )
    tags = set(tokenizer.language_tag_ids())
    segments = []
    for (index, source, spacing), ids in zip(sources, token_ids):
        tag = ids[:1] if ids and ids[0] in tags else []
        body, space = ids[len(tag) :], max_tokens - len(tag)
        if not body:  # a language token alone is no text
            continue
        if len(body) <= space:
            pieces = [(body, spacing)]
        elif too_long == "truncate":
            pieces = [(body[:space], spacing)]
        else:
            text = split_language_tag(source)[1] if tag else source
            pieces = split_for_translation(tokenizer, text, space, source_language)
            pieces[-1] = (pieces[-1][0], spacing)
        segments.extend(Segment(index, tag + ids, piece_spacing) for ids, piece_spacing in pieces)
    return segments


def tokenize(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, as Python lists."""
    return [list(row) for row in to_list(tokenizer(texts))]


def split_for_translation(
    tokenizer, text: str, max_tokens: int, source_language: str | None = None
) -> list[tuple[list[int], str]]:
    """Token ids of the sentences of `text`, too long ones cut to `max_tokens`
    at word starts (without the language token a tokenizer may add to each),
    each with the spacing after it: the text's between sentences, a space
    between the pieces of one."""
    vocabulary = None
    pieces = []
    tags = set(tokenizer.language_tag_ids())
    text_sentences = sentences.split_sentences(text, source_language)
    token_ids = tokenize(tokenizer, [sentence for sentence, _ in text_sentences]) if text_sentences else []
    for ids, (_, spacing) in zip(token_ids, text_sentences):
        ids = ids[1:] if ids and ids[0] in tags else ids
        while len(ids) > max_tokens:
            vocabulary = vocabulary or tokenizer.get_vocabulary()
            cut = word_start_before(ids, max_tokens, vocabulary)
            pieces.append((ids[:cut], " "))
            ids = ids[cut:]
        if ids:
            pieces.append((ids, spacing))
    return pieces


def word_start_before(ids: list[int], max_tokens: int, vocabulary: list[str]) -> int:
    """Where to cut `ids` into at most `max_tokens` tokens: the last word start in
    the second half of the window, or `max_tokens` if there is none. Cutting a
    word's subwords apart would garble that word."""
    for cut in range(max_tokens, max_tokens // 2, -1):
        if vocabulary[ids[cut]].startswith(WORD_START):
            return cut
    return max_tokens


def check_texts(texts) -> list[str]:
    """`texts` as a list of str: bytes decoded, anything else named by index."""
    if texts is None or isinstance(texts, dict) or not hasattr(texts, "__iter__"):
        raise TypeError(
            f"translate() argument 'texts' must be a string or a list of strings; got {type(texts).__name__}."
        )
    checked = []
    for index, text in enumerate(texts):
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"translate() argument 'texts' item {index} is not valid UTF-8 "
                    f"({error.reason} at byte {error.start})."
                ) from None
        if not isinstance(text, str):
            raise TypeError(f"translate() argument 'texts' item {index} must be a string; got {type(text).__name__}.")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            # Lone surrogates, e.g. from a file read with errors="surrogateescape".
            raise ValueError(
                f"translate() argument 'texts' item {index} cannot be encoded as UTF-8 "
                f"({error.reason} at character {error.start})."
            ) from None
        checked.append(str(text))
    return checked


def to_list(x) -> list:
    """A tensor, ragged tensor or array as nested Python lists."""
    if hasattr(x, "to_list"):
        return x.to_list()
    if hasattr(x, "numpy"):
        x = x.numpy()
    if hasattr(x, "tolist"):
        return x.tolist()
    return list(x)
