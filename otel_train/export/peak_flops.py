"""Peak FLOP/s of common accelerators, for `train.mfu`: bf16 (or fp16) dense tensor-core throughput.

From the vendors' datasheets, *without* structured sparsity (datasheets often print the sparse
figure, twice these). A device is found by its name as torch reports it
(`torch.cuda.get_device_name()`, e.g. "NVIDIA H100 80GB HBM3", "AMD Instinct MI300X"); the first
row whose every word is a word of the name wins, so the more specific rows come first. Anything else,
and the CPU, has no peak here: set `OTEL_TRAIN_PEAK_FLOPS` (which also overrides this table, e.g.
for a power-capped card or fp8 training).
"""

from __future__ import annotations

import re

T = 1e12

#: (words that must all be words of the lower-cased device name, peak FLOP/s), most specific first.
PEAKS: tuple[tuple[tuple[str, ...], float], ...] = (
    (("gh200",), 989 * T),  # Grace Hopper: the H100 SXM's tensor cores
    (("h200", "nvl"), 835 * T),
    (("h200",), 989 * T),
    (("h100", "pcie"), 756 * T),
    (("h100", "nvl"), 835 * T),
    (("h100",), 989 * T),  # SXM5 ("NVIDIA H100 80GB HBM3")
    (("b200",), 2250 * T),
    (("a100",), 312 * T),  # SXM4 and PCIe alike
    (("l40s",), 362 * T),
    (("l40",), 181 * T),
    (("l4",), 121 * T),
    (("mi325x",), 1307 * T),
    (("mi300x",), 1307 * T),
    (("mi300a",), 981 * T),
    (("mi250x",), 383 * T),
)


def peak_flops(device_name: str | None) -> float | None:
    """The peak bf16 dense FLOP/s of the device called `device_name`, or None if not in the table."""
    if not device_name:
        return None
    words_of_name = set(re.split(r"[^a-z0-9]+", device_name.lower()))
    for words, peak in PEAKS:
        if all(word in words_of_name for word in words):
            return peak
    return None
