//! The command-line flags the examples share, parsed with `clap` (derive):
//! value parsers for durations, counts and Redis URLs, and [`PolicyArgs`],
//! the `--algorithm`, `--limit` and `--window` of a policy.

use std::fmt;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::error::ErrorKind;
use ratelimit_core::{AlgorithmKind, Policy, PolicyError, Rate};

/// Parses a duration such as `500ms`, `10s`, `2m`, `1h` or `1d` (`humantime`'s
/// syntax, which also takes `1h 30m`).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(ratelimit_examples::parse_duration("500ms"), Ok(Duration::from_millis(500)));
/// assert_eq!(ratelimit_examples::parse_duration("2m"), Ok(Duration::from_secs(120)));
/// assert!(ratelimit_examples::parse_duration("10 parsecs").is_err());
/// ```
///
/// # Errors
///
/// When `text` is not a duration; the message quotes it.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| format!("{text:?}: {e}"))
}

/// A duration above zero, for flags such as `--window` (a value parser).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(ratelimit_examples::nonzero_duration("1m"), Ok(Duration::from_secs(60)));
/// assert!(ratelimit_examples::nonzero_duration("0s").unwrap_err().contains("zero"));
/// ```
///
/// # Errors
///
/// When `text` is not a duration or is zero.
pub fn nonzero_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err(format!("{text:?} is zero"));
    }
    Ok(duration)
}

/// A Redis URL, `redis://` or `rediss://` (a value parser; the store says
/// what else is wrong with it when it connects).
///
/// ```
/// assert!(ratelimit_examples::redis_url("redis://127.0.0.1:6379").is_ok());
/// assert!(ratelimit_examples::redis_url("127.0.0.1:6379").is_err());
/// ```
///
/// # Errors
///
/// When `text` is empty or has another scheme.
pub fn redis_url(text: &str) -> Result<String, String> {
    let url = text.trim();
    if url.is_empty() {
        return Err(String::from("empty URL"));
    }
    if !url.starts_with("redis://") && !url.starts_with("rediss://") {
        return Err(format!(
            "{url:?} is not a Redis URL such as redis://127.0.0.1:6379"
        ));
    }
    Ok(url.to_owned())
}

/// The value parser of `--algorithm`: one of [`AlgorithmKind::ALL`], which
/// `--help` and the error for another name list.
pub fn algorithm_parser() -> impl TypedValueParser<Value = AlgorithmKind> {
    PossibleValuesParser::new(AlgorithmKind::ALL.map(AlgorithmKind::name))
        .try_map(|name| name.parse::<AlgorithmKind>())
}

/// `--algorithm`, `--limit` and `--window`, all required: flatten it into an
/// example's flags with `#[command(flatten)]`.
///
/// ```
/// use clap::Parser;
/// use ratelimit_core::AlgorithmKind;
///
/// #[derive(Parser)]
/// struct Flags {
///     #[command(flatten)]
///     policy: ratelimit_examples::PolicyArgs,
/// }
///
/// let flags = Flags::try_parse_from(["x", "--algorithm", "gcra", "--limit", "10", "--window", "1m"])?;
/// assert_eq!(flags.policy.algorithm, AlgorithmKind::Gcra);
/// assert_eq!(flags.policy.policy()?.limit(), 10);
/// assert!(Flags::try_parse_from(["x", "--algorithm", "nope", "--limit", "1", "--window", "1s"]).is_err());
/// assert!(Flags::try_parse_from(["x", "--algorithm", "gcra", "--limit", "0", "--window", "1s"]).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, clap::Args)]
#[non_exhaustive]
pub struct PolicyArgs {
    /// The algorithm.
    #[arg(long, value_name = "NAME", value_parser = algorithm_parser())]
    pub algorithm: AlgorithmKind,
    /// The limit per window; the burst for token-bucket, gcra and
    /// leaky-bucket (refilled at N per window); the most in flight for
    /// concurrency.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: u64,
    /// The window, refill period, or for concurrency the lease of a permit
    /// (500ms, 10s, 1m, 1h).
    #[arg(long, value_name = "DURATION", value_parser = nonzero_duration)]
    pub window: Duration,
}

impl PolicyArgs {
    /// The policy the flags name ([`policy_for`]).
    ///
    /// # Errors
    ///
    /// When the policy refuses the numbers; the message names the flags.
    pub fn policy(&self) -> Result<Policy, String> {
        policy_for(self.algorithm, self.limit, self.window).map_err(|e| {
            format!(
                "--algorithm {} --limit {} --window {}: {e}",
                self.algorithm,
                self.limit,
                humantime::format_duration(self.window)
            )
        })
    }
}

/// The policy of `algorithm` with `limit` per `window`. For token bucket,
/// GCRA and leaky bucket, `limit` is the burst capacity and the rate is
/// `limit / window`; for concurrency, `limit` is the maximum in flight and
/// `window` the lease.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_core::AlgorithmKind;
/// let p = ratelimit_examples::policy_for(AlgorithmKind::Gcra, 10, Duration::from_secs(1))?;
/// assert_eq!(p.limit(), 10);
/// # Ok::<(), ratelimit_core::PolicyError>(())
/// ```
///
/// # Errors
///
/// When the policy refuses the numbers.
pub fn policy_for(
    algorithm: AlgorithmKind,
    limit: u64,
    window: Duration,
) -> Result<Policy, PolicyError> {
    let rate = Rate::new(limit, window);
    match algorithm {
        AlgorithmKind::FixedWindow => Policy::fixed_window(limit, window),
        AlgorithmKind::SlidingLog => Policy::sliding_window_log(limit, window),
        AlgorithmKind::SlidingWindow => Policy::sliding_window_counter(limit, window),
        AlgorithmKind::TokenBucket => Policy::token_bucket(limit, rate),
        AlgorithmKind::Gcra => Policy::gcra(limit, rate),
        AlgorithmKind::LeakyBucket => Policy::leaky_bucket(limit, rate),
        AlgorithmKind::Concurrency => Policy::concurrency(limit, window),
    }
}

/// Exits as clap does for a bad flag (the message, a pointer to `--help`,
/// status 2), for what only the parsed flags together can tell: two flags
/// that conflict, numbers a policy refuses.
pub fn exit_with_flag_error<F: clap::CommandFactory>(message: impl fmt::Display) -> ! {
    F::command()
        .error(ErrorKind::ValueValidation, message)
        .exit()
}
