#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
typedef int (*fi)(unsigned);
typedef int (*fdg)(int*, int);
typedef int (*fret)(void**, int);
typedef int (*fset)(void*);
typedef int (*fload)(void**, const void*);
typedef int (*fgetf)(void**, void*, const char*);
typedef int (*flaunch)(void*, unsigned,unsigned,unsigned,unsigned,unsigned,unsigned,unsigned, void*, void**, void**);
typedef int (*fsync)(void);
typedef int (*falloc)(uint64_t*, size_t);
typedef int (*ffree)(uint64_t);
typedef int (*finfo)(size_t*, size_t*);
#define S(t, n) t n = (t)dlsym(h, #n); if (!n) { fprintf(stderr, "no %s\n", #n); return 1; }
static uint64_t now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1000000000ull+t.tv_nsec;}
int main(int argc, char **argv) {
  const char *op = argv[1]; long n = atol(argv[2]);
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
  S(fi, cuInit) S(fdg, cuDeviceGet) S(fret, cuDevicePrimaryCtxRetain) S(fset, cuCtxSetCurrent)
  S(fload, cuModuleLoadData) S(fgetf, cuModuleGetFunction) S(flaunch, cuLaunchKernel) S(fsync, cuCtxSynchronize)
  S(falloc, cuMemAlloc_v2) S(ffree, cuMemFree_v2) S(finfo, cuMemGetInfo_v2)
  int dev; void *ctx, *mod, *fn;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) { fprintf(stderr, "init\n"); return 1; }
  if (cuModuleLoadData(&mod, "vgpu-sim-module v1\nkernel spin\n") || cuModuleGetFunction(&fn, mod, "spin")) { fprintf(stderr, "module\n"); return 1; }
  uint64_t block_ns = 0; void *args[1] = { &block_ns };
  /* warm up: one of each */
  { uint64_t d; cuMemAlloc_v2(&d, 1<<20); cuMemFree_v2(d); size_t f,t; cuMemGetInfo_v2(&f,&t);
    cuLaunchKernel(fn,1,1,1,32,1,1,0,0,args,0); cuCtxSynchronize(); }
  uint64_t t0 = now(), inside = 0;
  if (!strcmp(op, "alloc")) {
    for (long i = 0; i < n; i++) { uint64_t d; if (cuMemAlloc_v2(&d, 1<<20)) return 2; cuMemFree_v2(d); }
  } else if (!strcmp(op, "info")) {
    for (long i = 0; i < n; i++) { size_t f,t; cuMemGetInfo_v2(&f,&t); }
  } else if (!strcmp(op, "launch")) {
    for (long i = 0; i < n; i++) {
      uint64_t a = now();
      if (cuLaunchKernel(fn,1,1,1,32,1,1,0,0,args,0)) return 3;
      inside += now() - a;
      if ((i & 255) == 255) cuCtxSynchronize();
    }
    cuCtxSynchronize();
  } else if (!strcmp(op, "none")) {
  }
  uint64_t t1 = now();
  if (n) fprintf(stderr, "%s n=%ld %.1f ns/op (launch inside %.1f)\n", op, n, (double)(t1-t0)/n, (double)inside/n);
  return 0;
}
