// Hopper (sm_90a) building blocks of the flash kernels (fwd_kernel.cuh, bwd_kernel.cuh): mbarriers,
// bulk tensor copies (TMA), warpgroup matrix products (wgmma) and their shared-memory
// descriptors, named barriers, register reallocation, acquire / release across blocks,
// transposed ldmatrix. Each is one PTX instruction; the PTX
// ISA manual is the reference for every field used here.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cstdint>

namespace fusedattn::cuda::hopper {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarriers ---------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival that also says `bytes` more will land through the copy engine.
__device__ __forceinline__ void mbar_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// Waits until the barrier's phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// ---- bulk tensor copy: one box of a 4-d tensor map into shared memory ---------------------
__device__ __forceinline__ void tma_load_4d(const CUtensorMap* map, uint64_t* bar, void* dst,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
}
// A plain bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
// Adds `bytes` of float32 in shared memory to global memory (the copy engine's reduction; a
// multiple of 16 bytes, both addresses 16-byte aligned), in this thread's bulk group.
__device__ __forceinline__ void bulk_reduce_add(float* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(
                   reinterpret_cast<uint64_t>(dst)),
               "r"(smem_addr(src)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Waits until at most kPending of this thread's bulk groups still read their shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
// Waits until at most kPending of this thread's bulk groups are unfinished.
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Four 8 x 8 blocks of 16-bit values from shared memory: r[m] holds block m's (row lane / 4;
// columns 2 (lane % 4) + 0, 1); lane L gives the address of block L / 8's row L % 8 (16 bytes).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ---- named barriers among the 256 threads of the two consumer warpgroups ------------------
__device__ __forceinline__ void named_sync(uint32_t id) {
  asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory");
}
__device__ __forceinline__ void named_arrive(uint32_t id) {
  asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory");
}

// A barrier among one warpgroup's 128 threads.
__device__ __forceinline__ void group_sync(uint32_t id) {
  asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
}

// ---- register reallocation between warpgroups ---------------------------------------------
template <uint32_t kRegs>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// ---- wgmma ------------------------------------------------------------------------------
// Shared-memory matrix descriptor for a 128-byte swizzled layout (the layout the copy engine
// writes with CU_TENSOR_MAP_SWIZZLE_128B): start address, leading and stride byte offsets,
// all in 16-byte units; layout type 1 (bits 62-63) = 128B swizzle. Swizzle atoms (8 rows of
// 128 bytes) must start 1024-byte aligned.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr, uint32_t lead, uint32_t stride) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(lead >> 4) << 16) | (static_cast<uint64_t>(stride >> 4) << 32) |
         (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Makes this thread's generic-proxy writes to shared memory visible to the async proxy
// (wgmma operands read from shared memory), ahead of a barrier.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Keeps the compiler from moving uses of a register across the asynchronous products:
// the value "changes" here, after the wait that precedes it.
__device__ __forceinline__ void fence_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_reg(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// One wgmma instruction of the form `shape` ("m64n128k16"...) in bf16 (kBf16) or fp16, its
// scale-d predicate set from operand `pred` ("%66"), then `operands` (D's registers, A, B, the
// predicate and the scale / transpose immediates); the asm's outputs and inputs follow.
#define FA_WGMMA(pred, shape, operands, ...)                                                   \
  if constexpr (kBf16)                                                                         \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " pred ", 0;\n"                            \
                 "wgmma.mma_async.sync.aligned." shape ".f32.bf16.bf16 " operands ";\n}\n"     \
                 __VA_ARGS__);                                                                 \
  else                                                                                         \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " pred ", 0;\n"                            \
                 "wgmma.mma_async.sync.aligned." shape ".f32.f16.f16 " operands ";\n}\n"       \
                 __VA_ARGS__)

#define FA_WGMMA_D64                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FA_WGMMA_D64_OPS(d)                                                                   \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),         \
      "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
      "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),           \
      "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),           \
      "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),           \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),           \
      "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),           \
      "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),           \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),           \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),           \
      "+f"(d[62]), "+f"(d[63])

#define FA_WGMMA_D68 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "  \
  "%64, %65, %66, %67}"
#define FA_WGMMA_D68_OPS(d) \
  FA_WGMMA_D64_OPS(d), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])

#define FA_WGMMA_D36                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35}"
#define FA_WGMMA_D36_OPS(d)                                                                   \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),         \
      "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
      "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),           \
      "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),           \
      "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),           \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])

// D[64 x 128] (+)= A[64 x 16] B[16 x 128], A and B from shared memory, both K-major
// (B stored as 128 rows of K). `accumulate` 0 overwrites D. kBf16: bf16, else fp16.
template <bool kBf16>
__device__ __forceinline__ void wgmma_ss_m64n128k16(float (&d)[64], uint64_t a, uint64_t b,
                                                    uint32_t accumulate) {
  FA_WGMMA("%66", "m64n128k16", FA_WGMMA_D64 ", %64, %65, p, 1, 1, 0, 0",
           : FA_WGMMA_D64_OPS(d)
           : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 136] += A[64 x 16] B[16 x 136], A from registers (the accumulator layout of a
// previous product, packed to 16 bits), B from shared memory MN-major (stored as 16 rows of
// N: imm-trans-b = 1), its 64-column spans a leading-byte stride apart; the third span's
// first 8 columns are D's columns 128..135 (the forward reads ones there: P's row sums).
template <bool kBf16>
__device__ __forceinline__ void wgmma_rs_m64n136k16(float (&d)[68], const uint32_t (&a)[4],
                                                    uint64_t b) {
  FA_WGMMA("%73", "m64n136k16", FA_WGMMA_D68 ", {%68, %69, %70, %71}, %72, p, 1, 1, 1",
           : FA_WGMMA_D68_OPS(d)
           : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// The head dim 64 form of the above: D[64 x 72] += A[64 x 16] B[16 x 72], the second span's
// first 8 columns D's columns 64..71.
template <bool kBf16>
__device__ __forceinline__ void wgmma_rs_m64n72k16(float (&d)[36], const uint32_t (&a)[4],
                                                   uint64_t b) {
  FA_WGMMA("%41", "m64n72k16", FA_WGMMA_D36 ", {%36, %37, %38, %39}, %40, p, 1, 1, 1",
           : FA_WGMMA_D36_OPS(d)
           : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

#define FA_WGMMA_D16 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FA_WGMMA_D32                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FA_WGMMA_D128                                                                     \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "               \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "      \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "      \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "      \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "      \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "      \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, " \
  "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "  \
  "%125, %126, %127}"
// Eight accumulator operands from d[i] on, and 32 and 128 of them.
#define FA_OPS8(d, i)                                                                       \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define FA_OPS32(d, i) FA_OPS8(d, i), FA_OPS8(d, i + 8), FA_OPS8(d, i + 16), FA_OPS8(d, i + 24)
#define FA_OPS128(d) FA_OPS32(d, 0), FA_OPS32(d, 32), FA_OPS32(d, 64), FA_OPS32(d, 96)

// The head dim 256 forms (64-key blocks): S = Q K^T as D[64 x 64] (+)= A[64 x 16] B[16 x 64]
// from shared memory (as wgmma_ss_m64n128k16), and O += P V as D[64 x 256] += A[64 x 16]
// B[16 x 256], A from registers, B MN-major (as wgmma_rs_m64n136k16; no room for ones past
// 256 columns: the forward sums P's rows itself there).
template <bool kBf16>
__device__ __forceinline__ void wgmma_ss_m64n64k16(float (&d)[32], uint64_t a, uint64_t b,
                                                   uint32_t accumulate) {
  FA_WGMMA("%34", "m64n64k16", FA_WGMMA_D32 ", %32, %33, p, 1, 1, 0, 0",
           : FA_OPS32(d, 0)
           : "l"(a), "l"(b), "r"(accumulate));
}
template <bool kBf16>
__device__ __forceinline__ void wgmma_rs_m64n256k16(float (&d)[128], const uint32_t (&a)[4],
                                                    uint64_t b) {
  FA_WGMMA("%133", "m64n256k16", FA_WGMMA_D128 ", {%128, %129, %130, %131}, %132, p, 1, 1, 1",
           : FA_OPS128(d)
           : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// The backward's forms (bwd_kernel.cuh). dV += P^T dO and dK += dS^T Q (head dim 128): D[64 x 128] += A[64 x
// 16] B[16 x 128], A from registers, B MN-major (as wgmma_rs_m64n136k16, without the ones).
template <bool kBf16>
__device__ __forceinline__ void wgmma_rs_m64n128k16(float (&d)[64], const uint32_t (&a)[4],
                                                    uint64_t b) {
  FA_WGMMA("%69", "m64n128k16", FA_WGMMA_D64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1",
           : FA_WGMMA_D64_OPS(d)
           : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
// The head dim 64 form: D[64 x 64] += A[64 x 16] B[16 x 64], A from registers, B MN-major.
template <bool kBf16>
__device__ __forceinline__ void wgmma_rs_m64n64k16(float (&d)[32], const uint32_t (&a)[4],
                                                   uint64_t b) {
  FA_WGMMA("%37", "m64n64k16", FA_WGMMA_D32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1",
           : FA_OPS32(d, 0)
           : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
// dQ = dS K: D[64 x 64] (+)= A[64 x 16] B[16 x 64], both from shared memory and MN-major
// (A stored as 16 rows of M: dS^T; B as 16 rows of N: K's keys).
template <bool kBf16>
__device__ __forceinline__ void wgmma_ss_m64n64k16_tt(float (&d)[32], uint64_t a, uint64_t b,
                                                      uint32_t accumulate) {
  FA_WGMMA("%34", "m64n64k16", FA_WGMMA_D32 ", %32, %33, p, 1, 1, 1, 1",
           : FA_OPS32(d, 0)
           : "l"(a), "l"(b), "r"(accumulate));
}

// Head dim 256's backward (64-key blocks). S^T = K Q^T and dP^T = V dO^T for a group's 32
// queries: D[64 x 32] (+)= A[64 x 16] B[16 x 32], both from shared memory, K-major.
template <bool kBf16>
__device__ __forceinline__ void wgmma_ss_m64n32k16(float (&d)[16], uint64_t a, uint64_t b,
                                                   uint32_t accumulate) {
  FA_WGMMA("%18", "m64n32k16", FA_WGMMA_D16 ", %16, %17, p, 1, 1, 0, 0",
           : FA_OPS8(d, 0), FA_OPS8(d, 8)
           : "l"(a), "l"(b), "r"(accumulate));
}
// dV += P^T dO and dK += dS^T Q for a group's 128 columns: D[64 x 128] += A[64 x 16] B[16 x
// 128], A (P^T, dS^T) from shared memory K-major, B MN-major.
template <bool kBf16>
__device__ __forceinline__ void wgmma_ss_m64n128k16_bt(float (&d)[64], uint64_t a, uint64_t b) {
  FA_WGMMA("%66", "m64n128k16", FA_WGMMA_D64 ", %64, %65, p, 1, 1, 0, 1",
           : FA_WGMMA_D64_OPS(d)
           : "l"(a), "l"(b), "r"(1));
}
// dQ = dS K for a group's 128 columns: as wgmma_ss_m64n64k16_tt, N 128.
template <bool kBf16>
__device__ __forceinline__ void wgmma_ss_m64n128k16_tt(float (&d)[64], uint64_t a, uint64_t b,
                                                       uint32_t accumulate) {
  FA_WGMMA("%66", "m64n128k16", FA_WGMMA_D64 ", %64, %65, p, 1, 1, 1, 1",
           : FA_WGMMA_D64_OPS(d)
           : "l"(a), "l"(b), "r"(accumulate));
}

#undef FA_WGMMA
#undef FA_WGMMA_D32
#undef FA_WGMMA_D16
#undef FA_WGMMA_D128
#undef FA_OPS8
#undef FA_OPS32
#undef FA_OPS128
#undef FA_WGMMA_D64
#undef FA_WGMMA_D36
#undef FA_WGMMA_D36_OPS
#undef FA_WGMMA_D68
#undef FA_WGMMA_D68_OPS
#undef FA_WGMMA_D64_OPS

// ---- ordering across blocks, transposed loads ---------------------------------------------
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(reinterpret_cast<uint64_t>(p)) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(reinterpret_cast<uint64_t>(p)), "r"(v) : "memory");
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Four 8 x 8 blocks of 16-bit values, transposed: r[m] holds block m's (row 2 (lane % 4) + 0, 1;
// column lane / 4); lane L gives the address of block L / 8's row L % 8 (16 bytes).
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// ---- special functions ---------------------------------------------------------------------
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fusedattn::cuda::hopper
