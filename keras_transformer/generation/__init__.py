"""Decoding: beam and greedy search, its compiled wiring per backend, long
texts, the SavedModel export and attention pictures."""
