"""Benchmarks: this project against Hugging Face and CTranslate2 on identical weights (see README.md)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
