//! What the sync of one instance keeps of each peer region, and the names
//! and helpers its parts share: the keys the scripts use, the scripts with
//! their integer helpers, and the parsing of replies.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::ConnectionManager;
use redis::{Script, Value};
use tokio::time::Instant;

use crate::StoreError;
use crate::clock::Clock;

/// A time of a peer's Redis, returned by one mark and carried by the next:
/// its `TIME` and its clock (the same but in tests), in µs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ticket {
    pub(super) real: u64,
    pub(super) clock: u64,
}

/// One peer region: its connection, and what this instance last saw of it.
pub(super) struct Peer {
    pub(super) name: String,
    pub(super) connection: ConnectionManager,
    /// The clock of the peer's Redis in tests (its `TIME` otherwise).
    pub(super) clock: Option<Arc<dyn Clock>>,
    pub(super) ticket: Mutex<Option<Ticket>>,
    pub(super) reachable: AtomicBool,
    pub(super) seen: Mutex<Seen>,
}

/// What the last status read found of one peer.
#[derive(Debug, Clone, Default)]
pub(super) struct Seen {
    /// Whether decisions count the peer conservatively.
    pub(super) conservative: bool,
    /// How long before the read the freshest mark's ticket was taken.
    pub(super) lag: Option<Duration>,
    pub(super) skewed: bool,
    /// Bounds of the peer's clock minus this region's, µs.
    pub(super) skew: Option<(i64, i64)>,
    pub(super) backlog: u64,
    /// Units heard from the peer by policy, and when they were read.
    pub(super) arrived: HashMap<String, u64>,
    pub(super) read_at: Option<Instant>,
    /// Units per second heard from the peer by policy, over the last read.
    pub(super) rates: HashMap<String, f64>,
}

impl Peer {
    pub(super) fn new(
        name: String,
        connection: ConnectionManager,
        clock: Option<Arc<dyn Clock>>,
    ) -> Self {
        Peer {
            name,
            connection,
            clock,
            ticket: Mutex::new(None),
            reachable: AtomicBool::new(true),
            seen: Mutex::new(Seen {
                // Never heard yet: conservative until the first mark lands.
                conservative: true,
                ..Seen::default()
            }),
        }
    }

    /// The clock argument of a script run in the peer's Redis: its test
    /// clock, or 0 for its `TIME`.
    pub(super) fn clock_arg(&self) -> u64 {
        self.clock.as_ref().map_or(0, |c| c.now())
    }
}

/// The names of the keys of one region's outbox, in the order the scripts
/// take them: by sequence, by end, values, meta.
pub(super) fn outbox_keys(prefix: &str) -> [String; 4] {
    ["seq", "end", "val", "meta"].map(|part| format!("{prefix}:mr:out:{part}"))
}

/// `<prefix>:mr:heard:<region>`: when a Redis last had everything `region` admitted.
pub(super) fn heard_key(prefix: &str, region: &str) -> String {
    format!("{prefix}:mr:heard:{region}")
}

/// `<prefix>:mr:rounds:<region>`: merges of `region`'s rounds that ran.
pub(super) fn rounds_key(prefix: &str, region: &str) -> String {
    format!("{prefix}:mr:rounds:{region}")
}

/// `<prefix>:mr:arrived:<region>`: units heard from `region`, by policy.
pub(super) fn arrived_key(prefix: &str, region: &str) -> String {
    format!("{prefix}:mr:arrived:{region}")
}

/// A script with the shared integer helpers (the same the rate-limit scripts
/// use) and the state-hash helpers ahead of it.
pub(super) fn script(source: &str) -> Script {
    Script::new(&format!(
        "{}\n{}\n{source}",
        include_str!("../redis/lua/numbers.lua"),
        include_str!("lua/fields.lua")
    ))
}

/// The timing of the store and its sync.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    pub(super) sync: Duration,
    pub(super) staleness: Duration,
    pub(super) max_skew: Duration,
    pub(super) push_timeout: Duration,
}

/// A number in a reply.
pub(super) fn number(value: &Value) -> Option<u64> {
    text(value)?.parse().ok()
}

/// A text in a reply.
pub(super) fn text(value: &Value) -> Option<String> {
    match value {
        Value::Int(n) => Some(n.to_string()),
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// The error of a reply that does not decode.
pub(super) fn bad_reply(script: &str, reply: &Value) -> StoreError {
    StoreError::Backend(format!("unexpected reply to {script}: {reply:?}").into())
}

/// A duration in µs, for the scripts.
pub(super) fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Runs `invocation` on the region's own Redis (`local`) within `timeout`:
/// the one way the sync tasks call their scripts there.
pub(super) async fn invoke_local(
    local: &ConnectionManager,
    invocation: &redis::ScriptInvocation<'_>,
    timeout: Duration,
) -> Result<Value, StoreError> {
    let mut connection = local.clone();
    tokio::time::timeout(timeout, invocation.invoke_async::<Value>(&mut connection))
        .await
        .map_err(|_| StoreError::Timeout(timeout))?
        .map_err(crate::redis::backend_error)
}
