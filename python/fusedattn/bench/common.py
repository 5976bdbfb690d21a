"""What every benchmark shares: the timing method, peak memory, device ceilings, run info.

Method (docs/BENCH.md): random inputs, warm-up (compile, graph build) first, then N
back-to-back calls of the jitted function blocked once at the end (N so the total is
>= 50 ms), repeated; the median is reported. A single blocked call per timing would
add host overhead and under-report fast kernels.
"""

from __future__ import annotations

import datetime
import platform
import statistics
import time

import jax
import jax.numpy as jnp

import fusedattn


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _rss_reset_and_read() -> int:
    """Resets the RSS high-water mark (Linux clear_refs) and returns the current RSS in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kb("VmRSS") * 1024


def time_fn(fn, args, min_total_s=0.05, repeats=5, track_rss=False, hold_outputs=True):
    """Median seconds per call of a jitted fn, pipelined; and the peak extra host RSS in
    bytes during the timed calls when track_rss (CPU runs: what the kernels allocate
    internally counts too), else 0. hold_outputs=False drops each call's outputs as the
    next is queued and blocks on the last one (calls run in order on one device): for
    outputs so large that N of them would not fit in device memory (on a GPU, whose one
    stream runs the calls in order; XLA's CPU client may overlap independent calls, so
    CPU runs hold them)."""
    jax.block_until_ready(fn(*args))  # compile + warm
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    one = max(time.perf_counter() - t0, 1e-6)
    n = max(1, int(min_total_s / one))
    base = _rss_reset_and_read() if track_rss else 0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        if hold_outputs:
            outs = [fn(*args) for _ in range(n)]
        else:
            for _ in range(n):
                outs = fn(*args)
        jax.block_until_ready(outs)
        times.append((time.perf_counter() - t0) / n)
        del outs
    peak = max(0, _status_kb("VmHWM") * 1024 - base) if track_rss else 0
    return statistics.median(times), peak


def cpu_time_fn(fn, args, min_total_s=0.05, repeats=5):
    """Process CPU seconds per call (every thread of the process), the minimum over repeats.

    On a shared machine wall time swings with the other jobs' load; the CPU time a call
    consumes measures its work and stays steady, which is what a before/after comparison of
    the same kernel needs. It is not a latency: a call that runs on 2 threads for 10 ms
    reports about 20 ms."""
    jax.block_until_ready(fn(*args))
    t0 = time.process_time()
    jax.block_until_ready(fn(*args))
    n = max(1, int(min_total_s / max(time.process_time() - t0, 1e-6)))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(n):
            jax.block_until_ready(fn(*args))
        best = min(best, (time.process_time() - t0) / n)
    return best, 0


def copy_bandwidth(nbytes=1 << 30, repeats=5) -> float:
    """Device copy bandwidth in bytes/s, counting bytes read + written (x -> x + 1 in bf16)."""
    x = jax.random.normal(jax.random.PRNGKey(0), (nbytes // 2,), jnp.float32).astype(jnp.bfloat16)
    # ~70 held outputs of 1 GiB would not fit on a GPU.
    sec, _ = time_fn(jax.jit(lambda x: x + jnp.bfloat16(1)), (x,), repeats=repeats,
                     hold_outputs=jax.default_backend() == "cpu")
    return 2 * x.size * 2 / sec


def matmul_flops(n=8192, dtype=jnp.bfloat16, repeats=5) -> float:
    """Dense n^3 matmul rate in FLOP/s on random data."""
    ka, kb = jax.random.split(jax.random.PRNGKey(1))
    a = jax.random.normal(ka, (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(kb, (n, n), jnp.float32).astype(dtype)
    sec, _ = time_fn(jax.jit(jnp.matmul), (a, b), repeats=repeats)
    return 2.0 * n**3 / sec


def run_info() -> dict:
    """Device, date and versions: every result table starts with these."""
    return dict(date=datetime.date.today().isoformat(), jax=jax.__version__,
                fusedattn=fusedattn.__version__, backend=jax.default_backend(),
                device=str(jax.devices()[0].device_kind),
                cpu=platform.processor() or platform.machine(), threads=fusedattn.num_threads())
