"""`otel-train bench latency MODULE:FUNCTION`: forward and forward+backward latency of any model.

    otel-train bench latency mypkg.models:build --batch-size 8 --seq-len 512 [--vocab-size 32000]
    otel-train bench latency mypkg.models:build --input-shape 3,224,224
    otel-train bench latency mypkg.models:build --example batch.pt

FUNCTION (any callable, a class too; `a.b` reaches an attribute) is called with no argument
and returns an `nn.Module`, or a `(module, example_batch)` pair; an `nn.Module` instance there
is used as it is. Synthetic batches are built
from, in this order of precedence: `--example` (a file `torch.save`d, loaded with
`weights_only=True`), the factory's example batch, `--input-shape` (one float tensor, batch
dimension from `--batch-size`), or `--seq-len` token ids (below `--vocab-size`, by default the
first `nn.Embedding`'s size). The current directory is importable, as with `python -m`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from otel_train import semconv

_DTYPES = ("float32", "float16", "bfloat16")


def add_parser(bench_sub: Any) -> argparse.ArgumentParser:
    """Register `latency` under `otel-train bench`."""
    p = bench_sub.add_parser(
        "latency", help="forward and forward+backward latency of a model on synthetic batches",
        description="Time forward and forward+backward of FACTORY's model on synthetic batches: warm-up "
                    "batches, then timed ones (device events where there is a device, else host time). "
                    "Prints a table; --json writes the full result; spans and metrics go where the run's "
                    "telemetry goes (OTEL_* settings).")
    p.add_argument("factory", metavar="MODULE:FUNCTION",
                   help="a callable returning an nn.Module, or a (module, example batch) pair")
    p.add_argument("--batch-size", type=int, default=None, help="samples per batch (default 8, or the example's)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sample: batches of token ids")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="token ids are drawn below this (default: the model's first nn.Embedding size)")
    p.add_argument("--input-shape", default=None, metavar="D1,D2,...",
                   help="shape of one sample of a float input, e.g. 3,224,224 (batch dimension not included)")
    p.add_argument("--example", default=None, metavar="PATH", help="a torch.save'd example batch to imitate")
    p.add_argument("--warmup", type=int, default=10, help="untimed batches per phase first (default 10)")
    p.add_argument("--iters", type=int, default=50, help="timed batches per phase (default 50)")
    p.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:N, xpu, mps (default: cuda when available, else cpu)")
    p.add_argument("--dtype", choices=_DTYPES, default=None,
                   help="cast the model's floating parameters and float inputs (default: as built)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the full result (and every latency) here")
    p.set_defaults(latency_parser=p)  # `main` reports bad input with this parser's usage
    return p


class _BadInput(Exception):
    """A flag or the factory is wrong: one message, exit status 2."""


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        return _measure(args)
    except _BadInput as err:
        parser.error(str(err))  # prints usage and "error: ...", exits 2
        return 2


def _measure(args: argparse.Namespace) -> int:
    for flag, minimum in (("batch_size", 1), ("seq_len", 1), ("vocab_size", 1), ("warmup", 0), ("iters", 1)):
        value = getattr(args, flag)
        if value is not None and value < minimum:
            raise _BadInput(f"--{flag.replace('_', '-')} must be an integer >= {minimum} (got {value})")
    shape = _shape(args.input_shape)
    if shape is not None and args.seq_len is not None:
        raise _BadInput("--input-shape and --seq-len describe the input two ways: give one")
    import torch
    device = _device(args.device, torch)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    model, example = _build(args.factory, torch)
    if args.example is not None:
        example = _load_example(args.example, torch)
    if example is not None and shape is not None:
        raise _BadInput("--input-shape is for a model without an example batch; this one has one "
                        "(resize it with --batch-size / --seq-len)")
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    float_dtype = dtype or _float_dtype(model, torch)

    from otel_train.bench.synthetic import SyntheticBatches  # torch: imported when the command runs
    if example is not None:
        try:
            batches = SyntheticBatches.like(example, batch_size=args.batch_size, seq_len=args.seq_len,
                                            vocab_size=args.vocab_size, device=device, float_dtype=float_dtype)
        except ValueError as err:
            raise _BadInput(f"example batch: {err}") from None
    elif shape is not None:
        batches = SyntheticBatches.shaped((args.batch_size or 8, *shape), float_dtype, device)
    elif args.seq_len is not None:
        vocab = args.vocab_size or _embedding_size(model, torch)
        if vocab is None:
            raise _BadInput("--vocab-size is needed: the model has no nn.Embedding to take it from")
        batches = SyntheticBatches.tokens_of(args.batch_size or 8, args.seq_len, vocab, device)
    else:
        raise _BadInput("say what a batch looks like: --seq-len (token ids), --input-shape, --example, "
                        "or a factory returning (module, example batch)")

    import otel_train  # set up below, once the model and its batches are built
    from otel_train.bench import latency, latency_report
    # Exported from a thread unless OTEL_TRAIN_EXPORT_MODE says otherwise: the exporter process
    # would start up (an interpreter importing the SDK, a second or two of CPU) while the first
    # batches are timed, competing with them for cores. A benchmark's few hundred spans cost an
    # export thread next to nothing.
    otel_train.init(**({} if os.environ.get(semconv.ENV_EXPORT_MODE) else {"export_mode": "thread"}))
    try:
        result = latency.measure_latency(model, batches, warmup=args.warmup, iters=args.iters, device=device,
                                         span_attrs={latency.ATTR_MODEL: args.factory},
                                         extra={"model": args.factory})
    except ValueError as err:  # the model cannot be timed as asked (no grad, no output to backward from)
        raise _BadInput(str(err)) from None
    except Exception as err:  # noqa: BLE001 - the user's model on inputs the flags described
        shapes = ", ".join(f"{i['path']} {tuple(i['shape'])} {i['dtype']}" for i in batches.inputs)
        raise _BadInput(f"the model failed on a synthetic batch ({shapes}): {type(err).__name__}: "
                        f"{str(err).splitlines()[0] if str(err) else ''}") from None
    print(latency_report.format_table(result, args.factory))
    print()
    if args.json:
        print(f"json: {latency_report.write_json(result, args.json)}")
    sys.stdout.flush()
    otel_train.shutdown()  # says on stderr how many spans went where
    return 0


def _shape(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        dims = tuple(int(part) for part in text.split(","))
    except ValueError:
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise _BadInput(f"--input-shape {text!r}: expected positive integers separated by commas, e.g. 3,224,224")
    return dims


def _device(text: str | None, torch: Any) -> Any:
    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise _BadInput(f"--device {text!r}: expected cpu, cuda, cuda:N, xpu or mps") from None
    if device.type == "cpu":
        return device
    backend = getattr(torch, device.type, None)
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        raise _BadInput(f"--device {text}: torch sees no {device.type} device on this machine")
    count = getattr(backend, "device_count", None)
    if device.index is not None and count is not None and device.index >= count():
        raise _BadInput(f"--device {text}: only {count()} {device.type} device(s) here")
    return device


def _build(spec: str, torch: Any) -> tuple[Any, Any]:
    """Import MODULE, call FUNCTION: (module, example batch or None)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise _BadInput(f"factory {spec!r}: expected MODULE:FUNCTION, e.g. mypkg.models:build")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the user's own modules are importable
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            raise _BadInput(f"factory {spec!r}: no module named {err.name!r} (from {os.getcwd()})") from None
        raise _BadInput(f"factory {spec!r}: importing {module_name!r} failed: {err}") from None
    except Exception as err:  # noqa: BLE001 - the user's module may raise anything on import
        raise _BadInput(f"factory {spec!r}: importing {module_name!r} raised {type(err).__name__}: {err}") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise _BadInput(f"factory {spec!r}: {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if isinstance(target, torch.nn.Module):
        return target, None  # a module instance: used as it is
    if not callable(target):
        raise _BadInput(f"factory {spec!r}: {attr!r} is a {type(target).__name__}, not a callable")
    try:
        built = target()
    except Exception as err:  # noqa: BLE001 - the user's factory may raise anything
        raise _BadInput(f"factory {spec!r} raised {type(err).__name__}: {err}") from None
    example = None
    if isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], torch.nn.Module):
        built, example = built
    if not isinstance(built, torch.nn.Module):
        raise _BadInput(f"factory {spec!r} returned a {type(built).__name__}; expected an nn.Module "
                        "or a (module, example batch) pair")
    return built, example


def _load_example(path: str, torch: Any) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise _BadInput(f"--example {path}: no such file") from None
    except Exception as err:  # noqa: BLE001 - a corrupt or non-tensor file
        raise _BadInput(f"--example {path}: not a torch.save'd batch of tensors ({type(err).__name__}: "
                        f"{str(err).splitlines()[0] if str(err) else ''})") from None


def _float_dtype(model: Any, torch: Any) -> Any:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _embedding_size(model: Any, torch: Any) -> int | None:
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding):
            return int(m.num_embeddings)
    return None
