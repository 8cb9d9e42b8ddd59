//! `libvgpu.so`: the CUDA driver API + NVML interposer.
//!
//! Loaded before `libcuda.so.1` (`LD_PRELOAD` or `/etc/ld.so.preload`), it
//! enforces the container's device-memory budget (admission against the
//! shared region, reserve before the real call), presents a virtual view
//! (`cuMemGetInfo`, `cuDeviceTotalMem`, NVML memory, device count and
//! handles per `CUDA_VISIBLE_DEVICES`), and routes `dlsym` and
//! `cuGetProcAddress` so every escape route reaches the same hooks.
//!
//! Rules this crate keeps: no work in constructors (everything is lazy,
//! behind once-flags); no threads, no tokio, no global subscriber; logging
//! by raw `write(2)`; no unwrap/expect/panic on any path reachable from C,
//! and every export behind `catch_unwind`; never crash or hang the host:
//! degrade, log one line, keep the state visible.
//!
//! Layout: `hooks` (the one-declaration-per-hook macro and the table),
//! `hooks::cuda`/`hooks::nvml` (the declarations), `policy` (what a hook
//! does), `state` (per-process state, `cuInit` phases, fork/exit), `ledger`
//! (the region), `config` (env contract), `visible` (`CUDA_VISIBLE_DEVICES`),
//! `dl` (`dlsym`), `sys`/`aux` (FFI helpers).
#![allow(non_snake_case, non_upper_case_globals)]

#[macro_use]
pub mod log;
pub mod aux;
pub mod config;
pub mod coverage;
pub mod dl;
pub mod hooks;
pub mod identity;
pub mod ledger;
pub mod policy;
pub mod probe_driver;
pub mod state;
pub mod sys;
pub mod visible;
