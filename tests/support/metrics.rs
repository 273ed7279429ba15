//! Metrics in tests: a local `metrics` recorder around a current-thread tokio
//! runtime ([`capture`]), and a parser of the Prometheus text format
//! ([`Scrape`]) for the examples' `/metrics` endpoints.

use std::collections::BTreeMap;
use std::future::Future;

use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

// The names the crates document as a contract (the tables of
// `ratelimit_tower::metrics` and `ratelimit_core::metrics`), written out
// here so a renamed metric fails the tests.

/// Counter of the layer's decisions, by `policy` and `outcome`.
pub const DECISIONS: &str = "ratelimit_decisions_total";
/// Counter of allowed decisions near the limit, by `policy`.
pub const NEAR_LIMIT: &str = "ratelimit_near_limit_total";
/// Counter of settlements after the response, by `policy` and `outcome`.
pub const SETTLEMENTS: &str = "ratelimit_settlements_total";
/// Counter of configuration reloads, by `outcome`.
pub const CONFIG_RELOADS: &str = "ratelimit_config_reloads_total";
/// Gauge of a circuit breaker's state, by `breaker`.
pub const CIRCUIT_BREAKER_STATE: &str = "ratelimit_circuit_breaker_state";
/// Counter of a circuit breaker's transitions, by `breaker`, `from`, `to`.
pub const CIRCUIT_BREAKER_TRANSITIONS: &str = "ratelimit_circuit_breaker_transitions_total";
/// Gauge of a peer region's lag, by `region` and `peer`.
pub const REGION_PEER_LAG: &str = "ratelimit_region_peer_lag_seconds";
/// Gauge of a peer region's clock skew, by `region` and `peer`.
pub const REGION_PEER_SKEW: &str = "ratelimit_region_peer_clock_skew_seconds";
/// Gauge of the over-admission estimate, by `region` and `policy`.
pub const REGION_OVERSHOOT: &str = "ratelimit_region_overshoot_estimate";
/// Counter of a peer region becoming stale, by `region` and `peer`.
pub const REGION_STALE_TRANSITIONS: &str = "ratelimit_region_peer_stale_total";
/// Counter of failed pushes to a peer region, by `region` and `peer`.
pub const REGION_PUSH_FAILURES: &str = "ratelimit_region_push_failures_total";

/// One metric series: its name and labels.
pub type Series = (String, BTreeMap<String, String>);

/// What a test recorded: every series with its kind and value, and the
/// descriptions given.
#[derive(Debug, Default)]
pub struct Recorded {
    /// Counters.
    pub counters: BTreeMap<Series, u64>,
    /// Gauges.
    pub gauges: BTreeMap<Series, f64>,
    /// Histograms: every value recorded.
    pub histograms: BTreeMap<Series, Vec<f64>>,
    /// Metric names that were described, with their unit.
    pub described: BTreeMap<String, Option<metrics::Unit>>,
}

impl Recorded {
    /// The counter `name` with exactly `labels` (0 when never recorded).
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.counters
            .get(&series(name, labels))
            .copied()
            .unwrap_or(0)
    }

    /// The counter `name` with the labels `policy` and `outcome` only, as the
    /// layer counts its decisions (0 when never recorded).
    pub fn outcome(&self, name: &str, policy: &str, outcome: &str) -> u64 {
        self.counter(name, &[("policy", policy), ("outcome", outcome)])
    }

    /// Every outcome the counter `name` counted for `policy` (series with
    /// the labels `policy` and `outcome` only), as `outcome=count` in the
    /// outcomes' order, space-separated: `"allowed=5 denied=3"`. Comparing it
    /// whole asserts that no other outcome was counted.
    pub fn outcomes(&self, name: &str, policy: &str) -> String {
        let mut counted = Vec::new();
        for (labels, count) in self.counters_named(name) {
            let of_policy = labels.get("policy").map(String::as_str) == Some(policy);
            if let (2, true, Some(outcome)) = (labels.len(), of_policy, labels.get("outcome")) {
                counted.push(format!("{outcome}={count}"));
            }
        }
        counted.join(" ")
    }

    /// Asserts that [`Recorded::outcomes`] of `policy` in `name` are
    /// exactly `expected`.
    #[track_caller]
    pub fn assert_outcomes(&self, name: &str, policy: &str, expected: &str) {
        let outcomes = self.outcomes(name, policy);
        assert_eq!(outcomes, expected, "{name} of {policy}");
    }

    /// The gauge `name` with exactly `labels`.
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.gauges.get(&series(name, labels)).copied()
    }

    /// The values of the histogram `name` with exactly `labels`.
    pub fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> &[f64] {
        self.histograms
            .get(&series(name, labels))
            .map_or(&[], Vec::as_slice)
    }

    /// Every counter named `name`, by labels.
    pub fn counters_named(&self, name: &str) -> BTreeMap<BTreeMap<String, String>, u64> {
        named_series(&self.counters, name)
    }

    /// Every label value of every series.
    pub fn label_values(&self) -> Vec<String> {
        self.counters
            .keys()
            .chain(self.gauges.keys())
            .chain(self.histograms.keys())
            .flat_map(|(_, labels)| labels.values().cloned())
            .collect()
    }
}

/// A series key from a name and labels.
pub fn series(name: &str, labels: &[(&str, &str)]) -> Series {
    (
        name.to_owned(),
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
}

/// Runs `test` on a current-thread tokio runtime (time enabled, paused when
/// `paused`) with a `DebuggingRecorder` as this thread's recorder, and
/// returns its output and what was recorded. Everything the runtime runs,
/// spawned tasks included, runs on this thread, so it all lands in the
/// recorder; nothing leaks into other tests.
pub fn capture<F, T>(paused: bool, test: impl FnOnce() -> F) -> (T, Recorded)
where
    F: Future<Output = T>,
{
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all();
    if paused {
        builder.start_paused(true);
    }
    let runtime = builder.build().expect("a current-thread runtime");
    let output = metrics::with_local_recorder(&recorder, || runtime.block_on(test()));
    drop(runtime);
    let mut recorded = Recorded::default();
    for (key, unit, description, value) in snapshotter.snapshot().into_vec() {
        let kind = key.kind();
        let (key_name, labels) = key.key().clone().into_parts();
        let name = key_name.as_str().to_owned();
        let labels: BTreeMap<String, String> = labels
            .into_iter()
            .map(|l| {
                let (k, v) = l.into_parts();
                (k.to_string(), v.to_string())
            })
            .collect();
        if description.is_some() {
            recorded.described.insert(name.clone(), unit);
        }
        match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(v)) => {
                recorded.counters.insert((name, labels), v);
            }
            (MetricKind::Gauge, DebugValue::Gauge(v)) => {
                recorded.gauges.insert((name, labels), v.into_inner());
            }
            (MetricKind::Histogram, DebugValue::Histogram(values)) => {
                recorded.histograms.insert(
                    (name, labels),
                    values.into_iter().map(|v| v.into_inner()).collect(),
                );
            }
            other => panic!("unexpected metric kind and value {other:?}"),
        }
    }
    (output, recorded)
}

/// A page in the Prometheus text format, parsed.
#[derive(Debug, Default)]
pub struct Scrape {
    /// `# TYPE` lines: metric name → type.
    pub types: BTreeMap<String, String>,
    /// Samples: (name, labels) → value.
    pub samples: BTreeMap<Series, f64>,
}

impl Scrape {
    /// Parses `text`, panicking on a line that is not a comment, blank or a
    /// sample `name{k="v",...} value`.
    pub fn parse(text: &str) -> Scrape {
        let mut scrape = Scrape::default();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest
                    .split_once(' ')
                    .unwrap_or_else(|| panic!("a # TYPE line without a type: {line:?}"));
                scrape.types.insert(name.to_owned(), kind.to_owned());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (series_text, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("a sample without a value: {line:?}"));
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("a sample value that is not a number: {line:?}"));
            let (name, labels) = match series_text.split_once('{') {
                Some((name, rest)) => {
                    let body = rest
                        .strip_suffix('}')
                        .unwrap_or_else(|| panic!("unclosed labels: {line:?}"));
                    (name, parse_labels(body, line))
                }
                None => (series_text, BTreeMap::new()),
            };
            scrape.samples.insert((name.to_owned(), labels), value);
        }
        scrape
    }

    /// The sample `name` with exactly `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples.get(&series(name, labels)).copied()
    }

    /// Every sample named `name`, by labels.
    pub fn named(&self, name: &str) -> BTreeMap<BTreeMap<String, String>, f64> {
        named_series(&self.samples, name)
    }
}

/// The values of every series in `values` named `name`, by labels.
fn named_series<V: Copy>(
    values: &BTreeMap<Series, V>,
    name: &str,
) -> BTreeMap<BTreeMap<String, String>, V> {
    values
        .iter()
        .filter(|((n, _), _)| n == name)
        .map(|((_, labels), v)| (labels.clone(), *v))
        .collect()
}

/// `k="v",k2="v2"` (values with `\"`, `\\` and `\n` escapes).
fn parse_labels(body: &str, line: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("a label without a quoted value: {line:?}"));
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => panic!("a dangling escape: {line:?}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("an unclosed label value: {line:?}"),
            }
        };
        labels.insert(key.trim().to_owned(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    labels
}
