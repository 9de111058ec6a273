"""`alternatives`: other translations of a text, from its beam's n best.

LibreTranslate asks Argos Translate for `alternatives + 1` hypotheses
(CTranslate2's `num_hypotheses`); a text of several sentences gets, as its
i-th hypothesis, the i-th hypothesis of each sentence joined; the
alternatives are the hypotheses after the first, each once and none equal
to the translation. The same here, with the hypotheses of the server's beam
search: a server that decodes greedily has none to give, and says so.

A request that asks for alternatives has its sentences decoded by a search
that returns the beam's n best (`NBestEngine`), compiled for each batch shape
at the first such request: start-up compiles only the plain search, whose
translations stay as they were.

Example:
>>> variants([["Ein Hund.", "Der Hund."], ["Er rennt."]], 2, " ".join)
['Ein Hund. Er rennt.', 'Der Hund. Er rennt.']
"""

from collections.abc import Callable


class NBestEngine:
    """A `ModelEngine` for a `Batcher` whose sentences each come back as their
    beam's hypotheses (a list, best first)."""

    def __init__(self, engine):
        self.engine = engine
        self.num_hypotheses = engine.max_alternatives + 1

    def bucket_of(self, row: list[int]) -> int:
        return self.engine.bucket_of(row)

    def rows_per_batch(self, bucket: int) -> int:
        return self.engine.rows_per_batch(bucket)

    def translate_rows(self, rows: list[list[int]]) -> list[list[str]]:
        return self.engine.translate_rows(rows, self.num_hypotheses)


def variants(parts: list[list[str]], count: int, join: Callable[[list[str]], str]) -> list[str]:
    """The translation of a whole made of `parts`, each given as its hypotheses
    (best first), then up to `count` alternatives: the i-th joins each part's
    i-th hypothesis (its last where it has fewer); repeats left out."""
    translation = join([hypotheses[0] for hypotheses in parts])
    found = [translation]
    for rank in range(1, count + 1):
        whole = join([hypotheses[min(rank, len(hypotheses) - 1)] for hypotheses in parts])
        if whole not in found:
            found.append(whole)
    return found
