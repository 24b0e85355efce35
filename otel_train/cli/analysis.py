"""`otel-train diagnose`, `report` and `export`: the commands that read a run's spans (`otel_train.analyze`).

    otel-train diagnose PATH [--json]                  stragglers, clock skew, slow steps, goodput
    otel-train report PATH [-o report.html]            one self-contained HTML page
    otel-train export --format perfetto PATH [-o trace.json]   Chrome trace JSON (Perfetto, chrome://tracing)
    otel-train export --format jaeger PATH [-o jaeger.json]    Jaeger UI JSON, ranks and steps labelled

PATH: a run directory of the embedded default (`./otel-train/<run id>/`), its parent, one
`traces-rank<R>.jsonl`, or an OTLP JSON lines dump (`otel_train.analyze.reader`). Bad input exits 2
with one message on stderr naming the problem and what is accepted.

Each command imports the analysis it runs when it runs: `otel-train --help` imports none of it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

FORMATS = ("perfetto", "jaeger")


def add_parser(sub: Any) -> None:
    """Register the subcommands on `sub` (an `argparse` subparsers object)."""
    path_help = ("a run directory (./otel-train/<run id>/), its parent (the latest run is read), one "
                 "traces-rank<R>.jsonl, or an OTLP JSON lines dump")
    diag = sub.add_parser("diagnose", help="stragglers, clock skew, slow steps and goodput of a run",
                          description="Read a run's trace files and say where the time went.")
    diag.add_argument("path", help=path_help)
    run_help = "the run to read when PATH holds several (a receiver's dump): its ml.run.id"
    diag.add_argument("--run", help=run_help)
    diag.add_argument("--json", action="store_true", help="print JSON instead of text")
    report = sub.add_parser("report", help="one self-contained HTML page of a run (timeline, phases, goodput)",
                            description="Write an HTML report: verdict, Gantt of steps x ranks, phase chart, "
                                        "goodput. No network needed to view it.")
    report.add_argument("path", help=path_help)
    report.add_argument("--run", help=run_help)
    report.add_argument("-o", "--output", default="report.html", help="the HTML file to write (default report.html)")
    export = sub.add_parser("export", help="convert a run's spans for other viewers (Perfetto, Jaeger UI)",
                            description="Convert a run's spans: --format perfetto writes Chrome Trace Event "
                                        "JSON that ui.perfetto.dev and chrome://tracing open; --format jaeger "
                                        "writes Jaeger UI JSON with each rank a service and each step named, "
                                        "for Jaeger's JSON File upload.")
    export.add_argument("path", help=path_help)
    export.add_argument("--run", help=run_help)
    export.add_argument("--format", required=True, help="output format: perfetto or jaeger")
    export.add_argument("--steps", default=None, metavar="FIRST-LAST",
                        help="--format jaeger: only the traces of these steps (Jaeger UI loads a file whole in "
                             "the browser; a few thousand steps a file)")
    export.add_argument("-o", "--output", default=None,
                        help="the file to write (default trace.json, or jaeger.json for --format jaeger)")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the parsed subcommand; return its exit status."""
    from otel_train.analyze.reader import InputError

    try:
        if args.command == "diagnose":
            return _diagnose(args)
        if args.command == "report":
            return _report(args)
        if args.command == "export":
            return _export(args)
    except InputError as e:
        print(f"otel-train {args.command}: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"otel-train {args.command}: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    raise ValueError(f"not an analysis command: {args.command!r}")


def _note(d: Any) -> None:
    if d.note:
        print(f"otel-train: {d.note}", file=sys.stderr)


def _diagnose(args: argparse.Namespace) -> int:
    from otel_train.analyze.diagnose import analyse, to_json
    from otel_train.analyze.text import render

    d = analyse(args.path, run_id=args.run)
    _note(d)
    if args.json:
        json.dump(to_json(d), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(d))
    return 0


def _report(args: argparse.Namespace) -> int:
    from otel_train.analyze.diagnose import analyse
    from otel_train.analyze.report import write_report

    d = analyse(args.path, run_id=args.run)
    _note(d)
    size = write_report(d, args.output)
    print(f"otel-train report: wrote {args.output} ({size / 1024:.0f} KiB): {d.headline}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from otel_train.analyze.reader import InputError

    if args.format not in FORMATS:
        raise InputError(f"--format {args.format!r} is not a known format; use one of: {', '.join(FORMATS)}")
    from otel_train.analyze.diagnose import analyse

    d = analyse(args.path, run_id=args.run)
    _note(d)
    if args.format == "jaeger":
        from otel_train.analyze.jaeger import write_jaeger
        from otel_train.analyze.reader import find_sources

        from otel_train.analyze.jaeger import BIG_FILE_STEPS, parse_steps

        steps = parse_steps(args.steps) if args.steps is not None else None
        out = args.output or "jaeger.json"
        traces = write_jaeger(d, find_sources(args.path), out, run_id=args.run, steps=steps)
        what = f"steps {steps[0]}-{steps[1]} of {len(d.steps)}" if steps else "every step"
        print(f"otel-train export: wrote {out} ({traces} traces, {what}); in Jaeger UI: Search, JSON File, pick it")
        if steps is None and len(d.steps) > BIG_FILE_STEPS:
            print(f"otel-train export: {len(d.steps)} steps is more than Jaeger UI's upload handles well (it parses "
                  f"the file whole in the browser); export slices with --steps FIRST-LAST, e.g. --steps 0-1999")
        return 0
    from otel_train.analyze.perfetto import write_trace

    out = args.output or "trace.json"
    events = write_trace(d, out)
    print(f"otel-train export: wrote {out} ({events} trace events); open it in https://ui.perfetto.dev "
          f"or chrome://tracing")
    return 0
