"""The real LibreTranslate, offline, serving this project's weights: its set-up and how to start it.

    python -m benchmarks.libretranslate setup --venv /work/venvs/libretranslate    # once: pip into its own venv
    python -m benchmarks.libretranslate package multi30k_en_de --home benchmarks/.work/libretranslate

LibreTranslate goes into a virtual environment of its own (`setup`): it pins
versions (flask 2.2.5, requests 2.31.0, numpy < 2; rich < 13 through
flask-limiter) that must not change this project's environment. spaCy comes with it for the one sentence
splitter that needs no download (see below); spaCy's command-line helper
wants rich >= 13 and LibreTranslate's flask-limiter rich < 13: rich 12 is
kept, and neither command line is used.

`package` turns a preset into an Argos Translate package, the only form of
model LibreTranslate serves, installed under `HOME/packages`:

1. `keras-transformer export PRESET DIR --format transformers`: a Marian
   checkpoint of the preset's weights;
2. CTranslate2's own `TransformersConverter`: the model Argos runs
   (`model/`), float32 (LibreTranslate picks the compute type, `auto`);
3. `"add_source_bos": true, "add_source_eos": true` in the converted
   model's `config.json`: Argos feeds bare SentencePiece pieces and this
   project's models were trained on `<s> pieces </s>`;
4. `sentencepiece.model` (the preset's SentencePiece model, which Argos
   tokenizes with) and `metadata.json` (`from_code`, `to_code`, `type`);
5. `spacy/`: a blank spaCy pipeline of the source language; with
   `ARGOS_CHUNK_TYPE=SPACY`, Argos splits sentences with spaCy's rule-based
   `sentencizer` over it. The default splitter (MiniSBD) downloads a model on
   the first request.

Offline, LibreTranslate must not look for packages: with fewer than two
installed it fetches the package index at boot and downloads sentence
splitters (retrying for about 17 minutes). `environment` points
`ARGOS_PACKAGE_INDEX` at a local index holding `[]`, `command` passes
`--load-only SOURCE,TARGET` (so the empty index is an error it prints and
gets over), and spaCy's cache marker (`XDG_CACHE_HOME/argos-translate/spacy/senter/model`)
stops Argos from downloading spaCy's multilingual model. Every path it
writes is under `HOME`.

As shipped, LibreTranslate runs in one process: waitress with 4 HTTP threads
(`--threads`), one CTranslate2 translator per pair shared by them
(`inter_threads` 1, `intra_threads` from `OMP_NUM_THREADS`), beam 4
(`ARGOS_BEAM_SIZE`) with length penalty 0.2, at most 256 tokens; a list `q`
is translated text by text, nothing batched across requests. The model
loads on the first request, so it is ready at its first answer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import REPO_ROOT

VERSION = "1.9.6"  # the version SERVING.md's facts were checked against
# spaCy for the splitter that needs no download; rich 12 for LibreTranslate's flask-limiter (see above).
REQUIREMENTS = (f"libretranslate=={VERSION}", "spacy>=3.7,<4", "rich>=12,<13")
PACKAGE_NAME = "translate-{source}_{target}"


def setup(venv: Path) -> Path:
    """Creates `venv` and installs LibreTranslate into it; returns its `libretranslate` script."""
    script = venv / "bin" / "libretranslate"
    if not script.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", *REQUIREMENTS], check=True)
    return script


def venv_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not (venv / "bin" / "libretranslate").exists():
        raise SystemExit(
            f"LibreTranslate is not installed in {venv}: run `python -m benchmarks.libretranslate setup --venv {venv}`."
        )
    return python


def export_marian(preset: str, out: Path, env: dict | None = None) -> Path:
    """`keras-transformer export PRESET OUT --format transformers`, with this checkout's code."""
    env = {
        **(env or os.environ),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "keras_transformer.cli", "export", preset, str(out), "--format", "transformers"]
    subprocess.run([*command, "--overwrite"], check=True, env=env, cwd=REPO_ROOT)
    return out


def build_package(preset: str, home: Path, venv: Path, source: str = "en", target: str = "de") -> Path:
    """The Argos package of `preset` (steps 1-5 of the module docstring), installed
    under `home/packages`; returns its folder (a zip of it is an `.argosmodel`)."""
    import ctranslate2

    package = home / "packages" / PACKAGE_NAME.format(source=source, target=target)
    shutil.rmtree(package, ignore_errors=True)
    package.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as scratch:
        marian = export_marian(preset, Path(scratch) / "marian")
        ctranslate2.converters.TransformersConverter(str(marian)).convert(str(package / "model"), force=True)
        shutil.copyfile(marian / "source.spm", package / "sentencepiece.model")
    config_path = package / "model" / "config.json"
    config = json.loads(config_path.read_text())
    config.update(add_source_bos=True, add_source_eos=True)
    config_path.write_text(json.dumps(config, indent=2))
    metadata = {
        "package_version": "1.0",
        "argos_version": "1.0",
        "from_code": source,
        "to_code": target,
        "type": "translate",
        "links": [],
    }
    (package / "metadata.json").write_text(json.dumps(metadata, indent=2))
    blank = f"import spacy; spacy.blank({source!r}).to_disk({str(package / 'spacy')!r})"
    subprocess.run([str(venv_python(venv)), "-c", blank], check=True)
    return package


def environment(home: Path, threads: int, beam_size: int = 4) -> dict[str, str]:
    """The variables that keep LibreTranslate offline and inside `home` (see the module docstring)."""
    index = home / "index"
    index.mkdir(parents=True, exist_ok=True)
    (index / "index.json").write_text("[]")
    cache = home / "cache"
    (cache / "argos-translate" / "spacy" / "senter" / "model").mkdir(parents=True, exist_ok=True)
    return {
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(cache),
        "ARGOS_PACKAGES_DIR": str(home / "packages"),
        "ARGOS_PACKAGE_INDEX": index.as_uri() + "/",
        "ARGOS_CHUNK_TYPE": "SPACY",
        "ARGOS_BEAM_SIZE": str(beam_size),
        "OMP_NUM_THREADS": str(threads),  # CTranslate2's intra_threads (Argos passes 0: this)
    }


def command(venv: Path, port: int, source: str = "en", target: str = "de") -> list[str]:
    """LibreTranslate's command line on 127.0.0.1:`port`, loading only the pair's languages."""
    venv_python(venv)
    script = venv / "bin" / "libretranslate"
    return [str(script), "--host", "127.0.0.1", "--port", str(port), "--load-only", f"{source},{target}"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = parser.add_subparsers(dest="step", required=True)
    install = steps.add_parser("setup", help="install LibreTranslate into its own virtual environment")
    install.add_argument("--venv", type=Path, required=True)
    pack = steps.add_parser("package", help="build and install the Argos package of a preset")
    pack.add_argument("preset", help="a preset name or directory")
    pack.add_argument("--home", type=Path, required=True, help="LibreTranslate's data, cache and packages")
    pack.add_argument("--venv", type=Path, required=True)
    pack.add_argument("--source", default="en")
    pack.add_argument("--target", default="de")
    args = parser.parse_args(argv)
    if args.step == "setup":
        print(setup(args.venv))
    else:
        print(build_package(args.preset, args.home, args.venv, args.source, args.target))


if __name__ == "__main__":
    main()
