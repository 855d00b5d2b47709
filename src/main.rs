//! The `fencegate` command. Each subcommand is a module of [`command`]; this file only picks
//! the allocator and hands the command line over.

mod command;

/// jemalloc instead of the system allocator (the default feature `jemalloc`): glibc's malloc
/// spent 28% of a lone PUT's instructions, and kept more memory after a burst (bench/RESULTS.md).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    command::main(clap::Parser::parse())
}
