//! [`CircuitBreaker`]: stop calling a failing store for a while.

use std::fmt;
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
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;
/// The default cool-down before a probe.
pub const DEFAULT_COOL_DOWN: Duration = Duration::from_millis(500);

/// A circuit breaker: after `threshold` consecutive failures (errors or
/// timeouts) it opens and stops sending calls to the store for a cool-down;
/// then it lets one probe through, and closes again when the probe succeeds
/// (or opens for another cool-down when it fails). Lock-free; share it with
/// an `Arc`.
pub struct CircuitBreaker {
    threshold: u32,
    cool_down: Duration,
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

/// Where one call should go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Primary { probe: bool },
    Elsewhere,
}

impl CircuitBreaker {
    /// Opens after `threshold` consecutive failures (at least 1), probes after `cool_down`.
    pub fn new(threshold: u32, cool_down: Duration) -> Self {
        CircuitBreaker {
            threshold: threshold.max(1),
            cool_down,
            origin: Instant::now(),
            state: AtomicU8::new(CLOSED),
            failures: AtomicU32::new(0),
            opened_at_micros: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            trips: AtomicU64::new(0),
        }
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

    pub(crate) fn route(&self) -> Route {
        match self.state.load(Ordering::Acquire) {
            CLOSED => Route::Primary { probe: false },
            OPEN => {
                let opened = self.opened_at_micros.load(Ordering::Acquire);
                let cool = u64::try_from(self.cool_down.as_micros()).unwrap_or(u64::MAX);
                if self.now_micros().saturating_sub(opened) >= cool
                    && self
                        .probing
                        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    self.state.store(HALF_OPEN, Ordering::Release);
                    Route::Primary { probe: true }
                } else {
                    Route::Elsewhere
                }
            }
            _ => Route::Elsewhere,
        }
    }

    pub(crate) fn succeeded(&self, probe: bool) {
        self.failures.store(0, Ordering::Release);
        if probe {
            self.state.store(CLOSED, Ordering::Release);
            self.probing.store(false, Ordering::Release);
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
        }
    }

    fn open(&self) {
        self.opened_at_micros
            .store(self.now_micros(), Ordering::Release);
        self.state.store(OPEN, Ordering::Release);
    }
}

/// Counts a call to the store as failed if it is dropped before its outcome
/// is known: a caller's shorter timeout gave up on it (so the store is too
/// slow for the caller), or a probe was cancelled (so the breaker never waits
/// for a probe that is gone).
pub(crate) struct ProbeGuard<'a> {
    pub(crate) breaker: &'a CircuitBreaker,
    pub(crate) probe: bool,
    pub(crate) done: bool,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.breaker.failed(self.probe);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_probes_after_cool_down_and_closes() {
        let b = CircuitBreaker::new(3, Duration::from_millis(30));
        assert_eq!(b.route(), Route::Primary { probe: false });
        b.failed(false);
        b.failed(false);
        assert_eq!(b.state(), BreakerState::Closed);
        b.succeeded(false); // a success resets the count
        b.failed(false);
        b.failed(false);
        assert_eq!(b.state(), BreakerState::Closed);
        b.failed(false);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.trips(), 1);
        assert_eq!(b.route(), Route::Elsewhere);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(b.route(), Route::Primary { probe: true });
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert_eq!(b.route(), Route::Elsewhere, "one probe at a time");
        b.failed(true);
        assert_eq!(b.state(), BreakerState::Open);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(b.route(), Route::Primary { probe: true });
        b.succeeded(true);
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.route(), Route::Primary { probe: false });
    }

    #[test]
    fn a_dropped_probe_reopens() {
        let b = CircuitBreaker::new(1, Duration::ZERO);
        b.failed(false);
        assert_eq!(b.route(), Route::Primary { probe: true });
        drop(ProbeGuard {
            breaker: &b,
            probe: true,
            done: false,
        });
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(
            b.route(),
            Route::Primary { probe: true },
            "a new probe may go"
        );
    }
}
