"""Presets: the catalogue of named presets, resolving names and handles to
verified folders, integrity checks, atomic saving, model cards, and loading
a preset in a precision."""
