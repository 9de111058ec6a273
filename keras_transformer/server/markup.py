"""`format: "html"`: translate an HTML document's text, keep its markup.

The standard library's `html.parser` gives each tag as written
(`get_starttag_text`) and each text with its entities decoded, which is all
this needs: tags, attributes, comments and declarations are copied as they
came; the text between them is translated (what a browser would show, leading
and trailing spaces kept) and escaped again. The text of `<script>`, `<style>`,
`<code>` and `<pre>` is code, not language: kept as written.

Example:
>>> document = HtmlDocument('<p class="x">Hello &amp; welcome</p><code>print(1)</code>')
>>> document.texts
['Hello & welcome']
>>> document.rebuilt(["Hallo & willkommen"])
'<p class="x">Hallo &amp; willkommen</p><code>print(1)</code>'
"""

import html
from html.parser import HTMLParser

# Elements whose content is code or data, not text to translate.
UNTRANSLATED = frozenset({"script", "style", "code", "pre", "textarea"})


class HtmlDocument:
    """An HTML document as the texts to translate and the markup around them.

    Args:
        source: the document (or fragment) as written.
    """

    def __init__(self, source: str):
        parser = _Splitter()
        parser.feed(source)
        parser.close()
        self._pieces = parser.pieces
        self.texts = [piece for piece, translated in self._pieces if translated]

    def rebuilt(self, translations: list[str]) -> str:
        """The document with its `texts` replaced, in order, by `translations`."""
        if len(translations) != len(self.texts):
            raise ValueError(f"{len(self.texts)} texts need as many translations; got {len(translations)}.")
        given = iter(translations)
        return "".join(_with_spaces(piece, next(given)) if translated else piece for piece, translated in self._pieces)


def _with_spaces(original: str, translation: str) -> str:
    """`translation`, escaped, with the spaces around `original` (they separate it from the markup)."""
    stripped = original.strip()
    start = original.index(stripped[0]) if stripped else 0
    return original[:start] + html.escape(translation.strip(), quote=False) + original[start + len(stripped) :]


class _Splitter(HTMLParser):
    """Cuts a document into `(piece, translated)`: markup as written, text decoded."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.pieces: list[tuple[str, bool]] = []
        self._code_depth = 0

    def handle_starttag(self, tag, attrs):
        self.pieces.append((self.get_starttag_text(), False))
        if tag in UNTRANSLATED:
            self._code_depth += 1

    def handle_startendtag(self, tag, attrs):
        self.pieces.append((self.get_starttag_text(), False))

    def handle_endtag(self, tag):
        self.pieces.append((f"</{tag}>", False))
        if tag in UNTRANSLATED and self._code_depth:
            self._code_depth -= 1

    def handle_data(self, data):
        if self._code_depth or self.cdata_elem is not None:  # code, or the raw text of script/style
            self.pieces.append((data if self.cdata_elem else html.escape(data, quote=False), False))
        elif any(character.isalpha() for character in data):
            self.pieces.append((data, True))
        else:  # spaces, digits, punctuation: nothing to translate
            self.pieces.append((html.escape(data, quote=False), False))

    def handle_comment(self, data):
        self.pieces.append((f"<!--{data}-->", False))

    def handle_decl(self, decl):
        self.pieces.append((f"<!{decl}>", False))

    def handle_pi(self, data):
        self.pieces.append((f"<?{data}>", False))

    def unknown_decl(self, data):
        self.pieces.append((f"<![{data}]>", False))
