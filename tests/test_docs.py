"""The documents stay true to the tree: README tables, benchmark figures and wording."""

import re
from pathlib import Path

from helpers import REPO_ROOT
from keras_transformer.presets.catalog import NAMED_PRESETS, shipped_presets

README = REPO_ROOT / "README.md"
RESULTS = REPO_ROOT / "benchmarks" / "RESULTS.md"
# What a newcomer reads (tests are left out: pytest's `scope="session"` is a technical word),
# and what the package ships to its users.
DOCUMENTED = ("README.md", "keras_transformer", "presets", "tools", "benchmarks", "examples")
SHIPPED = ("README.md", "keras_transformer", "presets")
TEXT_SUFFIXES = {".py", ".md", ".sh", ".json", ".toml", ".txt"}


def table_after(text: str, marker: str) -> list[list[str]]:
    """The body rows of the first Markdown table after the first line that starts with `marker`.

    Example:
    >>> table_after("## T\\n\\n| a | b |\\n| --- | --- |\\n| 1 | `x` |\\n\\nmore", "## T")
    [['1', '`x`']]
    """
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(marker))
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # without the header and its `---` separator


def _number(cell: str) -> float | None:
    match = re.match(r"[\d,.]+", cell)
    return float(match.group().replace(",", "")) if match else None


def _text_files(names: tuple[str, ...]) -> list[Path]:
    """The text files among `names` (files or folders of the repository), folders searched through."""
    files = []
    for name in names:
        path = REPO_ROOT / name
        if path.is_file():
            files.append(path)
            continue
        files += sorted(
            found for found in path.rglob("*") if found.suffix in TEXT_SUFFIXES and "__pycache__" not in found.parts
        )
    return files


def _offenders(names: tuple[str, ...], pattern: str) -> dict[str, list[str]]:
    """What `pattern` (case-insensitive) finds in each text file among `names`, by relative path."""
    found = {}
    for path in _text_files(names):
        matches = re.findall(pattern, path.read_text(encoding="utf-8", errors="replace"), re.IGNORECASE)
        if matches:
            found[str(path.relative_to(REPO_ROOT))] = matches
    return found


def test_the_readme_stays_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 280, f"README.md has {lines} lines: move detail into the docs it links to"


def test_every_file_in_the_where_to_look_table_exists():
    rows = table_after(README.read_text(encoding="utf-8"), "Where to look")
    paths = [path for _, where in rows for path in re.findall(r"`([^`]+)`", where)]
    assert len(rows) >= 8 and len(paths) >= len(rows)
    missing = [path for path in paths if not (REPO_ROOT / path).exists()]
    assert not missing, f"README.md's design notes name files that are not in the tree: {missing}"


def test_the_presets_table_lists_every_named_preset():
    rows = table_after(README.read_text(encoding="utf-8"), "## Presets")
    listed = {row[0].strip("`") for row in rows}
    registered = set(NAMED_PRESETS) | set(shipped_presets())
    assert listed == registered, (
        f"README.md's presets table and the registered presets differ: only in the table "
        f"{sorted(listed - registered)}, only registered {sorted(registered - listed)}"
    )
    assert all(re.search(r"\d\d\.\d", row[2]) for row in rows), "every preset needs its published BLEU"


def test_the_speed_table_comes_from_the_latest_benchmark_run():
    results = RESULTS.read_text(encoding="utf-8")
    readme = README.read_text(encoding="utf-8")
    measured = table_after(results, "## Throughput")
    shown = table_after(readme, "## Speed")
    assert shown, "README.md's speed section has no table"
    for column in range(1, len(shown[0])):
        in_results = {_number(row[column]) for row in measured} - {None}
        in_readme = {_number(row[column]) for row in shown} - {None}
        assert in_readme <= in_results, (
            f"README.md's speed column {column} has {sorted(in_readme - in_results)}, "
            "which benchmarks/RESULTS.md's latest run does not: copy the table from that run"
        )
    cpu = re.search(r"^- Machine: \d+ CPUs, ([^,]+),", results, re.MULTILINE).group(1)
    assert cpu in readme.split("## Speed")[1], f"README.md's speed table does not name the run's CPU ({cpu})"


def test_no_document_speaks_of_sessions():
    # `tf.Session`-like attribute names are technical, not a work log.
    found = _offenders(DOCUMENTED, r"(?<![.\w])sessions?\b")
    assert not found, f"say what the code does and why, not when it was written: {found}"


def test_shipped_files_cite_no_issue_numbers():
    found = _offenders(SHIPPED, r"\bissues?\s*#?\d+")
    assert not found, f"the package's users cannot read the project's issues: {found}"
