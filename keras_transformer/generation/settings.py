"""How translations are searched: section 6.1's settings, each default written once.

`SearchSettings()` is the paper's beam search; `generate`, `translate`,
`keras_transformer.evaluation.bleu.evaluate_model`, the SavedModel
export and the command line take their defaults from it. `LENGTH_BUCKET` is
the width step of the batches a search is compiled for.
"""

import dataclasses

# Sources and target prompts are padded to a multiple of this many positions,
# so that compiled searches see few shapes (`translate`, the SavedModel, the server).
LENGTH_BUCKET = 16


def bucketed(length: int, bucket: int = LENGTH_BUCKET) -> int:
    """`length` rounded up to a multiple of `bucket`.

    Example:
    >>> bucketed(17), bucketed(16), bucketed(3, bucket=4)
    (32, 16, 4)
    """
    return -(-length // bucket) * bucket


@dataclasses.dataclass(frozen=True)
class SearchSettings:
    """Beam size, length penalty and output limit of a search (section 6.1).

    "We used beam search with a beam size of 4 and length penalty alpha = 0.6
    [...]. We set the maximum output length during inference to input length
    + 50, but terminate early when possible."

    Attributes:
        beam_size: beams per sentence; `None` for greedy search (beam 1 finds
            the same translations, more slowly).
        alpha: the exponent of the length penalty lp(Y) = ((5 + |Y|) / 6)^alpha
            of beam scores (0 for none; greedy search has no use for it).
        max_extra_length: each translation gets at most its source length
            plus this many tokens.

    Example:
    >>> SearchSettings()
    SearchSettings(beam_size=4, alpha=0.6, max_extra_length=50)
    >>> SearchSettings().overridden(beam_size=None, max_extra_length=20)
    SearchSettings(beam_size=None, alpha=0.6, max_extra_length=20)
    """

    beam_size: int | None = 4
    alpha: float = 0.6
    max_extra_length: int = 50

    def __post_init__(self):
        if self.beam_size is not None and (not isinstance(self.beam_size, int) or self.beam_size < 1):
            raise ValueError(f"beam_size must be a positive integer or None; got {self.beam_size!r}.")
        # The early stop compares finished scores with the best a live beam can
        # still reach, log P / lp(max length); that bound needs lp to grow with
        # length, i.e. alpha >= 0.
        if not self.alpha >= 0:
            raise ValueError(f"alpha (the length penalty exponent) must be >= 0; got {self.alpha!r}.")
        if not isinstance(self.max_extra_length, int) or self.max_extra_length < 0:
            raise ValueError(f"max_extra_length must be an integer >= 0; got {self.max_extra_length!r}.")
        # One float, so that equal settings are equal keys of compiled searches.
        object.__setattr__(self, "alpha", float(self.alpha))

    def overridden(
        self,
        *,
        beam_size: int | None | str = "auto",
        alpha: float | None = None,
        max_extra_length: int | None = None,
    ) -> "SearchSettings":
        """These settings with the fields given changed; `"auto"` (beam size) or `None` (the others) keeps one."""
        given = {"alpha": alpha, "max_extra_length": max_extra_length}
        changes = {name: value for name, value in given.items() if value is not None}
        if beam_size != "auto":
            changes["beam_size"] = beam_size
        return dataclasses.replace(self, **changes)


def beam_size_of(sampler) -> int | None:
    """The beam size a `compile(sampler=...)` value stands for.

    Example:
    >>> beam_size_of("beam"), beam_size_of("greedy")
    (4, None)
    """
    import keras_hub

    if sampler == "beam":
        return SearchSettings.beam_size
    if sampler == "greedy" or isinstance(sampler, keras_hub.samplers.GreedySampler):
        return None
    if isinstance(sampler, keras_hub.samplers.BeamSampler):
        return sampler.num_beams
    raise ValueError(
        f"Transformer decodes with greedy or beam search (section 6.1); sampler {sampler!r} "
        "is not one of them. Use sampler='beam' (the paper's), 'greedy', "
        "keras_hub.samplers.GreedySampler() or keras_hub.samplers.BeamSampler(num_beams=k)."
    )
