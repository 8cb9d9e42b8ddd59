//! Test and benchmark worker for vgpu-region (built with the `failpoints`
//! feature under `cargo test`/`cargo bench`). One process per invocation:
//!
//! - `script REGION OPS`: comma-separated steps: `create:<slots>:<limit>`,
//!   `private:<slots>:<limit>` (a `Region::private` ledger), `gate:<path>`
//!   (wait for a shared flock), `open`, `register`, `reserve:<bytes>`,
//!   `release:<bytes>`, `reclaim`, `unregister`, `fork`,
//!   `forkreserve:<bytes>`, `die`. Prints `slot=N`, `reclaimed=N`,
//!   `refused`, `ok`; errors name their `Unusable` cause.
//! - `burst REGION GATE HOLD MODE`: open, wait on the GATE file's shared
//!   flock (the parent holds it exclusively and releases everyone at once),
//!   register (MODE `cas`) or register under an exclusive flock of
//!   `REGION.lock` (MODE `flock`, the serialized baseline), print
//!   `pid=… slot=… start_ns=… end_ns=…`, then wait on HOLD likewise and exit.
//! - `race REGION BARRIER THREADS ROUNDS CHUNK PARTIES`: every thread reserves
//!   CHUNK each round between two barriers; winners count themselves in
//!   the barrier file and check the admitted total never exceeds the limit.
//! - `probe PATH`: opens PATH every way (open, open_or_create,
//!   open_read_only, open_copy) and prints each outcome's `Unusable` cause.
//! - `truncate-read REGION HOW`: opens (HOW `read_only` or `copy`),
//!   truncates the file to 0, snapshots: SIGBUS for `read_only`.
//! - `truncate-loop REGION`: cuts and regrows the file until killed (a
//!   hostile tenant); prints `ready` after the first round.
//! - `hammer REGION HOW N`: N opens and snapshots; prints `ok=… err=…`.
//! - `limits-write PATH TEXT`: writes a limits file atomically (run by the
//!   tests under a restrictive umask).

#[cfg(not(loom))]
mod imp;

#[cfg(not(loom))]
fn main() -> std::process::ExitCode {
    imp::main()
}

#[cfg(loom)]
fn main() {}
