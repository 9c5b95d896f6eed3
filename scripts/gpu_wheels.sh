#!/usr/bin/env bash
# Wheels the lent GPU machine lacks (its image has torch, jinja2, pyyaml, numpy,
# pytest, matplotlib, cuda-python and nvrtc, but no pydantic; pytest-xdist spreads the GPU tests
# over processes: TEST_N in scripts/gpu_run.sh), for Python 3.12 on x86-64,
# into .whl/ (ignored by git; carried to the device with `carry: [".whl"]`).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
dl() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$@"
}
dl "pydantic==$(.venv/bin/python -c 'import pydantic; print(pydantic.VERSION)')"
dl "pydantic-core==$(.venv/bin/python -c 'import pydantic_core; print(pydantic_core.__version__)')"
dl annotated-types typing-inspection typing-extensions pytest-xdist execnet
ls .whl
