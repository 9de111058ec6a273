"""LibreTranslate's file translation: `POST /translate_file`, then `GET /download_file/<name>`.

A plain text file is translated line by line (blank lines and each line's
indentation kept: they are its layout); an HTML file as one document with
`format: "html"`. The translated file waits in a temporary folder of the
server's until it shuts down, under a random name, which is its download link.

Example:
>>> lines = TextFile("Hello.\\n\\n  Good bye.\\n")
>>> lines.texts
['Hello.', 'Good bye.']
>>> lines.rebuilt(["Hallo.", "Auf Wiedersehen."])
'Hallo.\\n\\n  Auf Wiedersehen.\\n'
"""

import re
import secrets
import tempfile
from pathlib import Path

# LibreTranslate's `supportedFilesFormat`: the extensions and the format each is translated in.
FILE_FORMATS = {".txt": "text", ".html": "html", ".htm": "html"}
# The stored names this server makes: a random token, then the uploaded name made safe.
_STORED_NAME = re.compile(r"[0-9a-f]{32}\.[A-Za-z0-9._-]{1,100}")


class TextFile:
    """A plain text file as the lines to translate and the layout around them."""

    def __init__(self, content: str):
        self._lines = content.splitlines(keepends=True)
        self.texts = [line.strip() for line in self._lines if line.strip()]

    def rebuilt(self, translations: list[str]) -> str:
        given = iter(translations)
        return "".join(_replaced(line, next(given)) if line.strip() else line for line in self._lines)


def _replaced(line: str, translation: str) -> str:
    """`translation` with the indentation and line end of `line`."""
    text = line.strip()
    start = line.index(text)
    return line[:start] + translation + line[start + len(text) :]


def file_format(filename: str) -> str:
    """The format (`"text"` or `"html"`) a file of this name is translated in.

    Raises:
        ValueError: an extension the server does not translate.
    """
    extension = Path(filename).suffix.lower()
    if extension not in FILE_FORMATS:
        raise ValueError(
            f"Files of type {extension or 'without an extension'!r} are not supported: "
            f"send one of {', '.join(FILE_FORMATS)}."
        )
    return FILE_FORMATS[extension]


class FileStore:
    """Translated files, kept in a temporary folder until `close()`."""

    def __init__(self):
        self._folder = tempfile.TemporaryDirectory(prefix="keras-transformer-files-")

    def save(self, filename: str, content: str) -> str:
        """Stores `content`; returns the name to download it by."""
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", Path(filename).name)[-100:].lstrip(".") or "translation.txt"
        name = f"{secrets.token_hex(16)}.{safe}"
        (Path(self._folder.name) / name).write_text(content, encoding="utf-8")
        return name

    def path(self, name: str) -> Path | None:
        """The stored file of a download name; `None` for a name this server did not give."""
        if _STORED_NAME.fullmatch(name) is None:
            return None
        path = Path(self._folder.name) / name
        return path if path.is_file() else None

    @staticmethod
    def original_name(name: str) -> str:
        """The uploaded file's (safe) name of a download name."""
        return name.split(".", 1)[1]

    def close(self) -> None:
        self._folder.cleanup()
