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
//! behind once-flags); at most one thread of its own, started on first
//! need (`process`); no tokio, no global subscriber; logging by raw
//! `write(2)`; no unwrap/expect/panic on any path reachable from C, and
//! every export behind `catch_unwind`; never crash or hang the host:
//! degrade, log one line, keep the state visible.
//!
//! Layers, each importing only the ones below it (`tests/layers.rs`
//! fails on an upward import):
//!
//! | layer | modules | owns |
//! | --- | --- | --- |
//! | exports | [`ffi`] | the hook exports, `dlsym`, the routes, the front binding |
//! | policy | [`init`], [`limiter`], [`views`], [`memory`], [`identity`] | `cuInit` phases; launch gate; virtual views; memory admission; host PID |
//! | state | [`attach`] | per-process configuration, region slot, charge tables |
//! | driver, ledger, limits | [`driver`], [`ledger`], [`limits_source`] | the real-function table and the driver traits; the region; the limits in force (file, else environment) |
//! | process | [`process`] | generation, fork/exit handlers, re-entrancy guard, per-image state cell, the owned thread and its periodic tasks |
//! | base | [`log`], [`config`], [`sys`], [`clock`] | raw-write log; the environment contract; libc glue; the injected monotonic clock |
#![allow(non_snake_case, non_upper_case_globals)]

#[macro_use]
pub mod log;
pub mod attach;
pub mod clock;
pub mod config;
pub mod driver;
pub mod ffi;
pub mod identity;
pub mod init;
pub mod ledger;
pub mod limiter;
pub mod limits_source;
pub mod memory;
pub mod process;
pub mod sys;
pub mod views;
