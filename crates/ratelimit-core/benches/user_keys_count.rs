//! One row of the `user_keys` group of `memory_store.rs`, run for a given
//! number of decisions with no harness around it, so that a counter
//! (`valgrind --tool=cachegrind`, `perf stat`) sees only that row: the
//! difference between a run of N decisions and a run of 0 is N decisions'
//! instructions and cache misses, whatever else runs on the machine.
//!
//! ```sh
//! cargo bench -p ratelimit-core --bench user_keys_count --no-run
//! target/release/deps/user_keys_count-* <ip_text|ip_addr|ip_to_string> <hot|uniform> <threads> <decisions>
//! ```
//!
//! `ip_text` is our store keyed as `PeerIp` keys a request, `ip_addr`
//! governor keyed by `IpAddr` (as tower_governor keys it), `ip_to_string`
//! our store keyed by `ip.to_string()`; the workloads, quota and key picker
//! are those of `memory_store.rs`. Prints the wall time per decision (noisy
//! on a shared machine) and the share allowed.

use std::process::ExitCode;

mod common;

use common::*;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [limiter, workload, threads, decisions] = args.as_slice() else {
        eprintln!(
            "usage: user_keys_count <ip_text|ip_addr|ip_to_string> <hot|uniform> <threads> <decisions>"
        );
        return ExitCode::FAILURE;
    };
    let Some(limiter) = IpLimiter::all()
        .into_iter()
        .find(|l| l.name().ends_with(&format!("/{limiter}")))
    else {
        eprintln!("no limiter {limiter}");
        return ExitCode::FAILURE;
    };
    let Some(workload) = IpWorkload::all()
        .into_iter()
        .find(|w| w.name == workload.as_str())
    else {
        eprintln!("no workload {workload}");
        return ExitCode::FAILURE;
    };
    let (Ok(threads), Ok(decisions)) = (threads.parse::<usize>(), decisions.parse::<u64>()) else {
        eprintln!("threads and decisions are numbers");
        return ExitCode::FAILURE;
    };
    limiter.fill(&workload);
    let (elapsed, allowed) = run_with(threads.max(1), decisions, |rng| {
        limiter.decide(workload.pick(rng))
    });
    let per = elapsed.as_secs_f64() * 1e9 / decisions.max(1) as f64;
    println!(
        "{} {} {threads}t: {decisions} decisions, {per:.1} ns each, {allowed} allowed",
        limiter.name(),
        workload.name,
    );
    ExitCode::SUCCESS
}
