//! Clocks: where a store's "now" comes from.
//!
//! Every algorithm works in integer microseconds. A store takes its time from
//! exactly one clock: [`MonotonicClock`] by default, [`ManualClock`] in tests,
//! and [`TokioClock`], which follows `tokio::time::pause`/`advance`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of time in microseconds. It must never go backwards.
pub trait Clock: Send + Sync + 'static {
    /// The current time, in microseconds since an arbitrary fixed origin.
    fn now(&self) -> u64;
}

/// A monotonic clock, anchored at the wall-clock time when it was created so
/// that aligned windows (fixed window, sliding window counter) start on whole
/// seconds, minutes and hours of the wall clock, as users expect.
///
/// It reads the CPU's time-stamp counter through `quanta` where that counter
/// is invariant (a few nanoseconds, against tens for `Instant::now` on some
/// virtual machines), and the operating system's monotonic clock otherwise.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    origin: u64,
    origin_micros: u64,
    /// Microseconds per raw tick as a fraction of 2^64, taken once from
    /// quanta's calibration: a reading is one multiply, not quanta's
    /// scaling to nanoseconds then a division by 1,000.
    micros_per_tick: u64,
}

impl MonotonicClock {
    /// A clock that starts now.
    pub fn new() -> Self {
        let origin_micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 4))
            .unwrap_or(0);
        let clock = quanta::Clock::new();
        MonotonicClock {
            origin: clock.raw(),
            micros_per_tick: micros_per_tick(&clock),
            clock,
            origin_micros,
        }
    }

    /// The microseconds in `ticks` of the raw counter.
    #[inline]
    fn micros(&self, ticks: u64) -> u64 {
        // The high half of a 64 × 64-bit product: below `ticks`.
        #[allow(clippy::cast_possible_truncation)]
        let micros = ((u128::from(ticks) * u128::from(self.micros_per_tick)) >> 64) as u64;
        micros
    }
}

/// `clock`'s microseconds per raw tick as a fraction of 2^64, from what
/// quanta scales 2^40 ticks to (minutes of a GHz counter: precise to about
/// 1e-12). Quanta's counters tick at least once per microsecond (the TSC, or
/// the OS clock in nanoseconds); a slower one would read as one tick a
/// microsecond at most, late but still monotonic.
fn micros_per_tick(clock: &quanta::Clock) -> u64 {
    const SPAN: u32 = 40;
    let nanos = u128::from(clock.delta_as_nanos(0, 1 << SPAN));
    u64::try_from((nanos << (64 - SPAN)) / 1_000).unwrap_or(u64::MAX)
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> u64 {
        // Raw counter ticks scaled straight to microseconds: no
        // `Instant`/`Duration` arithmetic on the hot path.
        let ticks = self.clock.raw().saturating_sub(self.origin);
        self.origin_micros.saturating_add(self.micros(ticks))
    }
}

/// A clock that only moves when told to. Clones share the same time.
///
/// ```
/// use ratelimit_core::clock::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(0);
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(clock.now(), 5_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `micros`.
    pub fn new(micros: u64) -> Self {
        ManualClock {
            micros: Arc::new(AtomicU64::new(micros)),
        }
    }

    /// Move the clock forward.
    pub fn advance(&self, by: std::time::Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.micros.fetch_add(by, Ordering::SeqCst);
    }

    /// Set the clock. Setting it backwards breaks the [`Clock`] contract and
    /// is only meant for tests of that situation.
    pub fn set(&self, micros: u64) {
        self.micros.store(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        self.micros.load(Ordering::SeqCst)
    }
}

/// A clock that follows `tokio::time`, including `tokio::time::pause()` and
/// `advance()` in tests.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock that starts at zero now.
    pub fn new() -> Self {
        TokioClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    #[inline]
    fn now(&self) -> u64 {
        // Start at one second so that "zero" never means "no state yet".
        let elapsed = u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX / 4);
        1_000_000 + elapsed
    }
}

impl<C: Clock> Clock for Arc<C> {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_clock_scales_ticks_as_quanta_does() {
        let clock = MonotonicClock::new();
        for shift in [0, 10, 20, 30, 40, 50, 60] {
            for ticks in [1u64 << shift, (1 << shift) + 999, (1 << shift) * 3 + 7] {
                let ours = clock.micros(ticks);
                let quanta = clock.clock.delta_as_nanos(0, ticks) / 1_000;
                // Equal to within a microsecond and a part in 10^9.
                assert!(
                    ours.abs_diff(quanta) <= 1 + quanta / 1_000_000_000,
                    "{ticks} ticks: {ours} µs, quanta {quanta} µs"
                );
            }
        }
        let (first, second) = (clock.now(), clock.now());
        assert!(second >= first);
    }
}
