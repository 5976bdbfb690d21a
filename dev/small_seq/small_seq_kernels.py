"""Runs one small-seq forward+backward (the bench's THD call, B = 30720 segments, H = 8,
bf16) so a profiler can list its kernels, e.g. on the GPU machine:
  ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,\
dram__bytes_write.sum --csv python dev/small_seq/small_seq_kernels.py --dim 128 --skv 4
The first call compiles and warms; the kernels of the second are the ones to read."""

import argparse

import jax

from fusedattn.bench.small_seq import impl_fns, make_inputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--skv", type=int, default=4)
    ap.add_argument("--batch", type=int, default=30720)
    args = ap.parse_args()
    q, k, v, dout = make_inputs(args.batch, args.skv, 8, args.dim, jax.numpy.bfloat16)
    fn, sd = impl_fns(args.batch, args.skv, 8, args.dim)["small_seq_thd"]

    @jax.jit
    def fwd_bwd(q, k, v, dout):
        out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, sd), q, k, v)
        return out, vjp(dout)

    for _ in range(2):
        jax.block_until_ready(fwd_bwd(q, k, v, dout))


if __name__ == "__main__":
    main()
