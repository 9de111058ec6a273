"""What an `EinsumDense` equation contracts, for the paths that multiply its operands as one matrix product."""

import re


def contracted_axes(subscripts: str) -> int:
    """k if `subscripts` contracts the first operand's last k axes with the
    second's first k (a tensordot, e.g. `"abc,cde->abde"`: 1), else 0.

    Example:
    >>> contracted_axes("abcd,cde->abe"), contracted_axes("aecd,abcd->acbe")
    (2, 0)
    """
    match = re.fullmatch(r"(\w+),(\w+)->(\w+)", subscripts.replace(" ", ""))
    if not match:
        return 0
    first, second, output = match.groups()
    for k in range(1, min(len(first), len(second)) + 1):
        distinct = len(set(first + second)) == len(first + second) - k
        if distinct and first[-k:] == second[:k] and output == first[:-k] + second[k:]:
            return k
    return 0
