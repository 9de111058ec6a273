"""Which loaded model translates from one language into another.

A `ServedModel` is one model with the language pairs it serves: a bilingual
model one pair (`multi30k_en_de`: en -> de), a multilingual Opus-MT model
every pair of its sources and its `>>xxx<<` targets (gmw-gmw: en, de, nl, ...
into each other). The `Router` answers LibreTranslate's `/languages` and picks
the model of each `(source, target)`; the first model given wins a pair two
models serve.

Example:
>>> router = Router([ServedModel("en-de", None, sources=("en",), targets=("de",))])
>>> router.route("en", "de").model.name, router.route("auto", "de").source
('en-de', 'en')
>>> router.languages()
[{'code': 'en', 'name': 'English', 'targets': ['de']}, {'code': 'de', 'name': 'German', 'targets': []}]
"""

from dataclasses import dataclass, field

from keras_transformer.server.languages import alpha_3, code, language_name, pair_from_name


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
        batcher: its `Batcher`, set by the server.
    """

    name: str
    engine: object
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    target_languages: dict = field(default_factory=dict)
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
      `big_en_de`) serves that pair;
    - otherwise a multilingual model serves its `>>xxx<<` languages into
      each other (Opus-MT's group models such as gmw-gmw read and write the
      same languages).

    Raises:
        ValueError: the languages cannot be read off the model: give them.
    """
    own = engine.target_languages() if engine is not None else []
    by_code = {code(language) or language: language for language in own}
    if languages is not None:
        sources = tuple(_checked_code(c, name) for c in languages[0])
        targets = tuple(_checked_code(c, name) for c in languages[1])
    elif (pair := pair_from_name(name)) is not None:
        sources, targets = (pair[0],), (pair[1],)
    elif own:
        sources = targets = tuple(by_code)
    else:
        raise ValueError(
            f"Cannot tell the languages of {name!r} from its name: give them, e.g. '{name}=en:de' on the "
            "command line, or languages=(['en'], ['de'])."
        )
    fixed = getattr(getattr(engine, "model", None), "preprocessor", None)
    fixed = getattr(getattr(fixed, "tokenizer", None), "target_language", None)
    target_languages = {}
    if own and fixed is None:
        for target in targets:
            language = by_code.get(target) or (alpha_3(target) if alpha_3(target) in own else None)
            if language is None:
                raise ValueError(f"{name!r} has no target token for {target!r}; its languages are {sorted(by_code)}.")
            target_languages[target] = language
    return ServedModel(name, engine, sources, targets, target_languages)


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
            RoutingError: an unknown code or pair, or `"auto"` where several sources serve the target.
        """
        target_code = code(target) if isinstance(target, str) else None
        if target_code is None or all(t != target_code for _, t in self._routes):
            raise RoutingError(f"target {target!r} is not supported: {self._listing()}.")
        if source == "auto":
            sources = [s for s, t in self._routes if t == target_code]
            if len(sources) != 1:
                raise RoutingError(
                    f"source 'auto' is ambiguous: {sorted(sources)} all translate into {target_code!r} here, "
                    "and this server detects no languages. Pass one of them as source."
                )
            source_code = sources[0]
        else:
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
