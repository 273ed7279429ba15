//! A key-rotation attack on `MemoryStore`: how much memory the store holds
//! while an attacker sends more distinct keys than it may hold.
//!
//! ```text
//! cargo run --release -p ratelimit-examples --example memory_attack
//! cargo run --release -p ratelimit-examples --example memory_attack -- \
//!     --max-keys 100000 --keys 2000000 --algorithm all
//! ```
//!
//! Each run fills a store bounded to `--max-keys` (default 100,000) by
//! rotating `--keys` distinct keys (default 2,000,000) through `check_now`,
//! and prints one JSON line:
//!
//! ```text
//! {"algorithm":"fixed-window","scenario":"long-window","max_keys":100000,
//!  "attempted_keys":2000000,"held_keys":99968,"full_errors":1900032,
//!  "bytes":..,"bytes_per_key":..,"rss_bytes":..,"secs":..}
//! ```
//!
//! Two scenarios per algorithm:
//!
//! - `long-window`: a window of an hour, so nothing expires. The store fills
//!   up to its bound and then refuses new keys (`StoreError::Full`, which the
//!   tower layer answers with 503) while serving the keys it holds exactly.
//! - `expiring`: a window of one second on a manual clock that advances so
//!   that about half the bound is live at any time. Expired keys are
//!   reclaimed, so the store stays under its bound with (almost) no refusals.
//!
//! `bytes` is the heap the store holds after the attack, counted by a
//! counting global allocator (the `cap` crate: no `unsafe` here); `rss_bytes`
//! is the growth of the process's resident set (`/proc/self/statm`, Linux),
//! which includes the allocator's own overhead. The sliding log keeps three
//! entries per key.
//!
//! The process exits with status 1 if any store ever held more than
//! `--max-keys` keys.

use std::alloc::System;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cap::Cap;
use clap::Parser;
use clap::builder::PossibleValuesParser;
use ratelimit_core::clock::ManualClock;
use ratelimit_core::{AlgorithmKind, MemoryStore, Policy, StoreError};
use ratelimit_examples::{exit_with_flag_error, policy_for};

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// The algorithms `--algorithm all` attacks, in this order.
const ATTACKED: [AlgorithmKind; 4] = [
    AlgorithmKind::FixedWindow,
    AlgorithmKind::Gcra,
    AlgorithmKind::TokenBucket,
    AlgorithmKind::SlidingLog,
];

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "memory_attack",
    about = "A key-rotation attack on MemoryStore: one JSON line per algorithm and scenario."
)]
struct Args {
    /// The most keys the store may hold.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    max_keys: usize,
    /// How many distinct keys the attacker rotates.
    #[arg(long, value_name = "M", default_value_t = 2_000_000)]
    keys: u64,
    /// The algorithm attacked, or all of them.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "fixed-window",
        value_parser = PossibleValuesParser::new(ATTACKED.map(AlgorithmKind::name).into_iter().chain(["all"]))
    )]
    algorithm: String,
}

impl Args {
    /// The algorithms `--algorithm` names.
    fn algorithms(&self) -> Vec<AlgorithmKind> {
        match self.algorithm.parse::<AlgorithmKind>() {
            Ok(kind) => vec![kind],
            // "all", the only other value the parser lets through.
            Err(_) => ATTACKED.to_vec(),
        }
    }
}

/// `algorithm` with a budget of 10 per `window`.
fn policy(algorithm: AlgorithmKind, window: Duration) -> Policy {
    policy_for(algorithm, 10, window).unwrap_or_else(|e| {
        exit_with_flag_error::<Args>(format_args!("--algorithm {algorithm}: {e}"))
    })
}

/// The resident set size of this process in bytes (Linux; 0 elsewhere).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

struct Report {
    held_keys: usize,
    max_held: usize,
    full_errors: u64,
    bytes: usize,
    rss_bytes: u64,
    secs: f64,
}

/// The scenarios: how fast the clock runs while keys rotate.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scenario {
    /// An hour-long window on a clock that stands still: nothing expires.
    LongWindow,
    /// A one-second window; keys arrive so that about `max_keys / 2` of
    /// them are live at a time.
    Expiring,
    /// A one-second window; keys arrive so that about `2 * max_keys` would
    /// be live at a time: shards stay full and refuse about half the new
    /// keys, and (except for the aligned fixed window) keys expire one by one.
    Saturated,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::LongWindow => "long-window",
            Scenario::Expiring => "expiring",
            Scenario::Saturated => "saturated",
        }
    }
}

/// Rotates `keys` distinct keys through a store bounded to `max_keys`, with
/// the clock of `scenario`.
fn attack(algorithm: AlgorithmKind, max_keys: usize, keys: u64, scenario: Scenario) -> Report {
    let expiring = scenario != Scenario::LongWindow;
    let window = if expiring {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(3600)
    };
    let policy = policy(algorithm, window);
    // Entries per key: a sliding log with a few entries, one state otherwise.
    let checks_per_key = if algorithm == AlgorithmKind::SlidingLog {
        3
    } else {
        1
    };
    let max = u64::try_from(max_keys).unwrap_or(u64::MAX);
    let live = match scenario {
        Scenario::Saturated => max.saturating_mul(2),
        _ => max / 2,
    };
    // How long one key stays after its checks: the step makes `live` keys
    // arrive in that time.
    let lifetime_ns = {
        let probe = MemoryStore::builder().clock(ManualClock::new(0)).build();
        let mut reset = 0;
        for _ in 0..checks_per_key {
            reset = probe
                .check_now(b"probe", &policy, 1)
                .map_or(0, |d| d.reset_after_micros());
        }
        reset.saturating_mul(1_000)
    };
    let step_ns = (lifetime_ns / live.max(1)).max(1);

    let heap_before = ALLOCATOR.allocated();
    let rss_before = rss_bytes();
    let started = Instant::now();
    let clock = ManualClock::new(1_000_000_000);
    let store = MemoryStore::builder()
        .max_keys(max_keys)
        .clock(clock.clone())
        .build();
    // The attack's time in nanoseconds; the clock (whole µs) follows it.
    let mut elapsed_ns: u64 = 0;
    let mut key = String::with_capacity(32);
    let mut full_errors = 0;
    let mut max_held = 0;
    for i in 0..keys {
        key.clear();
        use std::fmt::Write as _;
        let _ = write!(key, "client-{i}");
        for check in 0..checks_per_key {
            if check > 0 {
                // Sliding-log entries a microsecond apart are separate entries.
                clock.advance(Duration::from_micros(1));
            }
            match store.check_now(key.as_bytes(), &policy, 1) {
                Ok(_) => {}
                Err(StoreError::Full { .. }) => {
                    full_errors += 1;
                    break;
                }
                Err(e) => panic!("unexpected store error: {e}"),
            }
        }
        if expiring {
            // Keys arrive at a steady pace, refused or not.
            let before = elapsed_ns / 1_000;
            elapsed_ns += step_ns;
            clock.advance(Duration::from_micros(elapsed_ns / 1_000 - before));
        }
        if i % 10_000 == 0 {
            max_held = max_held.max(store.len());
        }
    }
    let held_keys = store.len();
    max_held = max_held.max(held_keys);
    let secs = started.elapsed().as_secs_f64();
    let bytes = ALLOCATOR.allocated().saturating_sub(heap_before);
    let rss = rss_bytes().saturating_sub(rss_before);
    drop(store);
    Report {
        held_keys,
        max_held,
        full_errors,
        bytes,
        rss_bytes: rss,
        secs,
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut over_bound = false;
    for algorithm in args.algorithms() {
        for scenario in [
            Scenario::LongWindow,
            Scenario::Expiring,
            Scenario::Saturated,
        ] {
            let r = attack(algorithm, args.max_keys, args.keys, scenario);
            let scenario = scenario.name();
            let per_key = if r.held_keys == 0 {
                0.0
            } else {
                r.bytes as f64 / r.held_keys as f64
            };
            let fields = [
                ("algorithm", format!("\"{algorithm}\"")),
                ("scenario", format!("\"{scenario}\"")),
                ("max_keys", args.max_keys.to_string()),
                ("attempted_keys", args.keys.to_string()),
                ("held_keys", r.held_keys.to_string()),
                ("max_held_keys", r.max_held.to_string()),
                ("full_errors", r.full_errors.to_string()),
                ("bytes", r.bytes.to_string()),
                ("bytes_per_key", format!("{per_key:.1}")),
                (
                    "bytes_per_max_key",
                    format!("{:.1}", r.bytes as f64 / args.max_keys as f64),
                ),
                ("rss_bytes", r.rss_bytes.to_string()),
                ("secs", format!("{:.3}", r.secs)),
                (
                    "ns_per_attempt",
                    format!("{:.0}", r.secs * 1e9 / args.keys.max(1) as f64),
                ),
            ];
            let json: Vec<String> = fields
                .iter()
                .map(|(name, value)| format!("\"{name}\":{value}"))
                .collect();
            println!("{{{}}}", json.join(","));
            if r.max_held > args.max_keys {
                eprintln!(
                    "{algorithm}/{scenario}: held {} keys, over the bound of {}",
                    r.max_held, args.max_keys
                );
                over_bound = true;
            }
        }
    }
    if over_bound {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
