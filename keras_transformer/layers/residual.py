"""The residual connection around every sublayer (sections 3.1 and 5.4)."""

from collections.abc import Callable


def residual_sublayer(x, sublayer: Callable, norm: Callable, normalize_first: bool):
    """Post-LN `LayerNorm(x + Sublayer(x))` (section 3.1, the paper's), or
    Pre-LN `x + Sublayer(LayerNorm(x))`.

    `sublayer` includes its residual dropout (section 5.4: "applied to the
    output of each sub-layer, before it is added to the sub-layer input").

    Example:
    >>> residual_sublayer(3.0, sublayer=lambda h: 2 * h, norm=lambda h: h / 9, normalize_first=False)
    1.0
    >>> residual_sublayer(3.0, sublayer=lambda h: 2 * h, norm=lambda h: h / 9, normalize_first=True)
    3.6666666666666665
    """
    if normalize_first:
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))
