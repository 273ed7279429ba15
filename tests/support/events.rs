//! `tracing` in tests: a subscriber that keeps every event it is given, its
//! level and its fields as text, to assert what was logged.
//!
//! `tracing` caches per call site whether anyone listens, and a call site
//! first hit on another thread while a scoped subscriber is being installed
//! can keep "no one" for good: a test that asserts events owns the process's
//! subscriber ([`Events::of_this_process`]) in a binary of its own, and reads
//! the events its own thread emitted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::ThreadId;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// One event: its level, and each of its fields by name, as text.
pub type Logged = (Level, BTreeMap<String, String>);

/// A subscriber that keeps every event with the thread that emitted it
/// (clones share what they keep).
#[derive(Debug, Clone, Default)]
pub struct Events(Arc<Mutex<Vec<(ThreadId, Logged)>>>);

impl Events {
    /// The process's global subscriber, installed on first use; each test
    /// reads what its own thread emitted, so tests of one binary run side
    /// by side (on current-thread runtimes).
    pub fn of_this_process() -> &'static Events {
        static EVENTS: OnceLock<Events> = OnceLock::new();
        EVENTS.get_or_init(|| {
            let events = Events::default();
            tracing::subscriber::set_global_default(events.clone())
                .expect("the only subscriber of this test binary");
            events
        })
    }

    /// Every event emitted on the calling thread so far, in order.
    pub fn all(&self) -> Vec<Logged> {
        let me = std::thread::current().id();
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(thread, _)| *thread == me)
            .map(|(_, logged)| logged.clone())
            .collect()
    }

    /// How many events at `level` the calling thread emitted.
    pub fn at(&self, level: Level) -> usize {
        self.all().iter().filter(|(l, _)| *l == level).count()
    }
}

/// Reads an event's fields into a map.
struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl Subscriber for Events {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push((
            std::thread::current().id(),
            (*event.metadata().level(), fields),
        ));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
