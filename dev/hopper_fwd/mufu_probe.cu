// Throughput (instr-lanes / clk / SM) and accuracy of the MUFU operations softcap leans on.
// Build: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a dev/hopper_fwd/mufu_probe.cu -o .carry/mufu_probe
// Run on the GPU machine: .carry/mufu_probe (log: bench/runs/2026-11-24/mufu_probe.log)
#include <cuda_fp16.h>
#include <cstdio>
#include <cstdint>
#include <cmath>
#include <vector>
__device__ __forceinline__ float tanh_f32(float x){float y;asm volatile("tanh.approx.f32 %0,%1;":"=f"(y):"f"(x));return y;}
__device__ __forceinline__ float ex2_f32(float x){float y;asm volatile("ex2.approx.ftz.f32 %0,%1;":"=f"(y):"f"(x));return y;}
__device__ __forceinline__ float rcp_f32(float x){float y;asm volatile("rcp.approx.ftz.f32 %0,%1;":"=f"(y):"f"(x));return y;}
__device__ __forceinline__ uint32_t tanh_h2(uint32_t x){uint32_t y;asm volatile("tanh.approx.f16x2 %0,%1;":"=r"(y):"r"(x));return y;}
__device__ __forceinline__ uint32_t ex2_h2(uint32_t x){uint32_t y;asm volatile("ex2.approx.f16x2 %0,%1;":"=r"(y):"r"(x));return y;}
__device__ __forceinline__ uint32_t tanh_bh2(uint32_t x){uint32_t y;asm volatile("tanh.approx.bf16x2 %0,%1;":"=r"(y):"r"(x));return y;}
template<int OP> __global__ void thr(float* out, int iters){
  float a[16]; uint32_t h[16];
  for(int i=0;i<16;++i){a[i]=0.001f*(threadIdx.x+i); h[i]=0x3c003c00u+i;}
  for(int it=0;it<iters;++it){
#pragma unroll
    for(int i=0;i<16;++i){
      if(OP==0) a[i]=tanh_f32(a[i]);
      if(OP==1) a[i]=ex2_f32(a[i]);
      if(OP==2) a[i]=rcp_f32(a[i]);
      if(OP==3) h[i]=tanh_h2(h[i]);
      if(OP==4) h[i]=ex2_h2(h[i]);
      if(OP==5) h[i]=tanh_bh2(h[i]);
      if(OP==6) a[i]=fmaf(a[i],1.0001f,0.5f);
      if(OP==7){uint32_t r;asm volatile("cvt.rn.bf16x2.f32 %0,%1,%2;":"=r"(r):"f"(a[i]),"f"(a[(i+1)%16]));h[i]^=r;}
      if(OP==8){a[i]=tanh_f32(a[i]);uint32_t r;asm volatile("cvt.rn.bf16x2.f32 %0,%1,%2;":"=r"(r):"f"(__uint_as_float(h[i])),"f"(__uint_as_float(h[(i+1)%16])));h[i]=r+1;}
      if(OP==9){a[i]=tanh_f32(a[i]);h[i]=h[i]*3u+1u;}
    }
  }
  float s=0; for(int i=0;i<16;++i) s+=a[i]+__uint_as_float(h[i]);
  if(s==12345.f) out[0]=s;
}
__global__ void acc(float* e32, float* e16, int n){
  int i=blockIdx.x*blockDim.x+threadIdx.x; if(i>=n) return;
  float x=-6.0f+12.0f*i/n; double r=tanh((double)x);
  e32[i]=fabs(tanh_f32(x)-r);
  __half2 hx=__floats2half2_rn(x,x); uint32_t u=*reinterpret_cast<uint32_t*>(&hx);
  uint32_t t=tanh_h2(u); __half2 ht=*reinterpret_cast<__half2*>(&t);
  float hi=__half2float(__low2half(hx)); float lo=x-hi; float th=__low2float(ht);
  e16[i]=fabs(th + lo*(1-th*th) - r);  // with a first-order fix of the input rounding
}
int main(){
  float* d; cudaMalloc(&d,4<<20);
  const char* names[]={"tanh.f32","ex2.f32","rcp.f32","tanh.f16x2","ex2.f16x2","tanh.bf16x2","ffma","cvt.bf16x2","tanh+cvt","tanh+imad"};
  int sms; cudaDeviceGetAttribute(&sms,cudaDevAttrMultiProcessorCount,0);
  int clk; cudaDeviceGetAttribute(&clk,cudaDevAttrClockRate,0);
  for(int op=0;op<10;++op){
    void(*k)(float*,int)= op==0?thr<0>:op==1?thr<1>:op==2?thr<2>:op==3?thr<3>:op==4?thr<4>:op==5?thr<5>:op==6?thr<6>:op==7?thr<7>:op==8?thr<8>:thr<9>;
    int iters=4096; k<<<sms*4,512>>>(d,16); cudaDeviceSynchronize();
    cudaEvent_t a,b; cudaEventCreate(&a); cudaEventCreate(&b);
    cudaEventRecord(a); k<<<sms*4,512>>>(d,iters); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms,a,b);
    double ops=double(sms)*4*512*iters*16; double per_clk_sm=ops/(ms*1e-3)/sms/(clk*1e3);
    printf("%-12s %.1f instr-lanes / clk / SM (at %d MHz nominal)\n",names[op],per_clk_sm,clk/1000);
  }
  int n=1<<20; float *e32,*e16; cudaMalloc(&e32,n*4); cudaMalloc(&e16,n*4);
  acc<<<n/256,256>>>(e32,e16,n); std::vector<float> h32(n),h16(n);
  cudaMemcpy(h32.data(),e32,n*4,cudaMemcpyDeviceToHost); cudaMemcpy(h16.data(),e16,n*4,cudaMemcpyDeviceToHost);
  float m32=0,m16=0; for(int i=0;i<n;++i){m32=fmaxf(m32,h32[i]);m16=fmaxf(m16,h16[i]);}
  printf("max |err| on [-6,6]: tanh.approx.f32 %.3e (2^%.2f), f16x2 + input fix %.3e (2^%.2f)\n",m32,log2(m32),m16,log2(m16));
}
