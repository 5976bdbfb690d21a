# Sourced by the GPU scripts: installs the carried wheel (.whl/, built on the CPU machine
# with `python -m pip wheel . --no-deps -w .whl -C cmake.define.FUSEDATTN_CUDA=ON`: without
# the flag a machine with no GPU builds the CPU engine only) or builds in place, into a fresh
# directory on PYTHONPATH; sets PY and writes the device line to $OUT/device.txt. A library
# without the CUDA kernels is an error here.
PY=${PYTHON:-python3}
SITE=${FUSEDATTN_SITE:-/tmp/fusedattn-site}  # a second script running at once takes its own
rm -rf "$SITE"
if ls .whl/fusedattn-*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" .whl/fusedattn-*.whl || exit 1
  # The Python sources of this tree win over the wheel's (a wheel built before a
  # Python-only change still carries the right library).
  (cd python && find fusedattn -name '*.py' -exec cp --parents {} "$SITE/" \;)
else
  "$PY" -m pip install -q --no-build-isolation --no-deps --target "$SITE" . || exit 1
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
"$PY" -c "import jax, fusedattn; print('jax', jax.__version__, jax.devices(), 'fusedattn', fusedattn.__version__, fusedattn.__file__)" | tee -a "$OUT/device.txt"
"$PY" -c "import sys, fusedattn; sys.exit(not fusedattn._lib.built_with_cuda())" || {
  echo "gpu_env: this libfusedattn.so has no CUDA kernels: build the wheel with" \
       "python -m pip wheel . --no-deps -w .whl -C cmake.define.FUSEDATTN_CUDA=ON" | tee -a "$OUT/device.txt"
  exit 1
}
