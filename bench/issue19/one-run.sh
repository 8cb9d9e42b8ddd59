#!/bin/bash
# The issue-19 §1 figures in one sitting: burst, spawn, wrapper, SM overhead (with the in-process pairing), instructions.
cd "$(dirname "$0")/../.."
export RUSTC_WORKSPACE_WRAPPER=$(rustup which clippy-driver) CLIPPY_ARGS=--cap-lints=warn
F=${F:?}
stamp() { echo "== $(date -u +%H:%M:%S) $* (load $(cut -d' ' -f1-3 /proc/loadavg))"; }
stamp start
# F: where the raw output goes; B: the "before" build (libvgpu.so,
# libvgpu-before.so: a copy of it, libvgpu_core.so); A: where this
# build's libraries are copied; VGPU_SIM_DIR, SIM_LIB, CALLS: see ir.sh.
B=${B:?}; A=${A:?}; mkdir -p $A $F
cp target/release/libvgpu_core.so $A/; cp target/release/libvgpu.so $A/libvgpu-after.so; cp target/release/libvgpu.so $A/libvgpu.so
stamp burst
target/release/vgpu bench init --sim a100-burst --sweep 32,128,300 --repeat 21 \
  --mode native,preload:$B/libvgpu-before.so,preload:$A/libvgpu-after.so \
  --report $F/burst.txt --json $F/burst.json > $F/burst.out 2>&1
stamp spawn
VGPU_SPAWN_LIBS=before=$B/libvgpu.so VGPU_SPAWN_RUNS=61 cargo bench -p vgpu-preload --bench spawn -- --write > $F/spawn.out 2>&1
cp bench/results/spawn-footprint.md $F/spawn-footprint.md
stamp wrapper
for i in 1 2 3; do
  VGPU_BENCH_BASELINE_LIB=$B/libvgpu.so cargo bench -p vgpu-preload --bench wrapper -- --write > $F/wrapper-$i.out 2>&1
  cp bench/results/wrapper-overhead.md $F/wrapper-$i.md
  stamp "wrapper $i"
done
stamp sm
for i in 1 2 3 4; do
  for L in before after; do
    D=$B; [ $L = after ] && D=$A
    echo "== $i $L" >> $F/sm.txt
    VGPU_ARTIFACT_DIR=$D target/release/vgpu bench sm --engine sim --rows overhead --overhead-runs 4 --json $F/sm-$i-$L.json >> $F/sm.txt 2>&1
  done
done
stamp ir
cd bench/issue19
for L in none $B $A; do
  for op in alloc info; do bash ./ir.sh $L $op 20000; done
  bash ./ir.sh $L launch 20000
  [ $L != none ] && bash ./ir.sh $L launch 20000 50
done > $F/ir.txt 2>&1
stamp done
