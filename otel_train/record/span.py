"""`otel_train.span`: one factory for the life of the process, whatever mode it is in.

`otel_train.span` is the region class (`recorder.Region`: the C one where built) and stays it:
`from otel_train import span` before `init()` and `otel_train.span` after it are the same
object, and so are functions decorated with it at import. What a call makes depends on the
mode, which the class reads itself, set here (in C: one pointer compare a region):

- enabled, no device to time: a `Region`;
- device timing has chosen an accelerator, or may yet find one: a `device._DeviceRegion`,
  which also records device events (`set_device_region`, by `device`);
- disabled (`OTEL_SDK_DISABLED`, `init(disabled=True)`): the shared no-op `NOOP` (the
  pure-Python regions: a region that behaves as it), by `set_disabled` from `_runtime`.
"""

from __future__ import annotations

from otel_train.record import recorder
from otel_train.record.recorder import NOOP

__all__ = ["NOOP", "set_disabled", "disabled", "set_device_region", "device_region"]

_disabled = False
_device_region: type | None = None


def set_disabled(flag: bool) -> None:
    """Disabled: every `otel_train.span(...)` is `NOOP` (the pure-Python regions: one that
    behaves as it)."""
    global _disabled
    _disabled = flag
    _apply()


def disabled() -> bool:
    return _disabled


def set_device_region(cls: type | None) -> None:
    """`cls` (a `recorder.Region` subclass): what an enabled `otel_train.span(...)` makes; None:
    a plain `Region`."""
    global _device_region
    _device_region = cls
    _apply()


def device_region() -> type | None:
    """The region class device timing asked for, or None (plain regions)."""
    return _device_region


def _apply() -> None:
    recorder.set_span_target(NOOP if _disabled else _device_region)
