"""Tiny, deterministic data for the zoo's scripts, in the exact formats they read.

Nothing is downloaded: each function writes what one script expects to find on disk, small
enough that a run takes seconds on a CPU. Every generator is seeded, so a plain run and an
instrumented run of the same script see the same bytes (the checkpoint comparison needs it).
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np

_WORDS = ("the of and to in a is was for on as with by he at from his it an were are which this be "
          "also has or had first one their its new after who they have her she two been other when "
          "there all during into school time may years more most only over city some world would "
          "where later up such used many can state about national out known university united "
          "then made").split()


def nanogpt(workdir: Path, dataset: str = "zoo", tokens: int = 4096, vocab: int = 64) -> None:
    """`data/<dataset>/{train,val}.bin` (uint16 token ids, as nanoGPT's prepare.py writes them)
    and `meta.pkl` (vocab_size, stoi, itos: the char-level format sample.py decodes with)."""
    folder = workdir / "data" / dataset
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1337)
    for split, n in (("train", tokens), ("val", tokens // 4)):
        rng.integers(0, vocab, size=n, dtype=np.uint16).tofile(folder / f"{split}.bin")
    chars = [chr(ord("!") + i) for i in range(vocab)]
    meta = {"vocab_size": vocab, "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)


WIKITEXT_LINES = (48, 12, 12)  # train, valid, test
WIKITEXT_WORDS_PER_LINE = 12


def wikitext(folder: Path, lines: tuple[int, int, int] = WIKITEXT_LINES,
             words_per_line: int = WIKITEXT_WORDS_PER_LINE) -> int:
    """`train.txt`, `valid.txt`, `test.txt` of space-separated words, as word_language_model's
    data.Corpus reads them. Returns the number of training tokens (words + one <eos> a line)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1111)
    for name, n in zip(("train", "valid", "test"), lines):
        text = "".join(" ".join(rng.choice(_WORDS) for _ in range(words_per_line)) + "\n" for _ in range(n))
        (folder / f"{name}.txt").write_text(text, encoding="utf8")
    return lines[0] * (words_per_line + 1)


def wikitext_train_tokens() -> int:
    """Training tokens `wikitext()` writes with its defaults: data.Corpus adds <eos> to each line."""
    return WIKITEXT_LINES[0] * (WIKITEXT_WORDS_PER_LINE + 1)


def word_lm_batches(train_tokens: int, batch_size: int, bptt: int, epochs: int) -> int:
    """Optimizer updates word_language_model's main.py makes: its own batchify and train loop."""
    rows = train_tokens // batch_size
    return epochs * len(range(0, rows - 1, bptt))


def sine_waves(workdir: Path, n: int = 8, length: int = 60, period: int = 20) -> None:
    """`traindata.pt` as time_sequence_prediction's generate_sine_wave.py writes it (a float64
    numpy array of N shifted sine waves, saved with torch.save), with fewer and shorter waves so
    an LBFGS step takes a fraction of a second instead of seconds."""
    import torch

    rng = np.random.RandomState(2)
    x = np.empty((n, length), "int64")
    x[:] = np.array(range(length)) + rng.randint(-4 * period, 4 * period, n).reshape(n, 1)
    data = np.sin(x / 1.0 / period).astype("float64")
    with open(workdir / "traindata.pt", "wb") as f:
        torch.save(data, f)
