"""probe.py's float32 timing alone (no correctness pass): source scripts/gpu_env.sh && $PY dev/cuda_flash/bench_f32.py"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import probe  # noqa: E402

probe.bench()
