"""The peers, each measured inside one `benchmarks.worker` process.

- `HuggingFace`: `transformers.MarianMTModel`, torch float32: `generate`
  (greedy / beam search) and a plain torch training loop with the same
  label-smoothed loss and Adam settings as this project's `compile()`.
- `CTranslate2`: `ctranslate2.Translator` on the checkpoint converted by
  CTranslate2's own converter (`benchmarks.checkpoint`), `float32` or
  `int8` (quantized when loading), fed token strings.

Both decode exactly `new_tokens` tokens: the end token is suppressed until
then (`min_new_tokens` / `min_decoding_length`) and decoding stops there
(`max_new_tokens` / `max_decoding_length`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from benchmarks.checkpoint import CT2_DIR, MARIAN_DIR
from benchmarks.workloads import UNK_ID, Decode, Train, target_log_probs

LABEL_SMOOTHING = 0.1
LEARNING_RATE = 1e-4  # constant: the schedule costs nothing measurable


class HuggingFace:
    """`MarianMTModel` in torch: `float32`, or `bfloat16` (float32 weights,
    matrix products in bfloat16 under `torch.autocast`, as Keras'
    `mixed_bfloat16` policy does), on `device` ("cpu" or "cuda")."""

    def __init__(self, checkpoint: Path, threads: int, device: str = "cpu", precision: str = "float32"):
        if precision not in ("float32", "bfloat16"):
            raise ValueError(f"precision must be float32 or bfloat16; got {precision!r}")
        start = time.perf_counter()
        import torch
        import transformers

        self.import_s = time.perf_counter() - start
        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        self.torch = torch
        start = time.perf_counter()
        self.model = transformers.MarianMTModel.from_pretrained(checkpoint / MARIAN_DIR).eval().to(device)
        self.synchronize()
        self.load_s = time.perf_counter() - start
        self.device = device
        self.autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bfloat16")
        config = self.model.config
        self.pad_id, self.end_id = config.pad_token_id, config.eos_token_id
        self.optimizer = None

    def synchronize(self) -> None:
        """Waits for the GPU's queued work, so that timings include it."""
        if self.torch.cuda.is_available():
            self.torch.cuda.synchronize()

    def decode(self, workload: Decode) -> np.ndarray:
        torch, n = self.torch, workload.new_tokens
        sources = torch.from_numpy(workload.sources()).long().to(self.device)
        with torch.inference_mode(), self.autocast:
            outputs = self.model.generate(
                input_ids=sources,
                attention_mask=torch.ones_like(sources),
                num_beams=workload.beam_size,
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                suppress_tokens=[self.pad_id],  # Marian's <pad> is an input only
            )
        return outputs[:, 1:n].cpu().numpy()  # outputs[:, 0] is the decoder start token

    def score(self, workload: Decode) -> np.ndarray:
        torch = self.torch
        sources, targets = workload.sources(), workload.targets()
        start = np.full((workload.batch, 1), self.model.config.decoder_start_token_id, "int32")
        decoder_input = np.concatenate([start, targets[:, :-1]], axis=1)
        to_device = lambda a: torch.from_numpy(a).long().to(self.device)  # noqa: E731
        with torch.inference_mode(), self.autocast:
            logits = self.model(
                input_ids=to_device(sources),
                attention_mask=to_device(np.ones_like(sources)),
                decoder_input_ids=to_device(decoder_input),
            ).logits
        return target_log_probs(logits.float().cpu().numpy(), targets, self.pad_id)

    def loss(self, logits, labels):
        """This project's `LabelSmoothedCrossEntropy`: smoothing mass spread
        over every token but `<pad>` (= the start token) and `<unk>`,
        padding labels ignored, mean over real tokens."""
        torch = self.torch
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        nll = -log_probs.gather(-1, labels[..., None]).squeeze(-1)
        smoothed = torch.ones(log_probs.shape[-1], dtype=torch.bool, device=log_probs.device)
        smoothed[[self.pad_id, UNK_ID]] = False
        uniform = -(log_probs * smoothed).sum(-1) / smoothed.sum()
        per_token = (1 - LABEL_SMOOTHING) * nll + LABEL_SMOOTHING * uniform
        weights = (labels != self.pad_id).float()
        return (per_token * weights).sum() / weights.sum()

    def train(self, workload: Train, steps: int) -> None:
        torch = self.torch
        if self.optimizer is None:
            self.model.train()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.98), eps=1e-9)
        arrays = {k: torch.from_numpy(v).long().to(self.device) for k, v in workload.arrays().items()}
        for _ in range(steps):
            with self.autocast:
                logits = self.model(
                    input_ids=arrays["source"],
                    attention_mask=torch.ones_like(arrays["source"]),
                    decoder_input_ids=arrays["decoder_input"],
                ).logits
            loss = self.loss(logits, arrays["labels"])
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        self.synchronize()


class CTranslate2:
    """`ctranslate2.Translator` with `compute_type` float32 or int8."""

    def __init__(self, checkpoint: Path, compute_type: str, threads: int):
        start = time.perf_counter()
        import ctranslate2

        self.import_s = time.perf_counter() - start
        directory = checkpoint / CT2_DIR
        start = time.perf_counter()
        self.translator = ctranslate2.Translator(
            str(directory), device="cpu", compute_type=compute_type, intra_threads=threads, inter_threads=1
        )
        self.load_s = time.perf_counter() - start
        # CTranslate2's converter drops Marian's trailing <pad>; ids are otherwise Marian's.
        self.vocabulary = json.loads((directory / "shared_vocabulary.json").read_text())
        self.ids = {token: i for i, token in enumerate(self.vocabulary)}

    def decode(self, workload: Decode) -> np.ndarray:
        n = workload.new_tokens
        sources = [[self.vocabulary[i] for i in row] for row in workload.sources()]
        results = self.translator.translate_batch(
            sources,
            beam_size=workload.beam_size,
            max_decoding_length=n,
            min_decoding_length=n,
            max_batch_size=0,
        )
        return np.array([[self.ids[t] for t in r.hypotheses[0][: n - 1]] for r in results], "int32")

    def score(self, workload: Decode) -> np.ndarray:
        n = workload.new_tokens
        sources = [[self.vocabulary[i] for i in row] for row in workload.sources()]
        targets = [[self.vocabulary[i] for i in row] for row in workload.targets()]
        results = self.translator.score_batch(sources, targets, max_batch_size=0)
        return np.array([r.log_probs[:n] for r in results], "float64")  # then the log-prob of </s>

    def train(self, workload: Train, steps: int) -> None:
        raise NotImplementedError("CTranslate2 is an inference engine")
