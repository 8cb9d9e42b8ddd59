//! The scheduler's tests, one test binary with a module per subject (one
//! link against the Kubernetes crates instead of seven).
mod api;
mod common;
mod decide;
mod fit_table;
mod hami_formats;
mod metrics;
mod tls;
mod webhook;
