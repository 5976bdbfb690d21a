// Host side of the small-seq CUDA kernels: fills KernelArgs and dispatches on the
// head dim and dtype (the chunk size is dispatched in launch.cuh).
#include "fusedattn/small_seq/cuda/small_seq.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "fusedattn/small_seq/cuda/kernel_args.h"

namespace fusedattn::small_seq::cuda {

// The kernels of one (T, D) (launch.cuh), each instantiated in a translation unit of its
// own, generated from instance.cu.in by the list in CMakeLists.txt (head dim x dtype); a
// pair dispatched here and missing there fails the link.
template <class T, int D>
Status launch_typed(const KernelArgs& a, bool backward, cudaStream_t stream);

namespace {

KernelArgs common_args(const SmallSeqParams& p, const Segments& seg, int64_t heads_per_unit) {
  KernelArgs a{};
  a.qs = seg.q;
  a.kvs = seg.kv;
  // validate() keeps every count below 2^31.
  a.segments = static_cast<int32_t>(p.num_segments);
  a.units = static_cast<int32_t>(p.packs * p.num_segments * heads_per_unit);
  a.heads_q = static_cast<int32_t>(p.heads_q);
  a.heads_kv = static_cast<int32_t>(p.heads_kv);
  a.group = static_cast<int32_t>(p.heads_q / p.heads_kv);
  a.width = static_cast<int32_t>(p.max_seqlen_kv);
  a.mask = p.mask_type;
  a.scale = p.scale;
  return a;
}

template <int D>
Status launch_head_dim(int32_t dtype, const KernelArgs& a, bool backward, cudaStream_t stream) {
  switch (dtype) {
    case FA_BFLOAT16: return launch_typed<__nv_bfloat16, D>(a, backward, stream);
    case FA_FLOAT16: return launch_typed<__half, D>(a, backward, stream);
    case FA_FLOAT32: return launch_typed<float, D>(a, backward, stream);
  }
  return Status::Internal("small-seq: no kernel for dtype code " + std::to_string(dtype));
}

Status launch(const SmallSeqParams& p, const KernelArgs& a, bool backward, cudaStream_t stream) {
  switch (p.head_dim_qk) {
    case 64: return launch_head_dim<64>(p.dtype, a, backward, stream);
    case 128: return launch_head_dim<128>(p.dtype, a, backward, stream);
    case 256: return launch_head_dim<256>(p.dtype, a, backward, stream);
    case 512: return launch_head_dim<512>(p.dtype, a, backward, stream);
  }
  return Status::Internal("small-seq: no kernel for head dim " + std::to_string(p.head_dim_qk));
}

}  // namespace

Status small_seq_fwd(const SmallSeqParams& p, const FwdArgs& f, cudaStream_t stream) {
  KernelArgs a = common_args(p, f.seg, p.heads_q);
  a.q = f.q;
  a.k = f.k;
  a.v = f.v;
  a.out = f.out;
  a.probs = f.probs;
  a.stats = f.stats;
  a.save_aux = f.save_aux ? 1 : 0;
  return launch(p, a, false, stream);
}

Status small_seq_bwd(const SmallSeqParams& p, const BwdArgs& b, cudaStream_t stream) {
  KernelArgs a = common_args(p, b.seg, p.heads_kv);
  a.q = b.q;
  a.k = b.k;
  a.v = b.v;
  a.o = b.out;
  a.dout = b.dout;
  a.probs_in = b.probs;
  a.stats_in = b.stats;
  a.dq = b.dq;
  a.dk = b.dk;
  a.dv = b.dv;
  return launch(p, a, true, stream);
}

}  // namespace fusedattn::small_seq::cuda
