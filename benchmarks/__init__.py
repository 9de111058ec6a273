"""Benchmarks of issue 14: this project against Hugging Face and CTranslate2 (see README.md)."""
