"""The input forms `Transformer.generate` takes, as KerasHub's `Seq2SeqLM` does.

- a string, or a list (array, tensor) of strings: the sources;
- `{"encoder_text": ..., "decoder_text": ...}`: sources and target prefixes,
  which the translations continue (CTranslate2's `target_prefix`, fairseq's
  prefix tokens); `decoder_text` may be left out;
- `{"encoder_token_ids", "encoder_padding_mask"}` arrays, optionally with a
  prompt `{"decoder_token_ids", "decoder_padding_mask"}`: the start token and
  a target prefix, as KerasHub's `generate_preprocess` packs them;
- a `tf.data.Dataset` of batches of any of these: the outputs of all batches,
  in order, come back together.

Example:
>>> batch = text_batch({"encoder_text": ["A dog runs."], "decoder_text": ["Ein"]})
>>> batch.sources, batch.prefixes, batch.single
(['A dog runs.'], ['Ein'], False)
>>> pack_prompts([[7, 8]], start_token_id=1, pad_token_id=0, bucket=4)["decoder_token_ids"].tolist()
[[1, 7, 8, 0]]
"""

from dataclasses import dataclass

import numpy as np
from keras import ops

from keras_transformer.generation.settings import LENGTH_BUCKET, bucketed
from keras_transformer.generation.translation import to_list
from keras_transformer.utils.text_libraries import tf

TEXT_KEYS = ("encoder_text", "decoder_text")
SOURCE_KEYS = ("encoder_token_ids", "encoder_padding_mask")
PROMPT_KEYS = ("decoder_token_ids", "decoder_padding_mask")
FORMS = (
    "a string, a list of strings, {'encoder_text': [...], 'decoder_text': [...]}, a dict of "
    "'encoder_token_ids' and 'encoder_padding_mask' arrays, or a tf.data.Dataset of batches of these"
)


@dataclass(frozen=True)
class TextBatch:
    """Texts to translate: the sources, their target prefixes (or `None`),
    and whether one string came in (one string then goes out)."""

    sources: list[str]
    prefixes: list[str] | None
    single: bool


def is_dataset(inputs) -> bool:
    return tf is not None and isinstance(inputs, tf.data.Dataset)


def text_batch(inputs) -> TextBatch | None:
    """`inputs` as texts; `None` for a dict of token ids.

    Raises:
        ValueError: a dict of neither form, or as many prefixes as sources.
        TypeError: something that is not text where text belongs.
    """
    if isinstance(inputs, dict):
        if all(key in inputs for key in SOURCE_KEYS):
            return None
        unknown = sorted(set(inputs) - set(TEXT_KEYS))
        if "encoder_text" not in inputs or unknown:
            raise ValueError(f"generate() takes {FORMS}; got a dict with keys {sorted(inputs)}.")
        sources, single = _texts(inputs["encoder_text"], "encoder_text")
        if "decoder_text" not in inputs:
            return TextBatch(sources, None, single)
        prefixes, _ = _texts(inputs["decoder_text"], "decoder_text")
        if len(prefixes) != len(sources):
            raise ValueError(
                f"generate() got {len(sources)} encoder_text and {len(prefixes)} decoder_text: give one "
                "target prefix per source (an empty string for none)."
            )
        return TextBatch(sources, prefixes, single)
    sources, single = _texts(inputs, "inputs")
    return TextBatch(sources, None, single)


def token_id_batch(inputs: dict) -> dict:
    """A dict of token ids as NumPy arrays: the source, and the prompt if it
    holds a target prefix, cut to the positions any row uses."""
    token_ids = {key: ops.convert_to_numpy(inputs[key]) for key in SOURCE_KEYS}
    if all(key in inputs for key in PROMPT_KEYS):
        mask = ops.convert_to_numpy(inputs["decoder_padding_mask"]).astype(bool)
        if mask[:, 1:].any():
            width = _used_width(mask)
            token_ids["decoder_token_ids"] = ops.convert_to_numpy(inputs["decoder_token_ids"])[:, :width]
            token_ids["decoder_padding_mask"] = mask[:, :width]
    return token_ids


def prompt_positions(token_ids: dict) -> int:
    """The positions the target prefixes take, start token included: up to
    the end of the longest, the prompt's padding left out; 0 without one."""
    if "decoder_padding_mask" not in token_ids:
        return 0
    return _used_width(token_ids["decoder_padding_mask"])


def _used_width(padding_mask: np.ndarray) -> int:
    """The columns up to the last one any row uses."""
    return int(np.flatnonzero(np.asarray(padding_mask).any(axis=0))[-1]) + 1


def target_token_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of target-side texts (Marian's tokenizer segments them with
    its target model, the shared-vocabulary tokenizer as any text)."""
    return [list(row) for row in to_list(tokenizer.tokenize_target(texts))]


def pack_prompts(rows: list[list[int]], start_token_id: int, pad_token_id: int, bucket: int = LENGTH_BUCKET) -> dict:
    """Target prefixes packed as a decoder prompt: the start token, the ids,
    padding; the width rounded up to a multiple of `bucket`, so that a
    compiled search sees few shapes."""
    width = bucketed(max((len(row) for row in rows), default=0) + 1, bucket)
    token_ids = np.full((len(rows), width), pad_token_id, "int32")
    padding_mask = np.zeros((len(rows), width), bool)
    for index, row in enumerate(rows):
        token_ids[index, : len(row) + 1] = [start_token_id, *row]
        padding_mask[index, : len(row) + 1] = True
    return {"decoder_token_ids": token_ids, "decoder_padding_mask": padding_mask}


def decoder_padded_to(outputs: dict, length: int, pad_token_id: int) -> dict:
    """Decoder token ids and padding mask padded to `length` positions (on
    their last axis), the other outputs as they are."""
    token_ids = outputs["decoder_token_ids"]
    extra = ((0, 0),) * (token_ids.ndim - 1) + ((0, length - token_ids.shape[-1]),)
    return {
        **outputs,
        "decoder_token_ids": np.pad(outputs["decoder_token_ids"], extra, constant_values=pad_token_id),
        "decoder_padding_mask": np.pad(outputs["decoder_padding_mask"], extra, constant_values=False),
    }


def strip_prefixes(outputs: dict, prompt_mask: np.ndarray, pad_token_id: int) -> dict:
    """Search outputs without their target prefixes: the start token, then
    what the search added (KerasHub's `strip_prompt`)."""
    token_ids, padding_mask = outputs["decoder_token_ids"], outputs["decoder_padding_mask"]
    stripped = {
        "decoder_token_ids": np.full_like(token_ids, pad_token_id),
        "decoder_padding_mask": np.zeros_like(padding_mask),
    }
    for row, prefix_length in enumerate(prompt_mask[:, 1:].sum(axis=1)):
        kept = np.r_[0, 1 + prefix_length : token_ids.shape[1]]
        stripped["decoder_token_ids"][row, : len(kept)] = token_ids[row, kept]
        stripped["decoder_padding_mask"][row, : len(kept)] = padding_mask[row, kept]
    return stripped


def concatenate(results: list, pad_token_id: int):
    """The outputs of several batches as one: a list of strings, or a dict of
    arrays as wide as the widest batch's."""
    if not results or not isinstance(results[0], dict):
        return [text for result in results for text in (result if isinstance(result, list) else [result])]
    width = max(result["decoder_token_ids"].shape[1] for result in results)
    results = [decoder_padded_to(result, width, pad_token_id) for result in results]
    return {key: np.concatenate([result[key] for result in results]) for key in PROMPT_KEYS}


def _texts(value, name: str) -> tuple[list[str], bool]:
    """`value` as a list of str (bytes decoded as UTF-8), and whether it was one string."""
    if tf is not None and isinstance(value, tf.Tensor):
        value = value.numpy()
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (str, bytes)):
        return [_text(value, name, 0)], True
    if isinstance(value, dict) or not hasattr(value, "__iter__"):
        raise TypeError(f"generate() takes {FORMS}; got {type(value).__name__} for {name}.")
    return [_text(item, name, index) for index, item in enumerate(value)], False


def _text(item, name: str, index: int) -> str:
    if isinstance(item, bytes):
        try:
            return item.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"generate() {name} item {index} is not valid UTF-8 ({error.reason}).") from None
    if not isinstance(item, str):
        raise TypeError(
            f"generate() {name} item {index} must be a string; got {type(item).__name__}. generate() takes {FORMS}."
        )
    return str(item)
