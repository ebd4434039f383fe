"""`pretrain`: the command line of pretrain-pipeline.

    pretrain presets                                 list the presets
    pretrain validate PRESET_OR_FILE [--set k=v]...  validate and print the resolved spec
    pretrain run PRESET_OR_FILE [--set k=v]...       run the pretrain flow
    pretrain plan PRESET_OR_FILE [--set k=v]...      each stage's key and output: run or reuse, and why
    pretrain render PRESET_OR_FILE --out DIR         write every file a run would launch
    pretrain stack up|down|status|reset|env          the local Slurm + S3 + Prefect stack
    pretrain demo [--inputs-only] [--set k=v]...     the whole pipeline on tiny-local, set up here
"""

from __future__ import annotations

import argparse
import json
import sys

import yaml


def _presets(_: argparse.Namespace) -> int:
    from pretrain.presets import list_presets, load_spec

    for name in list_presets():
        spec = load_spec(name)
        print(f"{name:24} {spec.backend.kind:12} {spec.model.family:6} "
              f"{spec.cluster.nodes} x {spec.cluster.devices_per_node} devices")
    return 0


def _validate(args: argparse.Namespace) -> int:
    print(yaml.safe_dump(json.loads(args.loaded.model_dump_json()), sort_keys=False), end="")
    return 0


def _run(args: argparse.Namespace) -> int:
    from prefect.exceptions import CancelledRun

    from flows.pretrain import pretrain

    try:
        result = pretrain(preset=args.spec, overrides=args.set)
    except CancelledRun as cancelled:
        print(f"pretrain run: cancelled: {cancelled}", file=sys.stderr)
        return 130
    print(json.dumps(result, indent=2))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from flows.plan import checkpoint_advice, plan, plan_table

    advice = checkpoint_advice(args.loaded)
    try:
        print(plan_table(plan(args.loaded)))
    finally:  # the advice needs no stage's inputs: printed also when one cannot be read
        print("\n" + "\n".join(advice))
    return 0


def _render(args: argparse.Namespace) -> int:
    from pathlib import Path

    from flows.dry_run import render_files, write_files

    files = render_files(args.loaded)
    write_files(files, Path(args.out))
    print("\n".join(f"{args.out}/{name}" for name in sorted(files)))
    return 0


def _stack(args: argparse.Namespace) -> int:
    from deployments import stack

    return stack.main(args.rest)


def _demo(args: argparse.Namespace) -> int:
    from deployments.demo import main

    return main(inputs_only=args.inputs_only, overrides=args.set)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pretrain", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("presets", help="list the presets").set_defaults(fn=_presets)
    for name, fn, text in (("validate", _validate, "validate and print the resolved spec"),
                           ("run", _run, "run the pretrain flow"),
                           ("plan", _plan, "each stage's key and output, whether it would run or be reused, "
                                           "and why; submits nothing"),
                           ("render", _render, "write every file a run would launch, submit nothing")):
        p = sub.add_parser(name, help=text)
        p.add_argument("spec", help="a preset name or a spec YAML file")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a field, e.g. --set parallel.tp=8 (repeatable)")
        if name == "render":
            p.add_argument("--out", required=True, help="directory for the rendered files")
        p.set_defaults(fn=fn)
    p = sub.add_parser("stack", help="the local Slurm + S3 + Prefect stack", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=_stack)
    p = sub.add_parser("demo", help="run the pipeline on tiny-local, end to end")
    p.add_argument("--inputs-only", action="store_true",
                   help="set up tiny-local's corpus, credentials block and tokenizer, run nothing")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of tiny-local, e.g. --set training.train_steps=40 (repeatable)")
    p.set_defaults(fn=_demo)
    args = parser.parse_args(argv)
    from deployments.ephemeral import configure_ephemeral_server

    configure_ephemeral_server()  # before anything imports Prefect, whose settings it changes
    if hasattr(args, "spec"):
        from pretrain.presets import SpecError, load_spec

        try:  # a bad spec fails here, before Prefect or Slurm are touched, with the field named
            args.loaded = load_spec(args.spec, args.set)
        except SpecError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    try:
        return args.fn(args)
    except Exception as exc:
        # A source, credentials block or Hub reference that cannot be read as the spec asks (a Secret
        # block not saved, a gated repository) is bad input too, and its message names the field and
        # the fix; anything else is a bug and keeps its traceback. Imported here: validate needs none
        # of the transfer engine.
        from pretrain.transfer import FetchError

        if not isinstance(exc, FetchError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
