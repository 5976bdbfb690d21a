#!/usr/bin/env bash
# Creates .venv (Python 3.10+) and installs fusedattn into it with its optional dependencies
# (test, demo). Two steps: the dependencies (pip, quiet), then the package, whose build
# (CMake through scikit-build-core: libfusedattn.so) prints its progress. On a machine without
# an NVIDIA GPU the build is the CPU engine only; FUSEDATTN_CUDA=ON builds the CUDA kernels too
# (CMakeLists.txt). When .venv already holds this exact source (a hash of the build inputs and
# FUSEDATTN_CUDA, stamped in .venv), nothing is reinstalled: scripts/test.sh after
# scripts/demo.sh reuses the main job's install.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
STAMP=.venv/fusedattn-source.sha256

source_hash() {
  { find CMakeLists.txt pyproject.toml cmake csrc python -type f \
      ! -path '*/__pycache__/*' ! -name '*.pyc' ! -name 'libfusedattn.so' -print0 |
      LC_ALL=C sort -z | xargs -0 sha256sum
    echo "FUSEDATTN_CUDA=${FUSEDATTN_CUDA:-AUTO}"
  } | sha256sum | cut -d' ' -f1
}

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
hash=$(source_hash)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$hash" ] &&
   .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('fusedattn') is None)"; then
  echo "setup: .venv already has this source installed (delete $STAMP to reinstall)"
  exit 0
fi
rm -f "$STAMP"

# CUDA kernels wanted: FUSEDATTN_CUDA=ON, or AUTO (unset) on a machine with an NVIDIA GPU.
cuda=0
case "${FUSEDATTN_CUDA:-AUTO}" in
  ON|on|1|TRUE|true) cuda=1 ;;
  AUTO|auto) if [ -e /dev/nvidia0 ] || nvidia-smi -L >/dev/null 2>&1; then cuda=1; fi ;;
esac

echo "setup: installing the dependencies into .venv (pip)"
.venv/bin/python -m pip install -q --upgrade pip
# pyproject.toml's dependencies, all its extras and its build requirements (the build runs in
# .venv, no isolated build environment: nothing is installed twice); the cudnn-frontend headers
# only when the CUDA kernels are built; cmake and ninja from PyPI only when the machine lacks them.
mapfile -t deps < <(FA_CUDA=$cuda .venv/bin/python - <<'PY'
import os, re, shutil, subprocess
try:
    import tomllib
except ImportError:  # Python 3.10: the copy pip vendors
    from pip._vendor import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    toml = tomllib.load(f)
project = toml["project"]
deps = project["dependencies"] + sum(project["optional-dependencies"].values(), [])
deps += [r for r in toml["build-system"]["requires"]
         if os.environ["FA_CUDA"] == "1" or not r.startswith("nvidia-cudnn-frontend")]
cmake = shutil.which("cmake")
version = re.search(r"(\d+)\.(\d+)", subprocess.run([cmake, "--version"], capture_output=True,
                                                    text=True).stdout) if cmake else None
if version is None or tuple(map(int, version.groups())) < (3, 24):
    deps.append("cmake>=3.24")
if not shutil.which("ninja"):
    deps.append("ninja")
print("\n".join(deps))
PY
)
.venv/bin/python -m pip install -q "${deps[@]}"

if [ "$cuda" = 1 ]; then what="CPU engine and CUDA kernels"; else
  what="CPU engine only: no NVIDIA GPU here; FUSEDATTN_CUDA=ON builds the CUDA kernels too"; fi
echo "setup: building and installing fusedattn ($what; CMake via scikit-build-core)"
t0=$(date +%s)
# -v shows the build's progress; the filter drops only pip's own bookkeeping lines.
if ! .venv/bin/python -m pip install --no-build-isolation --no-deps -v . 2>&1 |
     grep --line-buffered -v -e '^Using pip' -e '^Looking in links' -e 'Running command' -e 'Stored in directory'; then
  echo "setup: building fusedattn failed (its output is above)"
  exit 1
fi
.venv/bin/python -c "import fusedattn; print('setup: fusedattn', fusedattn.__version__, \
'with CUDA kernels:', fusedattn._lib.built_with_cuda())"
echo "setup: package built and installed in $(( $(date +%s) - t0 )) s"
echo "$hash" > "$STAMP"
