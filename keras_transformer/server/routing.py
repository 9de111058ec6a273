"""Which loaded model translates from one language into another.

A `ServedModel` is one model with the language pairs it serves: a bilingual
model one pair (`multi30k_en_de`: en -> de), a multilingual Opus-MT model
every pair of its sources and its `>>xxx<<` targets (gmw-gmw: en, de, nl, ...
into each other; en-ROMANCE: en into fr, es, it, ...). The `Router` answers
LibreTranslate's `/languages` and picks the model of each `(source, target)`;
the first model given wins a pair two models serve.

Example:
>>> router = Router([ServedModel("en-de", None, sources=("en",), targets=("de",))])
>>> router.route("en", "de").model.name, router.route("eng", "deu").source
('en-de', 'en')
>>> router.languages()
[{'code': 'en', 'name': 'English', 'targets': ['de']}, {'code': 'de', 'name': 'German', 'targets': []}]
"""

from dataclasses import dataclass, field

from keras_transformer.server.languages import code, language_name, pair_from_name, source_from_name, tokens_by_code


class RoutingError(ValueError):
    """A language or pair the server does not translate; the message says what it does."""


@dataclass(eq=False)
class ServedModel:
    """One model and the languages it serves.

    Args:
        name: the model's name in logs and metrics.
        engine: its `ModelEngine` (or `None` where only routing is asked).
        sources, targets: LibreTranslate codes; every source translates into every target but itself.
        target_languages: for a multilingual model, the `>>xxx<<` language of each
            target code (none where the model fixes its language, as `big_en_de` does).
        token_languages: the languages of all the model's `>>xxx<<` tokens;
            a text that carries one is refused, as it would choose its own language.
        batcher: its `Batcher`, set by the server.
    """

    name: str
    engine: object
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    target_languages: dict = field(default_factory=dict)
    token_languages: frozenset = frozenset()
    batcher: object = None

    def pairs(self) -> list[tuple[str, str]]:
        return [(s, t) for s in self.sources for t in self.targets if s != t]


@dataclass(frozen=True)
class Route:
    """A request's model, its source code, and the target token language to give it (or `None`)."""

    model: ServedModel
    source: str
    target: str
    target_language: str | None


def served_model(name: str, engine, languages: tuple[list[str], list[str]] | None = None) -> ServedModel:
    """A `ServedModel` of `engine`'s model, with its languages given as
    `(sources, targets)` or read off the model:

    - a name that ends in two codes (`multi30k_en_de`, `opus-mt-hi-en`,
      `opus-mt-en-zh`) serves that pair;
    - a multilingual model whose name ends in a source code and a group
      (`opus-mt-en-ROMANCE`) serves that source into each of its `>>xxx<<`
      languages;
    - any other multilingual model serves its `>>xxx<<` languages into each
      other (Opus-MT's group models such as gmw-gmw read and write the same
      languages).

    A `>>xxx<<` language serves its ISO 639 code (`>>cmn_Hans<<`: zh, see
    `tokens_by_code`). A model without such tokens, or whose tokenizer fixes
    one, translates into one language.

    Raises:
        ValueError: the languages cannot be read off the model, or a target
            has no token: give them, or fewer.
    """
    tokens = tuple(engine.target_languages()) if engine is not None else ()
    fixed = getattr(getattr(engine, "model", None), "preprocessor", None)
    fixed = getattr(getattr(fixed, "tokenizer", None), "target_language", None)
    by_code = tokens_by_code([fixed] if fixed is not None else tokens)
    if languages is not None:
        sources = tuple(_checked_code(c, name) for c in languages[0])
        targets = tuple(_checked_code(c, name) for c in languages[1])
    else:
        sources, targets = _languages_from_name(name, by_code)
    if not by_code and len(targets) > 1:
        raise ValueError(
            f"{name!r} has no target-language tokens: it translates into one language, not {list(targets)}. "
            f"Give it one target ('{name}=SOURCES:TARGET')."
        )
    for target in targets if by_code else ():
        if target not in by_code:
            raise ValueError(f"{name!r} has no target token for {target!r}; it translates into {sorted(by_code)}.")
    # A fixed language is the tokenizer's to add; the others' token is the route's.
    target_languages = {target: by_code[target] for target in targets} if by_code and fixed is None else {}
    return ServedModel(name, engine, sources, targets, target_languages, frozenset(tokens))


def _languages_from_name(name: str, by_code: dict[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    pair = pair_from_name(name)
    if pair is not None and (not by_code or pair[1] in by_code):
        return (pair[0],), (pair[1],)
    source = pair[0] if pair is not None else source_from_name(name)
    if by_code and source is not None:  # one source into the model's languages (opus-mt-en-ROMANCE)
        return (source,), tuple(by_code)
    if by_code:
        return tuple(by_code), tuple(by_code)
    raise ValueError(
        f"Cannot tell the languages of {name!r} from its name: give them, e.g. '{name}=en:de' on the "
        "command line, or languages=(['en'], ['de'])."
    )


def _checked_code(value: str, name: str) -> str:
    checked = code(value)
    if checked is None:
        raise ValueError(f"{value!r} (for {name!r}) is not an ISO 639-1 or 639-3 language code.")
    return checked


class Router:
    """The model of each `(source, target)` pair; the first of `models` wins a shared pair."""

    def __init__(self, models: list[ServedModel]):
        self._routes: dict[tuple[str, str], ServedModel] = {}
        for model in models:
            for pair in model.pairs():
                self._routes.setdefault(pair, model)

    def languages(self) -> list[dict]:
        """LibreTranslate's `/languages`: each language with the targets it translates into."""
        codes = []
        for source, target in self._routes:
            codes += [c for c in (source, target) if c not in codes]
        return [
            {
                "code": c,
                "name": language_name(c),
                "targets": [t for s, t in self._routes if s == c],
            }
            for c in codes
        ]

    def route(self, source: str, target: str) -> Route:
        """The route of a request.

        Raises:
            RoutingError: an unknown code or pair (`"auto"` is the service's:
                it detects each text's language first).
        """
        target_code = code(target) if isinstance(target, str) else None
        if target_code is None or all(t != target_code for _, t in self._routes):
            raise RoutingError(f"target {target!r} is not supported: {self._listing()}.")
        source_code = code(source) if isinstance(source, str) else None
        if source_code is None or all(s != source_code for s, _ in self._routes):
            raise RoutingError(f"source {source!r} is not supported: {self._listing()}.")
        model = self._routes.get((source_code, target_code))
        if model is None:
            targets = [t for s, t in self._routes if s == source_code]
            raise RoutingError(
                f"This server does not translate {source_code!r} into {target_code!r}; "
                f"from {source_code!r} it translates into {targets}."
            )
        return Route(model, source_code, target_code, model.target_languages.get(target_code))

    def _listing(self) -> str:
        pairs = ", ".join(f"{s}->{t}" for s, t in self._routes)
        return f"this server translates {pairs} (GET /languages lists them)"
