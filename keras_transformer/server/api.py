"""LibreTranslate's `/translate` request, read and checked before anything runs.

`read_translate_request` turns a request body (JSON or form-encoded, as
LibreTranslate takes it) into a `TranslateRequest`, or raises `ApiError`
with the status and the one-sentence message LibreTranslate's clients show:
400 for a malformed request, 403 for a missing or unknown API key, 413 for
a body over the size limit, 415 for a body of another type.

Example:
>>> limits = Limits(char_limit=100)
>>> request = read_translate_request(b'{"q": ["Hi.", "Bye."], "source": "en", "target": "de"}',
...                                  "application/json", limits)
>>> request.texts, request.single, request.source
(['Hi.', 'Bye.'], False, 'en')
>>> read_translate_request(b"q=Hi.&source=en&target=de&format=xml",
...                        "application/x-www-form-urlencoded", limits)
Traceback (most recent call last):
...
keras_transformer.server.api.ApiError: format 'xml' is not supported: send format 'text' or 'html'.
"""

import json
import re
import urllib.parse
from collections.abc import Collection
from dataclasses import dataclass

# `>>xxx<<` anywhere: a multilingual model reads its own tokens as the
# language to translate into, so a text carrying one would pick its own.
_LANGUAGE_TOKEN = re.compile(r">>([^<>\s]{1,20})<<")


class ApiError(Exception):
    """A request the server refuses: `status`, and the message for `{"error": ...}`."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass(frozen=True)
class Limits:
    """What one request may hold (LibreTranslate's option names where it has them).

    Args:
        char_limit: characters of all texts together (`--char-limit`); `None` for no limit.
        batch_limit: texts in a list `q` (`--batch-limit`); `None` for no limit.
        max_body_bytes: the request body, refused before it is parsed.
        api_keys: the keys `api_key` must be one of; empty for an open server.
    """

    char_limit: int | None = 5000
    batch_limit: int | None = 64
    max_body_bytes: int = 1 << 20
    api_keys: frozenset = frozenset()


FORMATS = ("text", "html")


@dataclass(frozen=True)
class TranslateRequest:
    """A checked request: its texts (`single` for a string `q`), languages
    (`source` may be `"auto"`), `text_format` and how many `alternatives`."""

    texts: list[str]
    single: bool
    source: str
    target: str
    text_format: str = "text"
    alternatives: int = 0


def read_translate_request(body: bytes, content_type: str, limits: Limits) -> TranslateRequest:
    """The checked request of a `/translate` body.

    Raises:
        ApiError: see the module's docstring.
    """
    fields = _fields(body, content_type)
    texts, single = read_texts(fields, limits)
    text_format = fields.get("format") or "text"
    if not isinstance(text_format, str) or text_format not in FORMATS:
        shown = repr(text_format) if isinstance(text_format, str) else f"of type {type(text_format).__name__}"
        raise ApiError(400, f"format {shown} is not supported: send format 'text' or 'html'.")
    source, target = (_language_field(fields, name) for name in ("source", "target"))
    return TranslateRequest(texts, single, source, target, text_format, _alternatives(fields.get("alternatives")))


def read_detect_request(body: bytes, content_type: str, limits: Limits) -> tuple[list[str], bool]:
    """The texts of a `/detect` body (`q`, `api_key`), checked as `/translate`'s,
    and whether `q` was one string."""
    return read_texts(_fields(body, content_type), limits)


def read_texts(fields: dict, limits: Limits) -> tuple[list[str], bool]:
    """`q` of a request's fields, within `limits`, its API key checked."""
    api_key = fields.get("api_key")
    if limits.api_keys and (not isinstance(api_key, str) or api_key not in limits.api_keys):
        raise ApiError(403, "Invalid API key: send a valid api_key with the request.")
    texts, single = _texts(fields.get("q"))
    if not single and limits.batch_limit is not None and len(texts) > limits.batch_limit:
        raise ApiError(400, f"Invalid request: {len(texts)} texts exceed the batch limit of {limits.batch_limit}.")
    check_characters(texts, limits)
    return texts, single


def check_characters(texts: list[str], limits: Limits) -> None:
    """Refuses texts of more characters, all together, than `limits.char_limit`."""
    characters = sum(len(text) for text in texts)
    if limits.char_limit is not None and characters > limits.char_limit:
        raise ApiError(400, f"Invalid request: {characters} characters exceed the text limit of {limits.char_limit}.")


def _alternatives(value) -> int:
    """`alternatives` as a count (JSON gives a number, a form a string)."""
    if value is None or value == "":
        return 0
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 9:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        shown = repr(value) if len(repr(value)) <= 40 else f"a {type(value).__name__} of {len(repr(value))} characters"
        raise ApiError(400, f"Invalid request: alternatives must be a whole number >= 0; got {shown}.")
    return value


def check_language_tokens(request: TranslateRequest, token_languages: Collection[str]) -> None:
    """Refuses a text that carries a target-language token of the model
    (`>>fra<<` where `token_languages` holds `fra`): the model would read it
    as the language to translate into. Other `>>...<<` are text.

    Raises:
        ApiError: 400, naming the text and the token.
    """
    for index, text in enumerate(request.texts):
        for token in _LANGUAGE_TOKEN.finditer(text):
            if token.group(1) in token_languages:
                where = "q" if request.single else f"q[{index}]"
                raise ApiError(
                    400,
                    f"{where} contains {token.group()!r}, the model's target-language token: choose the "
                    "language with 'target' instead.",
                )


def check_body_size(content_length: str | None, limits: Limits) -> None:
    """Refuses a body whose declared length is over the limit, before reading it."""
    if content_length is None:
        return
    try:
        length = int(content_length)
    except ValueError:
        raise ApiError(400, "Invalid request: the Content-Length header is not a number.") from None
    if length > limits.max_body_bytes:
        raise too_large(limits)


def too_large(limits: Limits) -> ApiError:
    return ApiError(413, f"The request body is larger than {limits.max_body_bytes} bytes: send less text at a time.")


def _fields(body: bytes, content_type: str) -> dict:
    media_type = content_type.split(";")[0].strip().lower()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ApiError(400, f"Invalid request: the body is not valid UTF-8 (at byte {error.start}).") from None
    if media_type == "application/json":
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as error:
            raise ApiError(400, f"Invalid request: malformed JSON ({error.msg} at character {error.pos}).") from None
        except ValueError:  # Python's limit on the digits of an int
            raise ApiError(400, "Invalid request: a JSON number has too many digits.") from None
        except RecursionError:
            raise ApiError(400, "Invalid request: the JSON is nested too deeply.") from None
        if not isinstance(fields, dict):
            raise ApiError(400, f"Invalid request: the JSON body must be an object; got {type(fields).__name__}.")
        return fields
    if media_type in ("application/x-www-form-urlencoded", ""):
        try:
            pairs = urllib.parse.parse_qs(text, keep_blank_values=True, strict_parsing=False, errors="strict")
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "Invalid request: the form body is not valid percent-encoded UTF-8.") from None
        # A repeated q is a list of texts; every other field is one value.
        return {key: (values if key == "q" and len(values) > 1 else values[-1]) for key, values in pairs.items()}
    raise ApiError(
        415, f"Unsupported content type {media_type!r}: send application/json or application/x-www-form-urlencoded."
    )


def _texts(q) -> tuple[list[str], bool]:
    if q is None:
        raise ApiError(400, "Invalid request: missing q parameter.")
    single = isinstance(q, str)
    texts = [q] if single else q
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        raise ApiError(400, "Invalid request: q must be a string or a list of strings.")
    if not texts or (single and not q.strip()):
        raise ApiError(400, "Invalid request: q is empty; send the text to translate.")
    for index, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            where = "q" if single else f"q[{index}]"
            raise ApiError(400, f"Invalid request: {where} is not valid Unicode (a lone surrogate).") from None
    return texts, single


def _language_field(fields: dict, name: str) -> str:
    value = fields.get(name)
    if value is None or value == "":
        raise ApiError(400, f"Invalid request: missing {name} parameter.")
    if not isinstance(value, str):
        raise ApiError(400, f"Invalid request: {name} must be a language code string; got {type(value).__name__}.")
    return value
