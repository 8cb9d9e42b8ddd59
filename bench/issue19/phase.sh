#!/bin/bash
# phase.sh LIBDIR N: per process, the driver's own cost and the interposer's
# (the demo tenant's `bench` mode, in-process alternating batches) for
# limited launch, alloc + free and cuMemGetInfo; one line per process.
# Needs VGPU_SIM_DIR and LD_LIBRARY_PATH of a running `vgpu sim env`.
cd "$(dirname "$0")/../.."
lib=${1:?}; n=${2:-40}
for i in $(seq "$n"); do
  c=$(mktemp -u)
  env LD_PRELOAD="$lib/libvgpu.so" CUDA_DEVICE_MEMORY_SHARED_CACHE="$c" CUDA_DEVICE_SM_LIMIT=50 \
    CUDA_DEVICE_MEMORY_LIMIT=64g target/release/vgpu-demo-tenant bench 2>/dev/null |
    awk -F= -v i="$i" '{v[$1]=$2} END{printf "%d %s %s %s %s %s %s\n", i,
      v["bench.direct.launch_ns"], v["bench.launch_ns"], v["bench.direct.alloc_free_ns"],
      v["bench.alloc_free_ns"], v["bench.direct.mem_get_info_ns"], v["bench.mem_get_info_ns"]}'
  rm -f "$c"
done
