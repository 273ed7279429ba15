//! What both benches of `MemoryStore` against governor share: the quota, the
//! key picker, the client-IP workloads and the limiters keyed by client IP.

// Each bench uses its own part of this module.
#![allow(dead_code)]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use ratelimit_core::key::IpText;
use ratelimit_core::{MemoryStore, Policy, Rate};

/// The sustained rate, per second, for both libraries.
pub(crate) const RATE_PER_SECOND: u32 = 1_000_000;
/// The burst (GCRA) or capacity (token bucket), for both libraries.
pub(crate) const BURST: u32 = 1_000;
/// Keys in the uniform workload.
pub(crate) const UNIFORM_KEYS: usize = 100_000;
/// The generator's seed for thread `t` is `SEED + t`.
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// Our GCRA policy at the quota above.
pub(crate) fn gcra_policy() -> Policy {
    Policy::gcra(
        u64::from(BURST),
        Rate::per_second(u64::from(RATE_PER_SECOND)),
    )
    .expect("valid policy")
}

/// Governor's quota, the same as ours.
pub(crate) fn governor_quota() -> Quota {
    let rate = NonZeroU32::new(RATE_PER_SECOND).expect("non-zero");
    let burst = NonZeroU32::new(BURST).expect("non-zero");
    Quota::per_second(rate).allow_burst(burst)
}

/// Decides one request of cost 1 for `key` on our store and hands the whole
/// result to `black_box`; returns whether it was allowed.
#[inline]
pub(crate) fn memory_decide(store: &MemoryStore, key: &[u8], policy: &Policy) -> bool {
    let result = store.check_now(key, policy, 1);
    let allowed = matches!(&result, Ok(d) if d.is_allowed());
    let _ = black_box(result);
    allowed
}

/// Hands governor's whole result to `black_box`; returns whether it allowed.
#[inline]
pub(crate) fn governor_allowed<T, E>(result: Result<T, E>) -> bool {
    let allowed = result.is_ok();
    let _ = black_box(result);
    allowed
}

/// xorshift64 (Marsaglia): a cheap, deterministic key picker.
pub(crate) struct XorShift(u64);

impl XorShift {
    pub(crate) fn new(seed: u64) -> Self {
        XorShift(seed.max(1))
    }

    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A value in `0..n`, by multiply-shift (no division).
    #[allow(clippy::cast_possible_truncation)] // the result is below `n`
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

/// Runs `iters` calls of `decide` (each given its thread's generator) split
/// over `threads` threads; returns the wall time and how many returned true.
pub(crate) fn run_with<F>(threads: usize, iters: u64, decide: F) -> (Duration, u64)
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

/// Client IPs, as a layer keyed by peer IP sees them: in hand, as a server
/// has its peer's address. A picked address is computed from its index, so
/// a decision's only memory traffic is the limiter's own (an array of them
/// would add a cache miss of the harness's own to every decision).
pub(crate) struct IpWorkload {
    pub(crate) name: &'static str,
    count: u32,
}

impl IpWorkload {
    /// `hot` (one address) and `uniform` ([`UNIFORM_KEYS`] addresses).
    pub(crate) fn all() -> [IpWorkload; 2] {
        [
            IpWorkload::new("hot", 1),
            IpWorkload::new("uniform", u32::try_from(UNIFORM_KEYS).expect("fits")),
        ]
    }

    fn new(name: &'static str, count: u32) -> Self {
        IpWorkload { name, count }
    }

    /// The workload's address number `index`. Multiplying by an odd
    /// constant is a bijection on u32: distinct, scattered addresses of
    /// every text length.
    #[inline]
    fn ip(index: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(index.wrapping_mul(0x9e37_79b1)))
    }

    /// Every address of the workload.
    pub(crate) fn ips(&self) -> impl Iterator<Item = IpAddr> {
        (0..self.count).map(Self::ip)
    }

    #[inline]
    pub(crate) fn pick(&self, rng: &mut XorShift) -> IpAddr {
        if self.count == 1 {
            Self::ip(0)
        } else {
            #[allow(clippy::cast_possible_truncation)] // below `count`, a u32
            Self::ip(rng.below(self.count as usize) as u32)
        }
    }
}

/// One limiter keyed by client IP, each the way its users key it.
pub(crate) enum IpLimiter {
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
    /// The three, in the order a round runs them.
    pub(crate) fn all() -> [IpLimiter; 3] {
        [
            IpLimiter::IpText(MemoryStore::new(), gcra_policy()),
            IpLimiter::Governor(RateLimiter::keyed(governor_quota())),
            IpLimiter::ToString(MemoryStore::new(), gcra_policy()),
        ]
    }

    /// `memory/gcra/ip_text`, `memory/gcra/ip_to_string` or
    /// `governor/gcra/ip_addr`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            IpLimiter::IpText(..) => "memory/gcra/ip_text",
            IpLimiter::ToString(..) => "memory/gcra/ip_to_string",
            IpLimiter::Governor(_) => "governor/gcra/ip_addr",
        }
    }

    /// Gives every address of `workload` one decision, so that measurement
    /// sees existing keys.
    pub(crate) fn fill(&self, workload: &IpWorkload) {
        for ip in workload.ips() {
            black_box(self.decide(ip));
        }
    }

    #[inline]
    pub(crate) fn decide(&self, ip: IpAddr) -> bool {
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
