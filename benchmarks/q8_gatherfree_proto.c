/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A timing prototype, not library code: how fast could a q8 AdamW step be on
 * an AVX-512 core without table lookups? Issue 23's kernel bar (q8 step >=
 * 0.95x its in-place streaming bound) is out of reach of the library's
 * kernel (0.26-0.31 on a 2-vCPU Emerald Rapids VM); this measures the best
 * shape of the alternative before anyone builds it (docs/cpuadam.md,
 * "Low-bit states", the eleventh stop's paragraph).
 *
 * What it does per 256-element block, in one pass plus a code pass: decode
 * m and v codes arithmetically (fp8-like maps: m = sign + 4 exponent + 3
 * mantissa bits of m / absmax, 2^-15 .. 1; v = 5 exponent + 3 mantissa bits
 * of v / absmax, 2^-31 .. 1; exponent 0 reads 0), the same AdamW arithmetic
 * as the library's fp32 kernel (square root and division), the new params
 * stored, m and v kept in an L1 buffer with their absmax taken in the same
 * pass; then the codes by integer rounding of the fp32 bits (round half
 * down). Not the library's maps (those are bitsandbytes' dynamic maps, whose
 * codes need a lookup), no bias correction, no NaN rules, no tail blocks:
 * only the instruction mix is meant to be realistic.
 *
 * Build and run (2 threads, n = 1e8, 5 pairs; the ratio is the bound's time
 * scaled to q8's 16 bytes per parameter over the step's, as zo-adam-bench
 * reports for --state q8):
 *   gcc -O2 -fopenmp benchmarks/q8_gatherfree_proto.c -o /tmp/q8proto
 *   OMP_NUM_THREADS=2 /tmp/q8proto 1e8 5
 * Only the kernels are compiled for AVX-512 (the pragma below); main()
 * checks the CPU first and refuses, exit 77, where it lacks AVX-512.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define BLK 256
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
typedef __m512 VF;
/* code -> value (times scale) */
static inline VF dec_m(__m512i c, VF s){
  /* c: 8-bit: s eeee mmm; value = (-1)^s 2^(e-15) (1 + m/8) for e>0, 0 for e==0 */
  __m512i e = _mm512_and_si512(_mm512_srli_epi32(c,3), _mm512_set1_epi32(15));
  __m512i bits = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(c,_mm512_set1_epi32(0x7f)),20), _mm512_set1_epi32(0));
  bits = _mm512_add_epi32(bits, _mm512_set1_epi32((127-15)<<23));
  bits = _mm512_or_si512(bits, _mm512_slli_epi32(_mm512_and_si512(c,_mm512_set1_epi32(0x80)),24));
  __mmask16 nz = _mm512_test_epi32_mask(e,e);
  return _mm512_maskz_mul_ps(nz, _mm512_castsi512_ps(bits), s);
}
static inline VF dec_v(__m512i c, VF s){
  __m512i bits = _mm512_add_epi32(_mm512_slli_epi32(c,20), _mm512_set1_epi32((127-31)<<23));
  __mmask16 nz = _mm512_cmpge_epu32_mask(c,_mm512_set1_epi32(8));
  return _mm512_maskz_mul_ps(nz, _mm512_castsi512_ps(bits), s);
}
static inline __m128i enc_m(VF x){ /* x in [-1,1] */
  __m512i b = _mm512_castps_si512(x);
  __m512i a = _mm512_and_si512(b,_mm512_set1_epi32(0x7fffffff));
  a = _mm512_add_epi32(a,_mm512_set1_epi32((1<<19)-1)); /* round half down */
  __m512i k = _mm512_sub_epi32(_mm512_srli_epi32(a,20), _mm512_set1_epi32((127-15)<<3));
  k = _mm512_min_epi32(_mm512_max_epi32(k,_mm512_setzero_si512()),_mm512_set1_epi32(127));
  k = _mm512_or_si512(k,_mm512_and_si512(_mm512_srli_epi32(b,24),_mm512_set1_epi32(0x80)));
  return _mm512_cvtepi32_epi8(k);
}
static inline __m128i enc_v(VF x){
  __m512i a = _mm512_castps_si512(x);
  a = _mm512_add_epi32(a,_mm512_set1_epi32((1<<19)-1));
  __m512i k = _mm512_sub_epi32(_mm512_srli_epi32(a,20), _mm512_set1_epi32((127-31)<<3));
  k = _mm512_min_epi32(_mm512_max_epi32(k,_mm512_setzero_si512()),_mm512_set1_epi32(255));
  return _mm512_cvtepi32_epi8(k);
}
static void step_blocks(float *p, const float *g, uint8_t *mc, uint8_t *vc, float *ms, float *vs, size_t b0, size_t b1,
                        float lr, float b1c, float b2c, float eps, float wd){
  _Alignas(64) float mb[BLK], vb[BLK];
  const VF B1=_mm512_set1_ps(b1c), OB1=_mm512_set1_ps(1-b1c), B2=_mm512_set1_ps(b2c), OB2=_mm512_set1_ps(1-b2c);
  const VF EPS=_mm512_set1_ps(eps), NS=_mm512_set1_ps(-lr), DEC=_mm512_set1_ps(1-lr*wd), ISB=_mm512_set1_ps(1.0f);
  const __m512i ABS=_mm512_set1_epi32(0x7fffffff);
  for(size_t b=b0;b<b1;b++){
    size_t i0=b*BLK;
    VF sm=_mm512_set1_ps(ms[b]), sv=_mm512_set1_ps(vs[b]);
    __m512i am=_mm512_setzero_si512(), av=am;
    for(int i=0;i<BLK;i+=16){
      VF m=dec_m(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(mc+i0+i))),sm);
      VF v=dec_v(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(vc+i0+i))),sv);
      VF gg=_mm512_loadu_ps(g+i0+i), pp=_mm512_loadu_ps(p+i0+i);
      m=_mm512_fmadd_ps(B1,m,_mm512_mul_ps(OB1,gg));
      v=_mm512_fmadd_ps(_mm512_mul_ps(OB2,gg),gg,_mm512_mul_ps(B2,v));
      VF den=_mm512_fmadd_ps(_mm512_sqrt_ps(v),ISB,EPS);
      VF u=_mm512_div_ps(_mm512_mul_ps(NS,m),den);
      _mm512_storeu_ps(p+i0+i,_mm512_fmadd_ps(pp,DEC,u));
      _mm512_store_ps(mb+i,m); _mm512_store_ps(vb+i,v);
      am=_mm512_max_epu32(am,_mm512_and_si512(_mm512_castps_si512(m),ABS));
      av=_mm512_max_epu32(av,_mm512_castps_si512(v));
    }
    uint32_t xm=(uint32_t)_mm512_reduce_max_epu32(am), xv=(uint32_t)_mm512_reduce_max_epu32(av);
    float fm,fv; memcpy(&fm,&xm,4); memcpy(&fv,&xv,4);
    ms[b]=fm; vs[b]=fv;
    VF rm=_mm512_set1_ps(fm>0?1.0f/fm:0), rv=_mm512_set1_ps(fv>0?1.0f/fv:0);
    for(int i=0;i<BLK;i+=16){
      _mm_storeu_si128((__m128i*)(mc+i0+i),enc_m(_mm512_mul_ps(_mm512_load_ps(mb+i),rm)));
      _mm_storeu_si128((__m128i*)(vc+i0+i),enc_v(_mm512_mul_ps(_mm512_load_ps(vb+i),rv)));
    }
  }
}
static void bound(float*a,float*b,float*c,const float*d,size_t i0,size_t i1){
  VF al=_mm512_set1_ps(1e-7f);
  for(size_t i=i0;i<i1;i+=16){VF x=_mm512_mul_ps(al,_mm512_loadu_ps(d+i));
    _mm512_storeu_ps(a+i,_mm512_add_ps(_mm512_loadu_ps(a+i),x));_mm512_storeu_ps(b+i,_mm512_add_ps(_mm512_loadu_ps(b+i),x));_mm512_storeu_ps(c+i,_mm512_add_ps(_mm512_loadu_ps(c+i),x));}
}
#pragma GCC pop_options
int main(int argc,char**argv){
  __builtin_cpu_init();
  if(!__builtin_cpu_supports("avx512f")||!__builtin_cpu_supports("avx512bw")||!__builtin_cpu_supports("avx512vl")||
     !__builtin_cpu_supports("avx512dq")){
    fprintf(stderr,"q8_gatherfree_proto: this CPU lacks AVX-512 (F/BW/VL/DQ); the prototype's kernels need it\n");
    return 77;
  }
  size_t n=argc>1?(size_t)atof(argv[1]):100000000; int pairs=argc>2?atoi(argv[2]):5;
  if(n<(size_t)BLK*64||n>((size_t)1<<32)||pairs<1||pairs>64){
    fprintf(stderr,"usage: q8_gatherfree_proto [N (%d .. 2^32 elements; default 1e8)] [PAIRS (1..64; default 5)]\n",BLK*64);
    return 2;
  }
  n=n/BLK*BLK; size_t nb=n/BLK;
  float*p=aligned_alloc(64,n*4),*g=aligned_alloc(64,n*4),*m=aligned_alloc(64,n*4),*v=aligned_alloc(64,n*4);
  uint8_t*mc=aligned_alloc(64,n),*vc=aligned_alloc(64,n); float*ms=malloc(nb*4),*vs=malloc(nb*4);
  if(!p||!g||!m||!v||!mc||!vc||!ms||!vs){fprintf(stderr,"q8_gatherfree_proto: out of memory for n = %zu\n",n);return 1;}
  #pragma omp parallel for
  for(size_t i=0;i<n;i++){p[i]=1e-3f*(i%1000);g[i]=1e-4f*(float)((long)((i*7)%1000)-500);m[i]=v[i]=0;mc[i]=vc[i]=0;}
  for(size_t b=0;b<nb;b++) ms[b]=vs[b]=0;
  double best_s=1e9,best_b=1e9; double rs[64];
  for(int k=0;k<pairs;k++){
    double t0=now();
    #pragma omp parallel
    { int t=omp_get_thread_num(),T=omp_get_num_threads(); size_t a=nb*t/T,e=nb*(t+1)/T;
      step_blocks(p,g,mc,vc,ms,vs,a,e,1e-3f,0.9f,0.999f,1e-8f,0.01f); }
    double ts=now()-t0; t0=now();
    #pragma omp parallel
    { int t=omp_get_thread_num(),T=omp_get_num_threads(); size_t a=n*t/T/16*16,e=t+1==T?n:n*(t+1)/T/16*16;
      bound(p,m,v,g,a,e); }
    double tb=now()-t0;
    /* q8 bytes 16/param against the bound's 28 */
    rs[k]=(tb*16.0/28.0)/ts; if(ts<best_s)best_s=ts; if(tb<best_b)best_b=tb;
    printf("pair %d: step %.1f ms bound %.1f ms ratio %.3f\n",k,ts*1e3,tb*1e3,rs[k]);
  }
  /* median */
  for(int a=0;a<pairs;a++)for(int b=a+1;b<pairs;b++)if(rs[b]<rs[a]){double x=rs[a];rs[a]=rs[b];rs[b]=x;}
  printf("median ratio %.3f; sample codes %d %d scale %g\n",rs[pairs/2],mc[12345],vc[12345],ms[50]);
  return 0;
}
