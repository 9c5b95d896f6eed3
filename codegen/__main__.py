"""Command line: ``python -m codegen {check,generate,list,show,report}``.

Errors in specs print ``file:line: field.path: message`` and how to fix it,
never a traceback, and exit with status 1."""

from __future__ import annotations

import argparse
import json
import sys

from .errors import SpecError


def _flags(pairs: list[str]) -> dict:
    """``name=value`` pairs of build parameters, values parsed as YAML scalars."""
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

    _, text = source(args.spec, args.target, tokens=args.tokens, **_flags(args.flag))
    sys.stdout.write(text)
    return 0


def cmd_report(args) -> int:
    from . import jit
    from .generate import review_builds
    from .lower import lower
    from .render import render
    from .spec import load_spec

    rows = []
    for rb in review_builds([args.spec] if args.spec else None):
        if args.target and rb.target != args.target:
            continue
        ir = lower(load_spec(rb.spec), rb.build)
        for rep in jit.resource_report(render(ir), rb.path.name, ir.target):
            rows.append({
                "build": rb.path.name, "target": rb.target, "kernel": rep.name, "vgprs": rep.vgprs,
                "agprs": getattr(rep, "agprs", 0), "sgprs": rep.sgprs, "lds_bytes": ir.lds_bytes,
                "scratch_bytes": rep.scratch_bytes, "spills": rep.spills, "mma": rep.mfma,
                "mailbox_bytes": ir.scratch_bytes,
            })
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'build':40s} {'regs':>5s} {'sgpr':>5s} {'LDS':>7s} {'spill':>5s} {'stack':>6s}  MMA opcodes")
    for r in rows:
        mma = ", ".join(f"{k} x{v}" for k, v in sorted(r["mma"].items()))
        print(f"{r['build']:40s} {r['vgprs']:5d} {r['sgprs'] or 0:5d} {r['lds_bytes']:7d} {r['spills']:5d} "
              f"{r['scratch_bytes']:6d}  {mma}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m codegen", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="validate spec files")
    p.add_argument("specs", nargs="+")
    p.set_defaults(fn=cmd_check)
    p = sub.add_parser("generate", help="render every review build into generated/")
    p.set_defaults(fn=cmd_generate)
    p = sub.add_parser("list", help="specs, build parameters, review builds")
    p.set_defaults(fn=cmd_list)
    p = sub.add_parser("show", help="print the generated source of one build")
    p.add_argument("spec")
    p.add_argument("--target", default="sm90")
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("flag", nargs="*", help="build parameters as name=value")
    p.set_defaults(fn=cmd_show)
    p = sub.add_parser("report", help="registers, LDS, spills, MMA opcodes of the review builds (no GPU)")
    p.add_argument("spec", nargs="?")
    p.add_argument("--target")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_report)
    args = parser.parse_args(argv)
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
