"""The spec layer: pydantic models of a kernel spec, loaded from YAML with
line numbers (``load_spec``, ``parse_spec``).

Names are resolved lazily: the stage kinds (``codegen.stages``) build on
``codegen.spec.models``, and ``KernelSpec`` builds on the stage kinds."""

from importlib import import_module

_EXPORTS = {
    "SpecError": "..errors",
    "SpecIssue": "..errors",
    "KernelSpec": ".kernel",
    "LoadedSpec": ".load",
    "load_spec": ".load",
    "load_spec_file": ".load",
    "parse_spec": ".load",
    "spec_names": ".load",
    "spec_path": ".load",
    "tune_items": ".load",
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module 'codegen.spec' has no attribute {name!r}")
