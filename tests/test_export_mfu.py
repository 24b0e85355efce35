"""`otel_train.export.mfu` and `peak_flops`: MFU's arithmetic with a peak the test chooses."""

from __future__ import annotations

import pytest

from otel_train import semconv
from otel_train.export.mfu import Mfu
from otel_train.export.peak_flops import peak_flops


def test_mfu_is_flops_over_time_over_peak() -> None:
    mfu = Mfu(flops_per_step=3e12, peak=1e13)
    assert mfu.of(mfu.flops({}), 0.5) == pytest.approx(0.6)  # 3e12 / 0.5 s / 1e13
    assert mfu.of(mfu.flops(None), 0.0) is None  # no time, no ratio


def test_a_steps_own_flops_win_then_the_setting_then_6_n_tokens() -> None:
    mfu = Mfu(peak=1e12)
    assert mfu.flops({semconv.TRAIN_TOKENS: 1000}) is None  # no parameter count yet
    mfu.parameters = 2_000_000
    assert mfu.flops({semconv.TRAIN_TOKENS: 1000}) == 6 * 2_000_000 * 1000
    assert mfu.of(mfu.flops({semconv.TRAIN_TOKENS: 1000}), 0.1) == pytest.approx(0.12)
    assert mfu.flops({semconv.TRAIN_TOKENS: 1000, semconv.TRAIN_FLOPS: 5e9}) == 5e9
    assert Mfu(flops_per_step=7e9).flops({semconv.TRAIN_TOKENS: 1000}) == 7e9
    assert mfu.flops({semconv.TRAIN_TOKENS: True}) is None  # a bool is no count


def test_the_peak_comes_from_the_device_name_unless_set() -> None:
    mfu = Mfu(flops_per_step=1e12)
    assert mfu.of(1e12, 1.0) is None  # on the CPU: no peak, no MFU
    mfu.device("NVIDIA H100 80GB HBM3")
    assert mfu.peak == 989e12
    overridden = Mfu(flops_per_step=1e12, peak=5e14)
    overridden.device("NVIDIA H100 80GB HBM3")
    assert overridden.peak == 5e14  # OTEL_TRAIN_PEAK_FLOPS wins over the table
    unknown = Mfu()
    unknown.device("Some Future Accelerator")
    assert unknown.peak is None


@pytest.mark.parametrize(("name", "peak"), [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A100 80GB PCIe", 312e12),
    ("NVIDIA L4", 121e12), ("NVIDIA L40S", 362e12), ("AMD Instinct MI300X", 1307e12), ("Tesla T4", None),
    ("", None), (None, None)])
def test_the_table_knows_the_common_accelerators_by_torchs_name(name: str | None, peak: float | None) -> None:
    assert peak_flops(name) == peak
