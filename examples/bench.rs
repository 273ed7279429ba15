//! Decisions per second of a store, as one JSON line (a contract other tools
//! rely on):
//!
//! ```text
//! cargo run --release --example bench -- --store <memory|redis> [--redis URL] [--cluster] \
//!     --algorithm <name> --keys <N> --concurrency <C> --requests <R> [--limit L] [--window D]
//! {"store":"memory","algorithm":"gcra","keys":100000,"concurrency":64,"decisions":1000000,
//!  "allowed":..,"denied":..,"secs":..,"per_sec":..,"p50_us":..,"p99_us":..,
//!  "max_batch":..,"mean_batch":..}
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

use ratelimit_core::redis::RedisStore;
use ratelimit_core::{Decision, DeniedCache, LeasedStore, MemoryStore, Policy, Store, StoreError};
use ratelimit_examples::{parse_duration, policy_from_flags};

const USAGE: &str = "usage: bench --store <memory|redis> [--redis URL] [--cluster] [--connections N] [--max-batch N] [--denied-cache] [--lease B] --algorithm <name> --keys <N> --concurrency <C> --requests <R> [--limit L] [--window DURATION]\n       bench --print-script --algorithm <name>\n       bench --print-function --algorithm <name>\n       bench --print-library";

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

struct Args {
    store: String,
    redis: Vec<String>,
    cluster: bool,
    connections: u32,
    max_batch: usize,
    denied_cache: bool,
    lease: u64,
    print_script: bool,
    print_function: bool,
    print_library: bool,
    algorithm: String,
    keys: u64,
    concurrency: u64,
    requests: u64,
    limit: u64,
    window: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        store: String::new(),
        redis: Vec::new(),
        cluster: false,
        connections: 4,
        max_batch: ratelimit_core::redis::DEFAULT_MAX_BATCH,
        denied_cache: false,
        lease: 0,
        print_script: false,
        print_function: false,
        print_library: false,
        algorithm: String::new(),
        keys: 0,
        concurrency: 0,
        requests: 0,
        limit: 1000,
        window: Duration::from_secs(1),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let number = |name: &str, v: String| {
            v.parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{name} must be a positive integer, not {v:?}"))
        };
        match flag.as_str() {
            "--store" => args.store = value("--store")?,
            "--redis" => args
                .redis
                .extend(value("--redis")?.split(',').map(str::to_owned)),
            "--cluster" => args.cluster = true,
            "--connections" => {
                args.connections = u32::try_from(number("--connections", value("--connections")?)?)
                    .map_err(|_| String::from("--connections is too large"))?;
            }
            "--max-batch" => {
                args.max_batch = usize::try_from(number("--max-batch", value("--max-batch")?)?)
                    .map_err(|_| String::from("--max-batch is too large"))?;
            }
            "--print-script" => args.print_script = true,
            "--print-function" => args.print_function = true,
            "--print-library" => args.print_library = true,
            "--denied-cache" => args.denied_cache = true,
            "--lease" => args.lease = number("--lease", value("--lease")?)?,
            "--algorithm" => args.algorithm = value("--algorithm")?,
            "--keys" => args.keys = number("--keys", value("--keys")?)?,
            "--concurrency" => args.concurrency = number("--concurrency", value("--concurrency")?)?,
            "--requests" => args.requests = number("--requests", value("--requests")?)?,
            "--limit" => args.limit = number("--limit", value("--limit")?)?,
            "--window" => args.window = parse_duration(&value("--window")?)?,
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    if args.print_library {
        return Ok(args);
    }
    if args.print_script || args.print_function {
        return if args.algorithm.is_empty() {
            Err(String::from(
                "--print-script and --print-function need --algorithm",
            ))
        } else {
            Ok(args)
        };
    }
    if !matches!(args.store.as_str(), "memory" | "redis") {
        return Err(String::from("--store must be memory or redis"));
    }
    if args.algorithm.is_empty() || args.keys == 0 || args.concurrency == 0 || args.requests == 0 {
        return Err(String::from(
            "--algorithm, --keys, --concurrency and --requests are required",
        ));
    }
    if args.store == "redis" && args.redis.is_empty() {
        args.redis.push(String::from("redis://127.0.0.1:6379"));
    }
    Ok(args)
}

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("bench: {message}\n{USAGE}");
            std::process::exit(2);
        }
    };
    if args.print_library {
        print!("{}", ratelimit_core::redis::function_library());
        return;
    }
    let policy = match policy_from_flags(&args.algorithm, args.limit, args.window) {
        Ok(policy) => policy,
        Err(message) => {
            eprintln!("bench: --algorithm: {message}\n{USAGE}");
            std::process::exit(2);
        }
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
    // The Redis store, to read its coalescing's mean batch at the end.
    let mut redis_store: Option<RedisStore> = None;
    let store = match args.store.as_str() {
        "memory" => AnyStore::Memory(MemoryStore::new()),
        _ => {
            let builder = if args.cluster {
                RedisStore::cluster_builder(args.redis.clone())
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
                    if args.lease > 0 {
                        AnyStore::Leased(DeniedCache::new(
                            LeasedStore::builder(store).batch(args.lease).build(),
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
    // Keys made once, so formatting is not measured.
    let keys: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..args.keys)
            .map(|i| format!("k{i}").into_bytes())
            .collect(),
    );
    let next = Arc::new(AtomicU64::new(0));
    let allowed = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..args.concurrency {
        let (store, policy, keys) = (store.clone(), policy.clone(), keys.clone());
        let (next, allowed, errors) = (next.clone(), allowed.clone(), errors.clone());
        let requests = args.requests;
        tasks.push(tokio::spawn(async move {
            let mut rng =
                0x9e37_79b9_7f4a_7c15_u64 ^ (task + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
            let mut latencies = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let key = &keys[usize::try_from(rng % keys.len() as u64).unwrap_or(0)];
                let begun = Instant::now();
                match store.check(key, &policy).await {
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
    let mut latencies = Vec::with_capacity(usize::try_from(args.requests).unwrap_or(0));
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
        "{{\"store\":\"{}\",\"algorithm\":\"{}\",\"keys\":{},\"concurrency\":{},\"decisions\":{},\"allowed\":{},\"denied\":{},\"secs\":{:.3},\"per_sec\":{:.0},\"p50_us\":{},\"p99_us\":{},\"max_batch\":{},\"mean_batch\":{:.2}}}",
        args.store,
        args.algorithm,
        args.keys,
        args.concurrency,
        decisions,
        allowed,
        decisions - allowed - errors,
        secs,
        decisions as f64 / secs,
        at(50),
        at(99),
        args.max_batch,
        redis_store.map_or(0.0, |s| s.coalescing().mean_batch()),
    );
}
