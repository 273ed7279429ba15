//! [`CircuitBreaker`]: stop calling a failing store for a while.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The state of a [`CircuitBreaker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BreakerState {
    /// Calls go to the store.
    Closed,
    /// The store failed too often: calls go elsewhere until the cool-down ends.
    Open,
    /// The cool-down ended: one probe goes to the store; the others still go
    /// elsewhere until it answers.
    HalfOpen,
}

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

/// The default number of consecutive failures that opens the breaker.
pub(crate) const DEFAULT_FAILURE_THRESHOLD: u32 = 3;
/// The default cool-down before a probe.
pub(crate) const DEFAULT_COOL_DOWN: Duration = Duration::from_millis(500);
/// The default time after which a call its caller gave up on counts as a
/// failure (see [`CircuitBreaker::with_slow_call`]).
pub(crate) const DEFAULT_SLOW_CALL: Duration = Duration::from_millis(20);
/// The name of a breaker that was not given one.
pub(crate) const DEFAULT_BREAKER_NAME: &str = "default";

/// A circuit breaker: after `threshold` consecutive failures (errors or
/// timeouts) it opens and stops sending calls to the store for a cool-down;
/// then it lets one probe through, and closes again when the probe succeeds
/// (or opens for another cool-down when it fails). Lock-free; share it with
/// an `Arc`. The [default](Default) opens after 3 consecutive failures and
/// probes after a cool-down of 500 ms.
///
/// Every transition is logged with `tracing` (opening at `warn`, probing and
/// closing at `info`) and, with the `metrics` feature, recorded in the gauge
/// `ratelimit_circuit_breaker_state` and the counter
/// `ratelimit_circuit_breaker_transitions_total` (see [`metrics`](crate::metrics)),
/// labelled with the breaker's [name](CircuitBreaker::with_name).
pub struct CircuitBreaker {
    name: Box<str>,
    threshold: u32,
    cool_down: Duration,
    slow_call: Duration,
    origin: Instant,
    state: AtomicU8,
    failures: AtomicU32,
    opened_at_micros: AtomicU64,
    probing: AtomicBool,
    trips: AtomicU64,
}

impl fmt::Debug for CircuitBreaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("name", &self.name)
            .field("state", &self.state())
            .field("threshold", &self.threshold)
            .field("cool_down", &self.cool_down)
            .field("trips", &self.trips())
            .finish()
    }
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker::new(DEFAULT_FAILURE_THRESHOLD, DEFAULT_COOL_DOWN)
    }
}

impl CircuitBreaker {
    /// Opens after `threshold` consecutive failures (at least 1), probes after `cool_down`.
    pub fn new(threshold: u32, cool_down: Duration) -> Self {
        CircuitBreaker {
            name: DEFAULT_BREAKER_NAME.into(),
            threshold: threshold.max(1),
            cool_down,
            slow_call: DEFAULT_SLOW_CALL,
            origin: Instant::now(),
            state: AtomicU8::new(CLOSED),
            failures: AtomicU32::new(0),
            opened_at_micros: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            trips: AtomicU64::new(0),
        }
    }

    /// The same breaker named `name` (default `default`): the
    /// `breaker` label of its metrics and a field of its log events, to tell
    /// several breakers in one process apart.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ratelimit_core::CircuitBreaker;
    ///
    /// let breaker = Arc::new(CircuitBreaker::default().with_name("redis-eu"));
    /// assert_eq!(breaker.name(), "redis-eu");
    /// ```
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into().into_boxed_str();
        self
    }

    /// The same breaker, counting a call whose caller went away as a failure
    /// only once it has waited `slow_call` (default 20 ms).
    ///
    /// A caller that drops a call it has waited on for that long (a layer
    /// timeout shorter than the store's own) says the store is too slow, and
    /// the breaker should open; a caller that goes away sooner (a client that
    /// disconnected, an HTTP/2 reset) says nothing about the store, and a few
    /// of them must not open the breaker for everyone. Keep it below any
    /// timeout of the layer, and above the store's usual latency.
    #[must_use]
    pub fn with_slow_call(mut self, slow_call: Duration) -> Self {
        self.slow_call = slow_call;
        self
    }

    /// The breaker's name (see [`with_name`](Self::with_name)).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        match self.state.load(Ordering::Acquire) {
            CLOSED => BreakerState::Closed,
            OPEN => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }

    /// How many times the breaker has opened since it was made.
    pub fn trips(&self) -> u64 {
        self.trips.load(Ordering::Relaxed)
    }

    fn now_micros(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Where one call goes: to the store, as the returned [`Call`] (a probe
    /// when the breaker is half-open), or elsewhere (`None`). The call is
    /// taken here, not when its future first runs: a future dropped before
    /// its first poll (the losing branch of a `select!`) drops its `Call`,
    /// which gives a probe back.
    pub(crate) fn route(self: &Arc<Self>) -> Option<Call> {
        let probe = match self.state.load(Ordering::Acquire) {
            CLOSED => false,
            OPEN => {
                let opened = self.opened_at_micros.load(Ordering::Acquire);
                let cool = u64::try_from(self.cool_down.as_micros()).unwrap_or(u64::MAX);
                if self.now_micros().saturating_sub(opened) < cool
                    || self
                        .probing
                        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                        .is_err()
                {
                    return None;
                }
                self.state.store(HALF_OPEN, Ordering::Release);
                self.transition(OPEN, HALF_OPEN);
                true
            }
            _ => return None,
        };
        Some(Call {
            breaker: Arc::clone(self),
            probe,
            started: Instant::now(),
            done: false,
        })
    }

    fn succeeded(&self, probe: bool) {
        self.failures.store(0, Ordering::Release);
        if probe {
            let from = self.state.swap(CLOSED, Ordering::AcqRel);
            self.probing.store(false, Ordering::Release);
            self.transition(from, CLOSED);
        }
    }

    pub(crate) fn failed(&self, probe: bool) {
        if probe {
            self.open();
            self.probing.store(false, Ordering::Release);
            return;
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures >= self.threshold
            && self
                .state
                .compare_exchange(CLOSED, OPEN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.opened_at_micros
                .store(self.now_micros(), Ordering::Release);
            self.trips.fetch_add(1, Ordering::Relaxed);
            self.transition(CLOSED, OPEN);
        }
    }

    /// A call whose caller went away before the store answered: not counted.
    /// An abandoned probe leaves the breaker open with its cool-down over, so
    /// the next call probes.
    fn abandoned(&self, probe: bool) {
        if probe
            && self
                .state
                .compare_exchange(HALF_OPEN, OPEN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.transition(HALF_OPEN, OPEN);
            self.probing.store(false, Ordering::Release);
        }
    }

    fn open(&self) {
        self.opened_at_micros
            .store(self.now_micros(), Ordering::Release);
        let from = self.state.swap(OPEN, Ordering::AcqRel);
        self.transition(from, OPEN);
    }

    /// Reports a change of state: logs it, and records it with the `metrics`
    /// feature. Transitions are rare, so the labels are built here.
    fn transition(&self, from: u8, to: u8) {
        if from == to {
            return;
        }
        let (from, to) = (state_name(from), state_name(to));
        match to {
            "open" => tracing::warn!(
                breaker = %self.name,
                from,
                to,
                cool_down = ?self.cool_down,
                "circuit breaker opened: calls go elsewhere until the cool-down ends"
            ),
            "half_open" => tracing::info!(
                breaker = %self.name,
                from,
                to,
                "circuit breaker half-open: one probe goes to the store"
            ),
            _ => tracing::info!(
                breaker = %self.name,
                from,
                to,
                "circuit breaker closed: calls go to the store again"
            ),
        }
        #[cfg(feature = "metrics")]
        crate::metrics::record_transition(&self.name, from, to);
    }
}

/// The name of a state in logs and metric labels.
fn state_name(state: u8) -> &'static str {
    match state {
        CLOSED => "closed",
        OPEN => "open",
        _ => "half_open",
    }
}

/// One call routed to the store, from the moment [`CircuitBreaker::route`]
/// sent it there; it tells the breaker how the call went
/// ([`succeeded`](Call::succeeded), [`failed`](Call::failed)).
///
/// Dropped without an outcome (its caller went away, perhaps before the
/// call's future was ever polled): after the breaker's `slow_call` that is
/// a failure (the store was too slow for its caller); sooner, it says
/// nothing about the store and counts as neither a success nor a failure,
/// and a dropped probe hands the probe to the next call, so the breaker
/// never waits for a probe that is gone. Dropping needs no runtime and no
/// poll.
pub(crate) struct Call {
    breaker: Arc<CircuitBreaker>,
    probe: bool,
    started: Instant,
    done: bool,
}

impl Call {
    /// The store answered (an error that is no outage is an answer).
    pub(crate) fn succeeded(mut self) {
        self.done = true;
        self.breaker.succeeded(self.probe);
    }

    /// The store was unreachable.
    pub(crate) fn failed(mut self) {
        self.done = true;
        self.breaker.failed(self.probe);
    }
}

impl fmt::Debug for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("breaker", &self.breaker.name)
            .field("probe", &self.probe)
            .finish_non_exhaustive()
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.started.elapsed() >= self.breaker.slow_call {
            self.breaker.failed(self.probe);
        } else {
            self.breaker.abandoned(self.probe);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `call` goes to the store as a probe (`Some(true)`), as a
    /// plain call (`Some(false)`), or elsewhere (`None`).
    fn probing(call: Option<&Call>) -> Option<bool> {
        call.map(|c| c.probe)
    }

    #[test]
    fn opens_after_threshold_probes_after_cool_down_and_closes() {
        let b = Arc::new(CircuitBreaker::new(3, Duration::from_millis(30)));
        let call = b.route();
        assert_eq!(probing(call.as_ref()), Some(false));
        b.failed(false);
        b.failed(false);
        assert_eq!(b.state(), BreakerState::Closed);
        call.expect("a call").succeeded(); // a success resets the count
        b.failed(false);
        b.failed(false);
        assert_eq!(b.state(), BreakerState::Closed);
        b.failed(false);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.trips(), 1);
        assert_eq!(probing(b.route().as_ref()), None);
        std::thread::sleep(Duration::from_millis(40));
        let probe = b.route();
        assert_eq!(probing(probe.as_ref()), Some(true));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert_eq!(probing(b.route().as_ref()), None, "one probe at a time");
        probe.expect("a probe").failed();
        assert_eq!(b.state(), BreakerState::Open);
        std::thread::sleep(Duration::from_millis(40));
        let probe = b.route();
        assert_eq!(probing(probe.as_ref()), Some(true));
        probe.expect("a probe").succeeded();
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(probing(b.route().as_ref()), Some(false));
    }

    #[test]
    fn a_dropped_probe_hands_the_probe_on() {
        let b = CircuitBreaker::new(1, Duration::from_secs(3600))
            .with_slow_call(Duration::from_secs(3600));
        b.failed(false);
        b.opened_at_micros.store(0, Ordering::Release);
        // The cool-down is over only because `opened_at` was moved back.
        let b = Arc::new({
            let origin = Instant::now() - Duration::from_secs(7200);
            CircuitBreaker { origin, ..b }
        });
        let probe = b.route();
        assert_eq!(probing(probe.as_ref()), Some(true));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        drop(probe);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.trips(), 1, "an abandoned probe is not a new trip");
        assert_eq!(
            probing(b.route().as_ref()),
            Some(true),
            "the next call probes at once, without another cool-down"
        );
    }

    #[test]
    fn calls_dropped_early_never_open_the_breaker() {
        // Cancellations say nothing about the store.
        let b = Arc::new(
            CircuitBreaker::new(3, Duration::from_secs(60))
                .with_slow_call(Duration::from_secs(3600)),
        );
        for _ in 0..10 {
            let call = b.route();
            assert_eq!(probing(call.as_ref()), Some(false));
            drop(call);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.trips(), 0);
    }

    #[test]
    fn calls_dropped_after_the_slow_call_time_are_failures() {
        let b = Arc::new(
            CircuitBreaker::new(3, Duration::from_secs(60)).with_slow_call(Duration::ZERO),
        );
        for _ in 0..3 {
            let call = b.route();
            assert_eq!(probing(call.as_ref()), Some(false));
            drop(call);
        }
        assert_eq!(b.state(), BreakerState::Open);
    }
}
