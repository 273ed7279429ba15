//! The `user_keys` comparison of `memory_store.rs`, measured in pairs: our
//! store keyed as `PeerIp` keys a request ([`IpText`](ratelimit_core::key::IpText))
//! against governor keyed by `IpAddr`, on the same workloads, quota and key
//! picker.
//!
//! Why pairs: on a shared host one limiter's own timings drift within
//! seconds, so rows timed one after the other (as criterion times them)
//! compare moments as much as limiters. Here both limiters are filled once,
//! then strictly alternate in short batches (ours, governor, ours, ...), so
//! every batch follows the other limiter's and finds its own state as cold;
//! each round's ratio compares two batches timed back to back. A process's
//! memory layout is one draw too, which is why `scripts/bench-memory` runs
//! this in several processes.
//!
//! ```sh
//! cargo bench -p ratelimit-core --bench user_keys_paired -- [ROUNDS] [DECISIONS_PER_BATCH]
//! ```
//!
//! Prints, per workload and thread count, the median ns per decision of
//! each and the median of the rounds' ratios (governor's ns ÷ ours: above 1
//! means ours is faster); a median of an even count is the mean of the
//! middle two.
//!
//! `PAIR=ours` or `PAIR=governor` checks the method itself: two instances
//! of that one limiter take the two places, so the ratios show what the
//! pairing alone gives (about 1 when it favours neither place).

use std::process::ExitCode;

mod common;

use common::*;

fn main() -> ExitCode {
    const USAGE: &str = "usage: user_keys_paired [ROUNDS > 0] [DECISIONS_PER_BATCH > 0]";
    // `cargo bench` passes `--bench`; the rest are ours.
    let numbers: Result<Vec<u64>, _> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .map(|a| a.parse())
        .collect();
    let (rounds, batch) = match numbers.as_deref() {
        Ok([]) => (30, 200_000),
        Ok(&[rounds]) => (rounds, 200_000),
        Ok(&[rounds, batch]) => (rounds, batch),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    if rounds == 0 || batch == 0 {
        eprintln!("{USAGE}");
        return ExitCode::FAILURE;
    }
    let pair = match std::env::var("PAIR").as_deref() {
        Err(std::env::VarError::NotPresent) => Pair::OursAndGovernor,
        Ok("ours") => Pair::Twice(0),
        Ok("governor") => Pair::Twice(1),
        _ => {
            eprintln!("{USAGE}\nPAIR, when set, is `ours` or `governor`");
            return ExitCode::FAILURE;
        }
    };
    let (first, second) = match pair {
        Pair::OursAndGovernor => ("ours_ns", "governor_ns"),
        Pair::Twice(_) => ("first_ns", "second_ns"),
    };
    println!("workload threads {first} {second} ratio");
    for workload in &IpWorkload::all() {
        for threads in [1, 2] {
            let (ours, governor) = pair.limiters();
            ours.fill(workload);
            governor.fill(workload);
            let time = |limiter: &IpLimiter| {
                let (elapsed, _) =
                    run_with(threads, batch, |rng| limiter.decide(workload.pick(rng)));
                elapsed.as_secs_f64() * 1e9 / batch as f64
            };
            let (mut ours_ns, mut governor_ns, mut ratios) = (vec![], vec![], vec![]);
            for _ in 0..rounds {
                let o = time(&ours);
                let g = time(&governor);
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

/// The two limiters a run compares.
#[derive(Clone, Copy)]
enum Pair {
    /// Ours in the first place, governor in the second.
    OursAndGovernor,
    /// Two instances of the limiter at this index of [`IpLimiter::all`].
    Twice(usize),
}

impl Pair {
    fn limiters(self) -> (IpLimiter, IpLimiter) {
        match self {
            Pair::OursAndGovernor => {
                let [ours, governor, _] = IpLimiter::all();
                (ours, governor)
            }
            Pair::Twice(index) => {
                let first = IpLimiter::all().into_iter().nth(index);
                let second = IpLimiter::all().into_iter().nth(index);
                (
                    first.expect("an index of all()"),
                    second.expect("an index of all()"),
                )
            }
        }
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[middle - 1] + values[middle]) / 2.0
    } else {
        values[middle]
    }
}
