"""Evaluation: translations scored with sacreBLEU (`bleu`), and a test set in
files translated and scored (`test_set`, what `keras-transformer evaluate` runs)."""
