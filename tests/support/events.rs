//! `tracing` in tests: a subscriber that keeps every event it is given, its
//! level and its fields as text, to assert what was logged.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// One event: its level, and each of its fields by name, as text.
pub type Logged = (Level, BTreeMap<String, String>);

/// A subscriber that keeps every event (clones share what they keep).
/// Install it for one thread with `tracing::subscriber::with_default`, or
/// for the process with `set_global_default`.
#[derive(Debug, Clone, Default)]
pub struct Events(Arc<Mutex<Vec<Logged>>>);

impl Events {
    /// Every event kept so far, in order.
    pub fn all(&self) -> Vec<Logged> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many events at `level` were kept.
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
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((*event.metadata().level(), fields));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
