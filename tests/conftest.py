"""Shared pytest fixtures for the otel_train test suite."""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# tests/ is not a package: make its helpers (`support.otlp_receiver`, ...) importable, and the
# repository's `benchmarks/` (not installed) for the tests of the research tools.
_TESTS_DIR = str(Path(__file__).resolve().parent)
for _path in (_TESTS_DIR, str(Path(_TESTS_DIR).parent)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from support.harness import Harness  # noqa: E402
from support.otlp_receiver import OTLPReceiver  # noqa: E402


# --- Tiers: `python -m pytest -m "not slow"` before a commit, the whole suite in CI ----------------
#: What starts another process: a Python or torchrun subprocess, a fault run, torch or Python
#: multiprocessing, Ray, a browser. A test is `slow` when its body, a fixture it uses or a function
#: of its module that either calls (followed by name) says one of these: marked at collection, so
#: a new test is put in its tier by what it does, not by a list to keep.
_PROCESS_WORDS = r"torchrun|subprocess|Popen|chromium|multiprocessing|mp\.spawn|ray\.init|import ray"


def _support_helpers_that_start_processes() -> list[str]:
    """The names `tests/support` defines whose code says one of `_PROCESS_WORDS` (`run_python`,
    `TrainingRun`, `run_script`, ...): a test calling one starts a process."""
    import ast

    names = []
    for path in Path(__file__).resolve().parent.joinpath("support").glob("*.py"):
        source = path.read_text()
        for node in ast.parse(source).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and \
                    re.search(_PROCESS_WORDS, ast.get_source_segment(source, node) or ""):
                names.append(node.name)
    return names


_STARTS_PROCESSES = re.compile(r"\b(" + "|".join([_PROCESS_WORDS, *_support_helpers_that_start_processes()]) + r")\b")

#: In-process tests that take over 5 s even so (measured 2026-11-28 on the 2-core machine at load
#: 9: 11-23 s each), in the full tier too.
_LONG = {"test_the_c_notes_hold_nothing_the_python_ones_do_not", "test_fetch_matches_the_python_body",
         "test_train_activity_matches_the_python_function", "test_exits_as_it_does_without_instrumentation"}


def _starts_processes(obj: Any, namespace: dict[str, Any], seen: set[int]) -> bool:
    obj = getattr(obj, "__wrapped__", obj)
    if id(obj) in seen:
        return False
    seen.add(id(obj))
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        return False
    if _STARTS_PROCESSES.search(source):
        return True
    for name in set(re.findall(r"\b([A-Za-z_]\w*)\(", source)):
        called = namespace.get(name)
        if (inspect.isfunction(called) or inspect.isclass(called)) and called.__module__ == namespace["__name__"]:
            if _starts_processes(called, namespace, seen):
                return True
    return False


#: Where torch is not installed (`.ci/compat`'s legs on other Pythons), the test modules that import
#: it, detection, or a framework are not collected: the rest of the suite runs without torch.
_NEEDS_TORCH = re.compile(r"^\s*(import torch|from torch|import lightning|import transformers|from otel_train\.(detect|bench|lightning|hf)\b"
                          r"|from otel_train import (detect|lightning|hf)\b|import otel_train\.(auto|detect)|torch = pytest\.importorskip)",
                          re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    import importlib.util

    if importlib.util.find_spec("torch") is None and _NEEDS_TORCH.search(collection_path.read_text()):
        return True
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: starts processes (the full tier); `-m \"not slow\"` is the fast tier")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not isinstance(item, pytest.Function) or item.get_closest_marker("slow"):
            continue
        namespace = vars(item.module)
        seen: set[int] = set()
        fixtures = [fixturedef.func for defs in item._fixtureinfo.name2fixturedefs.values() for fixturedef in defs
                    if getattr(fixturedef.func, "__module__", None) == namespace["__name__"]]
        if item.originalname in _LONG or any(_starts_processes(f, namespace, seen) for f in (item.function, *fixtures)):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OTLPReceiver]:
    """A started in-process OTLP receiver (gRPC + HTTP), shared by the session."""
    receiver = OTLPReceiver().start()
    try:
        yield receiver
    finally:
        receiver.close()


@pytest.fixture
def fresh_receiver(otlp_receiver: OTLPReceiver) -> Iterator[OTLPReceiver]:
    """The session receiver, emptied of everything received before this test."""
    otlp_receiver.clear()
    yield otlp_receiver


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    """A receiver of the test's own (its own ports), closed after it: for tests that stall or
    stop it, or must see only what their run sent."""
    rec = OTLPReceiver().start()
    try:
        yield rec
    finally:
        rec.close()


@pytest.fixture(autouse=True)
def _no_otel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """In-process tests start from a clean slate: no OTEL_* / torchrun variables, no live session."""
    import os

    for key in list(os.environ):
        if key.startswith("OTEL_") or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK",
                                               "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                                               "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "MASTER_PORT",
                                               "MASTER_ADDR"):
            monkeypatch.delenv(key, raising=False)
    yield
    from otel_train import _runtime
    from otel_train.record import span

    _runtime.shutdown(0.5)
    span.set_disabled(False)  # a disabled session leaves `otel_train.span` the no-op until the next init


@pytest.fixture
def harness() -> Harness:
    return Harness()
