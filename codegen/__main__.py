"""The mono-codegen command line: ``python -m codegen COMMAND`` or ``mono-codegen COMMAND``.

Commands: check, generate, list, show, report, diff, rolemap, trace, precompile, docs.

Errors in specs print ``file:line: field.path: message`` and how to fix it,
never a traceback, and exit with status 1."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .errors import SpecError


def name_values(pairs: list[str]) -> dict:
    """``name=value`` pairs (build parameters, ``stage.field`` tune overrides), values parsed
    as YAML (scalars or flow mappings); shared with the probe scripts."""
    import yaml

    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"error: build flag {pair!r} must look like name=value (e.g. timeline=true)")
        out[name] = yaml.safe_load(value)
    return out


def cmd_check(args) -> int:
    from .spec import load_spec_file

    status = 0
    for path in args.specs:
        try:
            loaded = load_spec_file(path)
        except SpecError as e:
            print(e, file=sys.stderr)
            status = 1
            continue
        # every target x review build must lower too (budgets, placement, deadlocks)
        from .lower import lower, make_build
        from .targets import TARGETS

        try:
            for target in TARGETS:
                for values in loaded.spec.review_builds or [{}]:
                    lower(loaded, make_build(loaded, target, **values))
        except SpecError as e:
            print(e, file=sys.stderr)
            status = 1
            continue
        print(f"{path}: ok ({loaded.spec.kernel}: {len(loaded.spec.stages)} stages, {len(loaded.spec.abi)} arguments)")
    return status


def cmd_generate(args) -> int:
    from .generate import ROOT, generate

    def progress(i, n, rb):
        if sys.stdout.isatty():
            print(f"\r[{i}/{n}] {rb.path.relative_to(ROOT)}".ljust(78), end="", flush=True)

    written, removed = generate(progress=progress)
    if sys.stdout.isatty():
        print()
    for p in written:
        print(f"wrote {p.relative_to(ROOT)}")
    for p in removed:
        print(f"removed {p.relative_to(ROOT)}")
    if not written and not removed:
        print("generated/ is up to date")
    return 0


def cmd_list(args) -> int:
    from .generate import ROOT, review_builds
    from .spec import load_spec, spec_names

    for name in spec_names():
        spec = load_spec(name).spec
        print(f"{name}: {spec.doc.strip().splitlines()[0]}")
        for pname, p in spec.params.items():
            print(f"  {pname:10s} {p.type:5s} default {p.default!r:8} values {p.values!r}  {p.doc}")
        for rb in review_builds([name]):
            print(f"  review: {rb.path.relative_to(ROOT)}")
    return 0


def cmd_show(args) -> int:
    from .render import source

    _, text = source(args.spec, args.target, tune=_tune(args), tokens=args.tokens, **name_values(args.flag))
    sys.stdout.write(text)
    return 0


def cmd_report(args) -> int:
    from .review import format_report, report_rows

    rows = report_rows([args.spec] if args.spec else None, args.target)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        sys.stdout.write(format_report(rows))
    return 0


def _build_params(args, extra: list[str] | None = None) -> dict:
    """The build parameters of a command: ``--tokens``, the common flags, then ``extra``."""
    params = {"tokens": args.tokens} if getattr(args, "tokens", None) is not None else {}
    params.update(name_values(args.flag))
    params.update(name_values(extra or []))
    return params


def cmd_diff(args) -> int:
    from .generate import ROOT

    here = os.getcwd()
    os.chdir(ROOT)  # specs load with paths relative to the working folder: render as generate does
    try:
        return _diff(args)
    finally:
        os.chdir(here)


def _diff(args) -> int:
    from .review import diff_builds, diff_rev, format_changes

    if args.rev:
        if args.a or args.b or args.target_a or args.target_b:
            raise SystemExit("error: --rev diffs the review builds against a revision; "
                             "leave out --a/--b/--target-a/--target-b")
        text, changes = diff_rev(args.rev, [args.spec] if args.spec else None, context=args.unified)
        if args.stat:
            sys.stdout.write(format_changes(args.rev, changes))
        else:
            sys.stdout.write(text)
            sys.stderr.write(format_changes(args.rev, changes))
        return 1 if args.exit_code and changes else 0
    if not args.spec:
        raise SystemExit("error: diff needs a spec (diff SPEC --a tokens=1 --b tokens=4), or --rev REV")
    target = args.target or "sm90"
    text = diff_builds(args.spec, _build_params(args, args.a), _build_params(args, args.b),
                       args.target_a or target, args.target_b or target, args.unified)
    sys.stdout.write(text)
    if not text:
        print("the two builds render the same source", file=sys.stderr)
    return 1 if args.exit_code and text else 0


def cmd_rolemap(args) -> int:
    from .lower import lower, make_build
    from .rolemap import plot_rolemap, short_label, summary
    from .spec import load_spec, tune_items

    loaded = load_spec(args.spec, tune_items(_tune(args)))
    ir = lower(loaded, make_build(loaded, args.target, **_build_params(args)))
    out = args.output or f"rolemap-{ir.name}.{ir.target.name}.{short_label(ir)}.png"
    for line in summary(ir):
        print(line)
    try:
        print(f"wrote {plot_rolemap(ir, out)}")
    except RuntimeError as e:  # no matplotlib
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_trace(args) -> int:
    import importlib

    from .generate import build_label
    from .spec import load_spec
    from .trace import trace

    params = _build_params(args)
    params.pop("timeline", None)
    make_args = None
    if args.case:
        module, _, fn = args.case.partition(":")
        if not fn:
            raise SystemExit("error: --case must look like module:function (e.g. tests.minimax_case:trace_args)")
        make_args = getattr(importlib.import_module(module), fn)
    loaded = load_spec(args.spec)
    if args.output:
        out = args.output
    else:
        from .lower import make_build

        label = build_label(loaded, make_build(loaded, args.target or "sm90", **params, timeline=True))
        out = f"trace-{loaded.spec.c_name}.{label}"
    try:
        written = trace(args.spec, out, target=args.target, seed=args.seed, make_args=make_args,
                        dims={k: int(v) for k, v in name_values(args.dim).items()}, tune=_tune(args), **params)
    except RuntimeError as e:  # no GPU, no matplotlib
        print(f"error: {e}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


def cmd_precompile(args) -> int:
    """Every --tokens build of SPEC compiled into the JIT cache by parallel processes."""
    import time

    from .jit.cache import cache_dir
    from .launch import PrecompileError, precompile

    try:
        tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"error: --tokens {args.tokens!r}: a comma-separated list of row counts, e.g. 1,2,4,8,16")
    flags = name_values(args.flag)
    tune = _tune(args)
    builds = [dict(name=args.spec, target=args.target, tokens=t, tune=tune, **flags) for t in tokens]
    t0 = time.perf_counter()
    results = precompile(builds, workers=args.workers, errors="keep")
    failed = [r for r in results if isinstance(r, PrecompileError)]
    for r in results:
        print(f"error: {r}" if isinstance(r, PrecompileError) else f"compiled {args.spec} [{args.target} {r}]",
              file=sys.stderr if isinstance(r, PrecompileError) else sys.stdout)
    print(f"{len(results) - len(failed)} of {len(results)} builds in {cache_dir()} ({time.perf_counter() - t0:.1f} s)")
    return 1 if failed else 0


def cmd_docs(args) -> int:
    from .docs import SPEC_REFERENCE, spec_reference, write_spec_reference

    rel = SPEC_REFERENCE.relative_to(SPEC_REFERENCE.parents[1])
    if args.check:
        current = SPEC_REFERENCE.exists() and SPEC_REFERENCE.read_text() == spec_reference()
        print(f"{rel} is {'up to date' if current else 'stale: run python -m codegen docs'}")
        return 0 if current else 1
    print(f"wrote {rel}" if write_spec_reference(SPEC_REFERENCE) else f"{rel} is up to date")
    return 0


def _build_arguments(p, target: str | None, target_help: str | None = None) -> None:
    """The arguments that name one build: SPEC, name=value flags, --target, --tokens, --tune."""
    p.add_argument("spec")
    p.add_argument("flag", nargs="*", help="build parameters as name=value")
    p.add_argument("--target", default=target, help=target_help)
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--tune", action="append", default=[], metavar="STAGE.FIELD=VALUE",
                   help="override a stage field of the spec (a tuning knob) for this build, e.g. "
                        "qkv.bulk_copies=0 or 'qkv.token_tile={default: 8}', or a symbol "
                        "(symbols.INLINE_NORM_TOKENS=4); repeatable")


def _tune(args) -> dict | None:
    """The --tune overrides of a command, values parsed as YAML (scalars or flow mappings)."""
    return name_values(getattr(args, "tune", None) or []) or None


def main(argv: list[str] | None = None) -> int:
    prog = "mono-codegen" if os.path.basename(sys.argv[0]) == "mono-codegen" else "python -m codegen"
    parser = argparse.ArgumentParser(prog=prog, description="Mono kernels from YAML specs: check, render, review, run.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="validate spec files")
    p.add_argument("specs", nargs="+")
    p.set_defaults(fn=cmd_check)
    p = sub.add_parser("generate", help="render every review build into generated/")
    p.set_defaults(fn=cmd_generate)
    p = sub.add_parser("list", help="specs, build parameters, review builds")
    p.set_defaults(fn=cmd_list)
    p = sub.add_parser("show", help="print the generated source of one build")
    _build_arguments(p, target="sm90")
    p.set_defaults(fn=cmd_show)
    p = sub.add_parser("report", help="registers, LDS, spills, co-residency, mailbox bytes, MMA opcodes "
                                      "of the review builds (no GPU)")
    p.add_argument("spec", nargs="?")
    p.add_argument("--target")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser("diff", allow_abbrev=False,
                       help="unified diff of generated source: two builds, two targets, or the tree vs a git revision",
                       description="diff SPEC --a tokens=1 --b tokens=4 | diff SPEC --target-a sm90 --target-b gfx950 "
                                   "| diff [SPEC] --rev HEAD~1")
    p.add_argument("spec", nargs="?")
    p.add_argument("flag", nargs="*", help="build parameters of both sides, as name=value")
    p.add_argument("--a", nargs="+", action="extend", default=[], metavar="NAME=VALUE", help="build A's parameters")
    p.add_argument("--b", nargs="+", action="extend", default=[], metavar="NAME=VALUE", help="build B's parameters")
    p.add_argument("--target", help="target of both sides (default sm90)")
    p.add_argument("--target-a")
    p.add_argument("--target-b")
    p.add_argument("--tokens", type=int)
    p.add_argument("--rev", help="diff the review builds rendered now against generated/ at this git revision")
    p.add_argument("--stat", action="store_true", help="with --rev: list the changed files only")
    p.add_argument("-U", "--unified", type=int, default=3, metavar="N", help="lines of context (default 3)")
    p.add_argument("--exit-code", action="store_true", help="exit with 1 when there are differences")
    p.set_defaults(fn=cmd_diff)
    p = sub.add_parser("rolemap", help="PNG of which CTA runs which task of which stage (no GPU)")
    _build_arguments(p, target="sm90")
    p.add_argument("-o", "--output", help="PNG path (default rolemap-<kernel>.<target>.<build>.png)")
    p.set_defaults(fn=cmd_rolemap)
    p = sub.add_parser("trace", help="launch a timeline=true build on the GPU: Perfetto trace JSON and a PNG")
    _build_arguments(p, target=None, target_help="default: the GPU's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--case", metavar="MODULE:FUNCTION",
                   help="function(kernel, seed) -> launch arguments (default: random ones from the ABI)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a runtime dimension for the random arguments (default 1)")
    p.add_argument("-o", "--output", help="path prefix of <prefix>.json and <prefix>.png")
    p.set_defaults(fn=cmd_trace)
    p = sub.add_parser("precompile", help="compile builds into the JIT cache ahead, in parallel (no GPU)",
                       description="precompile SPEC --target sm90 --tokens 1,2,4,8,16 [name=value ...]: each row "
                                   "count's build compiled into $MONO_CACHE_DIR (default ~/.cache/mono-codegen), "
                                   "so that its first launch only loads it")
    p.add_argument("spec")
    p.add_argument("flag", nargs="*", help="build parameters of every build, as name=value")
    p.add_argument("--target", required=True, help="sm90, gfx942 or gfx950")
    p.add_argument("--tokens", default="1", help="row counts, comma-separated (default 1)")
    p.add_argument("--tune", action="append", default=[], metavar="STAGE.FIELD=VALUE",
                   help="override a stage field of the spec for every build; repeatable")
    p.add_argument("--workers", type=int, help="processes (default: one per CPU)")
    p.set_defaults(fn=cmd_precompile)
    p = sub.add_parser("docs", help="write docs/spec-reference.md from the spec models")
    p.add_argument("--check", action="store_true", help="only say whether the file is current (exit 1 if not)")
    p.set_defaults(fn=cmd_docs)
    # build flags may follow options (`show SPEC --tokens 4 timeline=true`): argparse leaves them over
    args, rest = parser.parse_known_args(argv)
    if rest and hasattr(args, "flag") and all("=" in r and not r.startswith("-") for r in rest):
        args.flag = [*args.flag, *rest]
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args.fn(args)
    except SpecError as e:
        print(e, file=sys.stderr)
        return 1
    except ValueError as e:  # bad build parameters, unknown spec or target
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
