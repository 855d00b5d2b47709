//! The worker process of the fault-injection harness (`tests/fault`): not a test, and not a
//! program to run by hand. The harness starts several of these with `FAULT_WORKER_*`
//! variables, as real processes it can SIGSTOP, and judges the histories they write.
//!
//! An example rather than a `fencegate` subcommand: it is test tooling (the harness's history
//! format, the `rand` dev-dependency) that must never ship in the product binary. `cargo test`
//! builds it (to target/<profile>/examples/fault_worker); a lone `cargo test --test fault`
//! does not, and the harness then says to build it.

#[path = "../tests/fault/history.rs"]
#[allow(dead_code)] // the harness's reading side is not used here
mod history;
#[path = "../tests/fault/worker.rs"]
#[allow(dead_code)] // the harness's configuring side is not used here
mod worker;

fn main() {
    let Some(cfg) = worker::WorkerConfig::from_env() else {
        eprintln!(
            "fault_worker is started by the fault-injection harness (cargo test --test fault), with FAULT_WORKER_* set"
        );
        std::process::exit(2);
    };
    worker::run(cfg);
}
