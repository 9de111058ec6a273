"""The special tokens of this project's vocabularies, defined once.

Every vocabulary `train_tokenizer` makes has these four pieces at these ids;
the backbone, the search, the loss and the data pipeline take their defaults
from here. Converted checkpoints (Marian) bring their own ids, which the
backbone's config then records.
"""

PAD, UNK, START, END = "<pad>", "<unk>", "<s>", "</s>"
PAD_ID, UNK_ID, START_ID, END_ID = 0, 1, 2, 3
IDS = {PAD: PAD_ID, UNK: UNK_ID, START: START_ID, END: END_ID}
