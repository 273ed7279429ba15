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
//! ([`IpText`]: the address's text, on the stack) and calls
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
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use ratelimit_core::key::IpText;
use ratelimit_core::{MemoryStore, Policy, Rate};

/// The sustained rate, per second, for both libraries.
const RATE_PER_SECOND: u32 = 1_000_000;
/// The burst (GCRA) or capacity (token bucket), for both libraries.
const BURST: u32 = 1_000;
/// Keys in the uniform workload.
const UNIFORM_KEYS: usize = 100_000;
/// Thread counts measured.
const THREADS: [usize; 2] = [1, 2];
/// The generator's seed for thread `t` is `SEED + t`.
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// Our GCRA policy at the quota above.
fn gcra_policy() -> Policy {
    Policy::gcra(
        u64::from(BURST),
        Rate::per_second(u64::from(RATE_PER_SECOND)),
    )
    .expect("valid policy")
}

/// Governor's quota, the same as ours.
fn governor_quota() -> Quota {
    let rate = NonZeroU32::new(RATE_PER_SECOND).expect("non-zero");
    let burst = NonZeroU32::new(BURST).expect("non-zero");
    Quota::per_second(rate).allow_burst(burst)
}

/// Decides one request of cost 1 for `key` on our store and hands the whole
/// result to `black_box`; returns whether it was allowed.
#[inline]
fn memory_decide(store: &MemoryStore, key: &[u8], policy: &Policy) -> bool {
    let result = store.check_now(key, policy, 1);
    let allowed = matches!(&result, Ok(d) if d.is_allowed());
    let _ = black_box(result);
    allowed
}

/// Hands governor's whole result to `black_box`; returns whether it allowed.
#[inline]
fn governor_allowed<T, E>(result: Result<T, E>) -> bool {
    let allowed = result.is_ok();
    let _ = black_box(result);
    allowed
}

/// xorshift64 (Marsaglia): a cheap, deterministic key picker.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        XorShift(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A value in `0..n`, by multiply-shift (no division).
    #[allow(clippy::cast_possible_truncation)] // the result is below `n`
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

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

/// Runs `iters` calls of `decide` (each given its thread's generator) split
/// over `threads` threads; returns the wall time and how many returned true.
fn run_with<F>(threads: usize, iters: u64, decide: F) -> (Duration, u64)
where
    F: Fn(&mut XorShift) -> bool + Sync,
{
    let work = |thread: usize, n: u64| {
        let mut rng = XorShift::new(SEED + thread as u64);
        let mut allowed = 0;
        for _ in 0..n {
            allowed += u64::from(decide(&mut rng));
        }
        allowed
    };
    if threads == 1 {
        let start = Instant::now();
        let allowed = work(0, iters);
        return (start.elapsed(), allowed);
    }
    let barrier = Barrier::new(threads + 1);
    let (barrier, work) = (&barrier, &work);
    let per_thread = iters / threads as u64;
    let extra = iters % threads as u64;
    thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let n = per_thread + u64::from((t as u64) < extra);
                s.spawn(move || {
                    barrier.wait();
                    work(t, n)
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let allowed = handles
            .into_iter()
            .map(|h| h.join().expect("bench thread panicked"))
            .sum();
        (start.elapsed(), allowed)
    })
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

/// Client IPs, as a layer keyed by peer IP sees them.
struct IpWorkload {
    name: &'static str,
    ips: Vec<IpAddr>,
}

impl IpWorkload {
    fn new(name: &'static str, count: u32) -> Self {
        // Multiplying by an odd constant is a bijection on u32: distinct,
        // scattered addresses of every text length.
        let ips = (0..count)
            .map(|i| IpAddr::V4(Ipv4Addr::from(i.wrapping_mul(0x9e37_79b1))))
            .collect();
        IpWorkload { name, ips }
    }

    #[inline]
    fn pick(&self, rng: &mut XorShift) -> IpAddr {
        if self.ips.len() == 1 {
            self.ips[0]
        } else {
            self.ips[rng.below(self.ips.len())]
        }
    }
}

/// One limiter keyed by client IP, each the way its users key it.
enum IpLimiter {
    /// Our store, the key made as `PeerIp` makes it: [`IpText`], the
    /// address's text on the stack.
    IpText(MemoryStore, Policy),
    /// Our store, the key made with `ip.to_string()` (how `PeerIp` made it
    /// before `IpText`), for reference.
    ToString(MemoryStore, Policy),
    /// `governor::DefaultKeyedRateLimiter<IpAddr>`, as tower_governor's
    /// `PeerIpKeyExtractor` keys it.
    Governor(DefaultKeyedRateLimiter<IpAddr>),
}

impl IpLimiter {
    fn all() -> [IpLimiter; 3] {
        [
            IpLimiter::IpText(MemoryStore::new(), gcra_policy()),
            IpLimiter::Governor(RateLimiter::keyed(governor_quota())),
            IpLimiter::ToString(MemoryStore::new(), gcra_policy()),
        ]
    }

    fn id(&self, workload: &IpWorkload, threads: usize) -> String {
        let name = match self {
            IpLimiter::IpText(..) => "memory/gcra/ip_text",
            IpLimiter::ToString(..) => "memory/gcra/ip_to_string",
            IpLimiter::Governor(_) => "governor/gcra/ip_addr",
        };
        format!("{name}/{}/{threads}t", workload.name)
    }

    #[inline]
    fn decide(&self, ip: IpAddr) -> bool {
        match self {
            IpLimiter::IpText(store, policy) => {
                memory_decide(store, IpText::new(ip).as_bytes(), policy)
            }
            IpLimiter::ToString(store, policy) => {
                memory_decide(store, ip.to_string().as_bytes(), policy)
            }
            IpLimiter::Governor(limiter) => governor_allowed(limiter.check_key(&ip)),
        }
    }
}

/// Each limiter keyed by client IP the way its users key it: ours through
/// [`IpText`] (what `PeerIp` does), governor by `IpAddr`.
fn user_keys(c: &mut Criterion) {
    let workloads = [
        IpWorkload::new("hot", 1),
        IpWorkload::new("uniform", u32::try_from(UNIFORM_KEYS).expect("fits")),
    ];
    let mut group = group(c, "user_keys");
    for workload in &workloads {
        for threads in THREADS {
            for limiter in IpLimiter::all() {
                for &ip in &workload.ips {
                    black_box(limiter.decide(ip));
                }
                let id = limiter.id(workload, threads);
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
