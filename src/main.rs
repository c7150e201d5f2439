//! The `scopegate` binary: parse the command line and hand over to the library.

use std::process::ExitCode;

use clap::Parser;

/// jemalloc, not the system allocator: a proxied call allocates and frees hundreds of small
/// buffers across threads, and glibc's malloc spent a tenth of the gateway's CPU on them
/// (docs/benchmarks.md, "The side-by-side harness"). jemalloc returns freed memory to the
/// system gradually; mimalloc, measured first, was as fast but its purges of freed pages put
/// the p99 at 16 clients at about 2.5 times glibc's.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // The compiled walk of the library this binary links, served by the admin API, the
    // console and `scopegate guards report`.
    scopegate::admin::report::install(scopegate::embedded_guard_report!());
    let cli = scopegate::cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(scopegate::cli::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
