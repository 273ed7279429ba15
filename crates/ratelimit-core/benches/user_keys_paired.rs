//! The `user_keys` comparison of `memory_store.rs`, measured in pairs: our
//! store keyed as `PeerIp` keys a request ([`IpText`](ratelimit_core::key::IpText))
//! against governor keyed by `IpAddr`, on the same workloads, quota and key
//! picker.
//!
//! Why pairs: on a shared host one limiter's own timings drift by up to
//! 1.5x within seconds, so rows timed one after the other (as criterion
//! times them) compare moments as much as limiters. Here both limiters are
//! filled once, then alternate in short batches, the order swapped every
//! round, and each round's ratio compares two batches timed back to back.
//! A process's memory layout is one draw too, which is why
//! `scripts/bench-memory` runs this in several processes.
//!
//! ```sh
//! cargo bench -p ratelimit-core --bench user_keys_paired -- [ROUNDS] [DECISIONS_PER_BATCH]
//! ```
//!
//! Prints, per workload and thread count, the median ns per decision of
//! each and the median of the rounds' ratios (governor's ns ÷ ours: above 1
//! means ours is faster).

use std::process::ExitCode;

mod common;

use common::*;

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`; only numbers are ours.
    let numbers: Vec<u64> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .map(|a| a.parse())
        .collect::<Result<_, _>>()
        .unwrap_or_default();
    let (rounds, batch) = match numbers.as_slice() {
        [] => (30, 200_000),
        [rounds] => (*rounds, 200_000),
        [rounds, batch, ..] => (*rounds, *batch),
    };
    if rounds == 0 || batch == 0 {
        eprintln!("usage: user_keys_paired [ROUNDS > 0] [DECISIONS_PER_BATCH > 0]");
        return ExitCode::FAILURE;
    }
    println!("workload threads ours_ns governor_ns ratio");
    for workload in &IpWorkload::all() {
        for threads in [1, 2] {
            let [ours, governor, _] = IpLimiter::all();
            ours.fill(workload);
            governor.fill(workload);
            let time = |limiter: &IpLimiter| {
                let (elapsed, _) =
                    run_with(threads, batch, |rng| limiter.decide(workload.pick(rng)));
                elapsed.as_secs_f64() * 1e9 / batch as f64
            };
            let (mut ours_ns, mut governor_ns, mut ratios) = (vec![], vec![], vec![]);
            for round in 0..rounds {
                let (o, g) = if round % 2 == 0 {
                    let o = time(&ours);
                    (o, time(&governor))
                } else {
                    let g = time(&governor);
                    (time(&ours), g)
                };
                ours_ns.push(o);
                governor_ns.push(g);
                ratios.push(g / o);
            }
            println!(
                "{} {threads} {:.1} {:.1} {:.3}",
                workload.name,
                median(&mut ours_ns),
                median(&mut governor_ns),
                median(&mut ratios),
            );
        }
    }
    ExitCode::SUCCESS
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
