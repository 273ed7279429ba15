//! Decisions per second of [`MemoryStore::check_now`] next to `governor`'s keyed
//! limiter, on the same workloads, in one criterion group.
//!
//! Bench ids read `<library>/<algorithm>/<workload>/<threads>`:
//!
//! - `memory/gcra/..` and `memory/token_bucket/..`: our store, one policy each;
//! - `governor/gcra/..`: `governor::DefaultKeyedRateLimiter` (a `DashMap` of
//!   atomic GCRA cells, std `RandomState` hasher, quanta clock). Governor only
//!   implements GCRA, which admits exactly what a token bucket of the same
//!   capacity and rate admits, so it is the reference for both of our rows;
//! - workloads: `hot` is one key for every decision, `uniform` draws each
//!   decision's key uniformly from 100,000 keys with a xorshift64 generator
//!   (the same generator and seeds for both libraries, for the hot key it is
//!   not called at all);
//! - `1t` is one thread; `2t` is two threads (`std::thread::scope`) deciding
//!   `iters / 2` each against the same limiter, timed on the wall clock from a
//!   barrier to the join, so the figure is aggregate throughput.
//!
//! Throughput is `Elements(1)` per iteration: one decision. Every decision costs
//! 1 and its whole result goes through `black_box`.
//!
//! Quota: 1,000,000 per second with bursts of 1,000 for both libraries
//! (`Rate::per_second(1_000_000)`, an emission interval of 1 µs, is the highest
//! rate our policies accept; governor's `Quota::per_second(1_000_000)` has an
//! interval of 1,000 ns). The share of allowed decisions is printed after each
//! row (`regime ...`, counted over warm-up and measurement). Regimes:
//!
//! - `uniform`: a key comes back about every 100,000 decisions, long after it
//!   refilled, so every decision is allowed for both libraries;
//! - `hot`: one key at tens of millions of decisions per second drains the
//!   burst at once, after which about one decision per µs is allowed and the
//!   rest are denied, for both libraries. These rows mostly measure denials.
//!
//! Keys: the same `Vec<u8>` values for both libraries, `client-<n>` formatted
//! once up front. Our store takes `&[u8]`; governor is keyed by `Vec<u8>`.
//! Printable ASCII keys are the fair choice: our store keeps them verbatim,
//! whereas raw binary keys (say a `u64` in 8 big-endian bytes) would be
//! replaced by a SHA-256 digest on every call (see `key::normalize`).
//!
//! Uniform-key limiters are filled with all 100,000 keys before measuring, so
//! the rows measure lookups of existing keys, not inserts.
//!
//! A second group, `user_keys/..`, keys each limiter by client IP the way its
//! users do: ours makes the key as the tower layer's `PeerIp` does
//! ([`IpText`](ratelimit_core::key::IpText): the address's text, on the stack) and calls
//! `MemoryStore::check_now` with GCRA; governor is keyed by `IpAddr`, as
//! tower_governor's `PeerIpKeyExtractor` keys it. `memory/gcra/ip_to_string`
//! makes the key with `ip.to_string()` instead, as `PeerIp` did before, for
//! reference. `hot` is one address; `uniform` 100,000 scattered IPv4
//! addresses of every text length. Rows alternate ours, governor, ours
//! (`to_string`) for each workload and thread count.
//!
//! Run with `cargo bench -p ratelimit-core --bench memory_store`
//! (`-- user_keys` for the second group only).

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use ratelimit_core::{MemoryStore, Policy, Rate};

mod common;

use common::*;

/// Thread counts measured.
const THREADS: [usize; 2] = [1, 2];

/// A set of keys and how decisions pick from it.
struct Workload {
    name: &'static str,
    keys: Vec<Vec<u8>>,
}

impl Workload {
    fn new(name: &'static str, count: usize) -> Self {
        Workload {
            name,
            keys: (0..count)
                .map(|i| format!("client-{i}").into_bytes())
                .collect(),
        }
    }

    #[inline]
    fn pick(&self, rng: &mut XorShift) -> &Vec<u8> {
        if self.keys.len() == 1 {
            &self.keys[0]
        } else {
            &self.keys[rng.below(self.keys.len())]
        }
    }
}

/// One limiter under test: the library, the algorithm, how to decide.
enum Limiter {
    Memory {
        algorithm: &'static str,
        store: MemoryStore,
        policy: Policy,
    },
    Governor(DefaultKeyedRateLimiter<Vec<u8>>),
}

impl Limiter {
    fn memory_gcra() -> Self {
        Limiter::Memory {
            algorithm: "gcra",
            store: MemoryStore::new(),
            policy: gcra_policy(),
        }
    }

    fn memory_token_bucket() -> Self {
        Limiter::Memory {
            algorithm: "token_bucket",
            store: MemoryStore::new(),
            policy: Policy::token_bucket(
                u64::from(BURST),
                Rate::per_second(u64::from(RATE_PER_SECOND)),
            )
            .expect("valid policy"),
        }
    }

    fn governor_gcra() -> Self {
        Limiter::Governor(RateLimiter::keyed(governor_quota()))
    }

    fn id(&self, workload: &Workload, threads: usize) -> String {
        let (library, algorithm) = match self {
            Limiter::Memory { algorithm, .. } => ("memory", *algorithm),
            Limiter::Governor(_) => ("governor", "gcra"),
        };
        format!("{library}/{algorithm}/{}/{threads}t", workload.name)
    }

    /// Decides one request of cost 1 and hands the whole result to `black_box`;
    /// returns whether it was allowed.
    #[inline]
    fn decide(&self, key: &Vec<u8>) -> bool {
        match self {
            Limiter::Memory { store, policy, .. } => memory_decide(store, key, policy),
            Limiter::Governor(limiter) => governor_allowed(limiter.check_key(key)),
        }
    }
}

/// Gives every key of the workload one decision, so measurement sees existing keys.
fn fill(limiter: &Limiter, workload: &Workload) {
    for key in &workload.keys {
        black_box(limiter.decide(key));
    }
}

/// A group with the settings every row here runs with.
fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .throughput(Throughput::Elements(1));
    group
}

/// One row: `decide` (given its thread's generator) on `threads` threads,
/// then the row's regime, over warm-up and measurement (nothing when a
/// filter skipped the row).
fn row<F>(group: &mut BenchmarkGroup<'_, WallTime>, id: &str, threads: usize, decide: F)
where
    F: Fn(&mut XorShift) -> bool + Sync,
{
    let (mut total, mut allowed) = (0u64, 0u64);
    group.bench_function(id, |b| {
        b.iter_custom(|iters| {
            let (elapsed, ok) = run_with(threads, iters, &decide);
            total += iters;
            allowed += ok;
            elapsed
        });
    });
    if total > 0 {
        eprintln!(
            "regime {id}: {:.2}% of {total} decisions allowed",
            100.0 * allowed as f64 / total as f64,
        );
    }
}

fn limiters() -> [Limiter; 3] {
    [
        Limiter::memory_gcra(),
        Limiter::memory_token_bucket(),
        Limiter::governor_gcra(),
    ]
}

fn decisions(c: &mut Criterion) {
    let workloads = [
        Workload::new("hot", 1),
        Workload::new("uniform", UNIFORM_KEYS),
    ];

    let mut group = group(c, "decisions");
    for workload in &workloads {
        for threads in THREADS {
            for limiter in limiters() {
                fill(&limiter, workload);
                let id = limiter.id(workload, threads);
                row(&mut group, &id, threads, |rng| {
                    limiter.decide(workload.pick(rng))
                });
            }
        }
    }
    group.finish();
}

/// Each limiter keyed by client IP the way its users key it: ours through
/// [`IpText`](ratelimit_core::key::IpText) (what `PeerIp` does), governor by `IpAddr`.
fn user_keys(c: &mut Criterion) {
    let mut group = group(c, "user_keys");
    for workload in &IpWorkload::all() {
        for threads in THREADS {
            for limiter in IpLimiter::all() {
                limiter.fill(workload);
                let id = format!("{}/{}/{threads}t", limiter.name(), workload.name);
                row(&mut group, &id, threads, |rng| {
                    limiter.decide(workload.pick(rng))
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, decisions, user_keys);
criterion_main!(benches);
