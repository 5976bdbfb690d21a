#!/usr/bin/env bash
# GPU machine: what the CUDA side of fusedattn relies on (driver, jax, where cuDNN and the CUDA
# runtime live and whether jax has them loaded). Prints facts only; changes nothing.
set -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 - <<'PY'
import glob, os, site, jax, jax.numpy as jnp
print("jax", jax.__version__, jax.devices())
x = jnp.ones((4, 4)); (x @ x).block_until_ready()
y = jax.nn.dot_product_attention(jnp.ones((1, 128, 2, 64), jnp.bfloat16), jnp.ones((1, 128, 2, 64), jnp.bfloat16), jnp.ones((1, 128, 2, 64), jnp.bfloat16), implementation="cudnn")
y.block_until_ready()
maps = open("/proc/self/maps").read()
libs = sorted({l.split()[-1] for l in maps.splitlines() if "cudnn" in l or "cudart" in l or "libcuda" in l})
print("loaded:", *libs, sep="\n  ")
for sp in site.getsitepackages():
    for pat in ("nvidia/*/lib/libcudnn.so*", "nvidia/*/lib/libcudart.so*", "nvidia/cu13/lib/*cudart*"):
        for f in glob.glob(os.path.join(sp, pat)):
            print("found:", f)
PY
