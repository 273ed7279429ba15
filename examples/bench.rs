//! Decisions per second of a store, as one JSON line (a contract other tools
//! rely on):
//!
//! ```text
//! cargo run --release --example bench -- --store <memory|redis> [--redis URL] [--cluster] \
//!     [--pool <own|bb8>] --algorithm <name> --keys <N> --concurrency <C> --requests <R> \
//!     [--limit L] [--window D]
//! {"store":"memory","algorithm":"gcra","keys":100000,"concurrency":64,"decisions":1000000,
//!  "allowed":..,"denied":..,"secs":..,"per_sec":..,"p50_us":..,"p99_us":..,
//!  "max_batch":..,"mean_batch":..,"pool":"own"}
//! ```
//!
//! `C` tasks share `R` decisions; each draws its key uniformly from `N` keys
//! (`--keys 1` is one hot key). The policy is `--limit` per `--window`
//! (default 1000 per 1s; for bucket algorithms the burst, refilled over the
//! window). The store is `MemoryStore` or `RedisStore` (one node, or a
//! cluster with `--cluster` and `--redis` given per node or comma-separated),
//! with `--connections` multiplexed connections (default 4) and batches of
//! at most `--max-batch` requests (default 64, 1: no coalescing);
//! `mean_batch` is the mean number of requests per call (0 for memory).
//! `--pool bb8` decides on a `bb8` pool of `--connections` connections
//! instead, as an application hands its own pool to the store (one node).
//!
//! With Redis, `--denied-cache` answers known denials locally
//! ([`DeniedCache`]) and `--lease B` also leases hot keys' budget in batches
//! of `B` ([`LeasedStore`], approximate).
//!
//! `--print-library` prints the Redis Functions library the store loads, and
//! `--print-function` the name of its function that decides one request under
//! `--algorithm` (`FCALL` it as the script below, after `FUNCTION LOAD`).
//!
//! `--print-script` prints the Lua script that decides one request under
//! `--algorithm` and exits: `scripts/bench-redis` loads it into Redis to
//! measure Redis alone with `redis-benchmark`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use ratelimit_core::AlgorithmKind;
use ratelimit_core::redis::bb8_redis::RedisConnectionManager;
use ratelimit_core::redis::{RedisStore, bb8};
use ratelimit_core::{Decision, DeniedCache, LeasedStore, MemoryStore, Policy, Store, StoreError};
use ratelimit_examples::{
    algorithm_parser, exit_with_flag_error, nonzero_duration, policy_for, redis_url,
};

#[derive(Clone)]
enum AnyStore {
    Memory(MemoryStore),
    Redis(RedisStore),
    Cached(DeniedCache<RedisStore>),
    Leased(DeniedCache<LeasedStore<RedisStore>>),
}

impl AnyStore {
    async fn check(&self, key: &[u8], policy: &Policy) -> Result<Decision, StoreError> {
        match self {
            AnyStore::Memory(s) => s.check(key, policy, 1).await,
            AnyStore::Redis(s) => s.check(key, policy, 1).await,
            AnyStore::Cached(s) => s.check(key, policy, 1).await,
            AnyStore::Leased(s) => s.check(key, policy, 1).await,
        }
    }
}

/// `--pool`: whose connections a single-node `RedisStore` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PoolKind {
    /// The store's own multiplexed connections (the default).
    Own,
    /// A `bb8` pool, as an application would hand it to the store.
    Bb8,
}

/// `--store`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StoreKind {
    /// `MemoryStore`.
    Memory,
    /// `RedisStore`.
    Redis,
}

/// The printing modes, any of which makes the load flags optional.
const PRINTING: [&str; 3] = ["print_script", "print_function", "print_library"];

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "bench",
    about = "Decisions per second of a store, as one JSON line."
)]
struct Args {
    /// The store to measure.
    #[arg(long, value_enum, required_unless_present_any = PRINTING)]
    store: Option<StoreKind>,
    /// Redis URLs (repeated or comma-separated; several with --cluster).
    #[arg(long, value_name = "URL", value_delimiter = ',', value_parser = redis_url,
          default_value = "redis://127.0.0.1:6379")]
    redis: Vec<String>,
    /// The Redis URLs are nodes of a Redis Cluster.
    #[arg(long)]
    cluster: bool,
    /// Multiplexed connections to Redis.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    connections: u32,
    /// Whose connections: the store's own, or a bb8 pool of --connections
    /// (one node).
    #[arg(long, value_enum, default_value = "own", conflicts_with = "cluster")]
    pool: PoolKind,
    /// The most requests coalesced into one Redis call (1: none; 64 is the
    /// store's default).
    #[arg(long, value_name = "N", default_value_t = 64,
          value_parser = positive_usize)]
    max_batch: usize,
    /// Answer known denials locally (`DeniedCache`).
    #[arg(long)]
    denied_cache: bool,
    /// Lease hot keys' budget in batches of B (`LeasedStore`).
    #[arg(long, value_name = "B", value_parser = clap::value_parser!(u64).range(1..))]
    lease: Option<u64>,
    /// Print the Lua script deciding one request under --algorithm, and exit.
    #[arg(long, requires = "algorithm")]
    print_script: bool,
    /// Print the name of the function deciding one request under
    /// --algorithm, and exit.
    #[arg(long, requires = "algorithm")]
    print_function: bool,
    /// Print the Redis Functions library the store loads, and exit.
    #[arg(long)]
    print_library: bool,
    /// The algorithm.
    #[arg(long, value_name = "NAME", value_parser = algorithm_parser(),
          required_unless_present = "print_library")]
    algorithm: Option<AlgorithmKind>,
    /// Keys drawn from, uniformly (1: one hot key).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..),
          required_unless_present_any = PRINTING)]
    keys: Option<u64>,
    /// Tasks deciding at once.
    #[arg(long, value_name = "C", value_parser = clap::value_parser!(u64).range(1..),
          required_unless_present_any = PRINTING)]
    concurrency: Option<u64>,
    /// Decisions in all.
    #[arg(long, value_name = "R", value_parser = clap::value_parser!(u64).range(1..),
          required_unless_present_any = PRINTING)]
    requests: Option<u64>,
    /// The limit per window (the burst for bucket algorithms).
    #[arg(long, value_name = "L", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    limit: u64,
    /// The window (or the refill period, or the lease).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = nonzero_duration)]
    window: Duration,
    /// The runtime's worker threads (default: one per core). One thread
    /// compares with a one-threaded client such as `redis-benchmark`.
    #[arg(long, value_name = "N", value_parser = positive_usize)]
    threads: Option<usize>,
}

/// Appends `n` in decimal: the key drawn for each request, written as
/// `format!` would write it at a fraction of its cost (the harness's own
/// work, which a server reading keys from requests does not have).
fn push_decimal(buffer: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buffer.extend_from_slice(&digits[start..]);
}

/// A `usize` above zero (a value parser).
fn positive_usize(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{text:?} is not a positive integer")),
    }
}

fn main() {
    let args = Args::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = args.threads {
        runtime.worker_threads(threads);
    }
    match runtime.enable_all().build() {
        Ok(runtime) => runtime.block_on(run(args)),
        Err(e) => {
            eprintln!("bench: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    }
}

/// Runs what the flags ask for.
async fn run(args: Args) {
    if args.print_library {
        print!("{}", ratelimit_core::redis::function_library());
        return;
    }
    // Present unless printing the library (clap's `required_unless_present`).
    let Some(algorithm) = args.algorithm else {
        exit_with_flag_error::<Args>("--algorithm is required");
    };
    let policy = match policy_for(algorithm, args.limit, args.window) {
        Ok(policy) => policy,
        Err(message) => exit_with_flag_error::<Args>(format!("--algorithm: {message}")),
    };
    if args.print_script {
        print!(
            "{}",
            ratelimit_core::redis::script_source(policy.algorithm())
        );
        return;
    }
    if args.print_function {
        println!(
            "{}",
            ratelimit_core::redis::function_name(policy.algorithm())
        );
        return;
    }
    // Present unless printing (clap's `required_unless_present_any`).
    let (Some(kind), Some(key_count), Some(concurrency), Some(requests)) =
        (args.store, args.keys, args.concurrency, args.requests)
    else {
        exit_with_flag_error::<Args>("--store, --keys, --concurrency and --requests are required");
    };
    // The Redis store, to read its coalescing's mean batch at the end.
    let mut redis_store: Option<RedisStore> = None;
    let store = match kind {
        StoreKind::Memory => AnyStore::Memory(MemoryStore::new()),
        StoreKind::Redis => {
            let builder = if args.cluster {
                RedisStore::cluster_builder(args.redis.clone())
            } else if args.pool == PoolKind::Bb8 {
                let pool = RedisConnectionManager::new(args.redis[0].as_str()).map(|manager| {
                    bb8::Pool::builder()
                        .max_size(args.connections)
                        .build_unchecked(manager)
                });
                match pool {
                    Ok(pool) => RedisStore::bb8_builder(pool),
                    Err(e) => {
                        eprintln!("bench: cannot use Redis: {e}");
                        std::process::exit(1);
                    }
                }
            } else {
                RedisStore::builder(args.redis[0].clone())
            };
            match builder
                .pool_size(args.connections)
                .max_batch(args.max_batch)
                .call_timeout(Duration::from_secs(5))
                .prefix("bench")
                .build()
                .await
            {
                Ok(store) => {
                    redis_store = Some(store.clone());
                    if let Some(lease) = args.lease {
                        AnyStore::Leased(DeniedCache::new(
                            LeasedStore::builder(store).batch(lease).build(),
                        ))
                    } else if args.denied_cache {
                        AnyStore::Cached(DeniedCache::new(store))
                    } else {
                        AnyStore::Redis(store)
                    }
                }
                Err(e) => {
                    eprintln!("bench: cannot use Redis: {e}");
                    std::process::exit(1);
                }
            }
        }
    };
    let next = Arc::new(AtomicU64::new(0));
    let allowed = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let (store, policy) = (store.clone(), policy.clone());
        let (next, allowed, errors) = (next.clone(), allowed.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng =
                0x9e37_79b9_7f4a_7c15_u64 ^ (task + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
            let mut latencies = Vec::new();
            // Each key is written into this buffer when drawn, as a server
            // reads it from its request. A table of keys made once would
            // cost two cache misses per decision (its entry, then the key's
            // bytes), which a server does not pay.
            let mut key = Vec::with_capacity(24);
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                key.clear();
                key.push(b'k');
                push_decimal(&mut key, rng % key_count);
                let begun = Instant::now();
                match store.check(&key, &policy).await {
                    Ok(d) if d.is_allowed() => {
                        allowed.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                            eprintln!("bench: first error: {e}");
                        }
                    }
                }
                latencies.push(u64::try_from(begun.elapsed().as_micros()).unwrap_or(u64::MAX));
            }
            latencies
        }));
    }
    let mut latencies = Vec::with_capacity(usize::try_from(requests).unwrap_or(0));
    for task in tasks {
        latencies.extend(task.await.unwrap_or_default());
    }
    let secs = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |percent: usize| {
        let index = (latencies.len().saturating_sub(1) * percent).div_ceil(100);
        latencies.get(index).copied().unwrap_or(0)
    };
    let decisions = latencies.len() as u64;
    let allowed = allowed.load(Ordering::Relaxed);
    let errors = errors.load(Ordering::Relaxed);
    if errors > 0 {
        eprintln!("bench: {errors} decisions failed");
    }
    println!(
        "{{\"store\":\"{}\",\"algorithm\":\"{}\",\"keys\":{},\"concurrency\":{},\"decisions\":{},\"allowed\":{},\"denied\":{},\"secs\":{:.3},\"per_sec\":{:.0},\"p50_us\":{},\"p99_us\":{},\"max_batch\":{},\"mean_batch\":{:.2},\"pool\":\"{}\"}}",
        match kind {
            StoreKind::Memory => "memory",
            StoreKind::Redis => "redis",
        },
        algorithm,
        key_count,
        concurrency,
        decisions,
        allowed,
        decisions - allowed - errors,
        secs,
        decisions as f64 / secs,
        at(50),
        at(99),
        args.max_batch,
        redis_store.map_or(0.0, |s| s.coalescing().mean_batch()),
        match args.pool {
            PoolKind::Own => "own",
            PoolKind::Bb8 => "bb8",
        },
    );
}

#[cfg(test)]
mod tests {
    use super::push_decimal;

    #[test]
    fn a_number_is_written_as_format_writes_it() {
        for n in [0, 7, 10, 99_999, 1_000_000, u64::MAX] {
            let mut written = b"k".to_vec();
            push_decimal(&mut written, n);
            assert_eq!(written, format!("k{n}").into_bytes());
        }
    }
}
