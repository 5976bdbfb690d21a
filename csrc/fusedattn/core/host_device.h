// Plain C++ that nvcc also compiles for the device: FA_HOST_DEVICE marks such a
// function (empty without CUDA), FA_INLINE asks for it to be inlined
// (__forceinline__ on CUDA, plain inline elsewhere). One definition, so headers
// that use them can be included together.
#pragma once

#if defined(__CUDACC__)
#define FA_HOST_DEVICE __host__ __device__
#define FA_INLINE __forceinline__
#else
#define FA_HOST_DEVICE
#define FA_INLINE inline
#endif
