#!/bin/bash
# ir.sh LIBDIR|none OP N [SM]: instructions per call (callgrind totals of N
# calls minus 0 calls, whole process, the simulated driver included).
# OP: alloc (cuMemAlloc_v2 + cuMemFree_v2), info (cuMemGetInfo_v2),
# launch (cuLaunchKernel). LIBDIR holds libvgpu.so (+ libvgpu_core.so); SM
# sets CUDA_DEVICE_SM_LIMIT. Needs VGPU_SIM_DIR (a running `vgpu sim env`
# machine), SIM_LIB (its lib directory) and CALLS (calls.c, built with
# `cc -O2 -o calls calls.c -ldl`).
lib=$1; op=$2; n=$3; sm=$4
export LD_LIBRARY_PATH=${SIM_LIB:?}
envs=()
if [ "$lib" != none ]; then
  envs=(LD_PRELOAD=$lib/libvgpu.so CUDA_DEVICE_MEMORY_LIMIT=64g)
  [ -n "$sm" ] && envs+=(CUDA_DEVICE_SM_LIMIT=$sm)
fi
out=$(mktemp)
tot() {
  c=$(mktemp -u); env "${envs[@]}" CUDA_DEVICE_MEMORY_SHARED_CACHE=$c valgrind --tool=callgrind \
    --callgrind-out-file=$out "${CALLS:?}" $1 $2 >/dev/null 2>&1; rm -f $c
  grep "^summary:\|^totals:" $out | head -1 | awk '{print $2}'
}
a=$(tot none 0); b=$(tot $op $n); rm -f $out
echo "$(basename $lib) $op sm=${sm:-none}: $(( (b-a)/n )) Ir/op"
