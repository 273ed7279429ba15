//! The sync of one instance: its region's outbox pushed to every peer every
//! `sync`, and what its region's Redis holds of each peer read back for the
//! status, logs and metrics.
//!
//! Every admission writes its count to the region's outbox, in the same
//! script (`decide.lua`), so the outbox holds everything the region
//! admitted, whichever instance admitted it and whether or not its reply
//! arrived. One task per peer runs a *round* every `sync`:
//!
//! 1. read the outbox after the peer's cursor (what was delivered to it),
//!    1,024 entries per read, until a read reaches the end;
//! 2. push them to the peer's Redis, [`PUSH_BATCH`] entries per merge
//!    (`merge.lua`), [`PUSH_PIPELINE`] merges per pipeline, every pipeline
//!    at once and in order on one connection, so a round takes one round
//!    trip, plus its reads and the merges' time in the peer's Redis,
//!    whatever the number of keys;
//! 3. behind the last merge, *mark* the peer's Redis (`mark.lua`) with a
//!    ticket, a time of the peer's Redis taken before the last read: every
//!    count admitted before it has landed. The mark checks that every merge
//!    of the round ran before it. Then move the cursor.
//!
//! A peer is heard, and counted at what it sent, only while its freshest
//! mark is within the staleness; a round that fails, or that cannot finish
//! within the staleness (a backlog too long for the link), marks nothing,
//! and the peer's decisions count this region at its conservative share.
//! Every instance of a region pushes the region's whole outbox from one
//! shared cursor, so an instance cut off from a peer costs nothing while
//! another one reaches it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::ConnectionManager;
use redis::{Script, Value};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::StoreError;
use crate::clock::Clock;
use crate::redis::backend_error;

/// The most entries one push to a peer carries.
pub const PUSH_BATCH: usize = 256;

/// The most merges one pipeline to a peer carries (the peer's Redis runs a
/// pipeline's commands one after the other, serving others in between
/// pipelines).
pub const PUSH_PIPELINE: usize = 8;

/// The time constant of the rates behind the overshoot estimate.
const RATE_SMOOTHING: Duration = Duration::from_secs(1);

/// The most outbox entries one read returns.
const READ_CHUNK: usize = 1024;

/// The most outbox entries one round reads; a longer backlog is delivered
/// over several rounds, marked by the one that reaches its end.
const ROUND_ENTRIES: usize = 65_536;

/// A time of a peer's Redis, returned by one mark and carried by the next:
/// its `TIME` and its clock (the same but in tests), in µs.
#[derive(Debug, Clone, Copy)]
struct Ticket {
    real: u64,
    clock: u64,
}

/// One peer region: its connection, and what this instance last saw of it.
pub(super) struct Peer {
    pub(super) name: String,
    connection: ConnectionManager,
    /// The clock of the peer's Redis in tests (its `TIME` otherwise).
    clock: Option<Arc<dyn Clock>>,
    ticket: Mutex<Option<Ticket>>,
    reachable: AtomicBool,
    seen: Mutex<Seen>,
}

/// What the last status read found of one peer.
#[derive(Debug, Clone, Default)]
struct Seen {
    /// Whether decisions count the peer conservatively.
    conservative: bool,
    /// How long before the read the freshest mark's ticket was taken.
    lag: Option<Duration>,
    skewed: bool,
    /// Bounds of the peer's clock minus this region's, µs.
    skew: Option<(i64, i64)>,
    backlog: u64,
    /// Units heard from the peer by policy, and when they were read.
    arrived: HashMap<String, u64>,
    read_at: Option<Instant>,
    /// Units per second heard from the peer by policy, over the last read.
    rates: HashMap<String, f64>,
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

    fn clock_arg(&self) -> u64 {
        self.clock.as_ref().map_or(0, |c| c.now())
    }
}

/// What a [`MultiRegionStore`](super::MultiRegionStore) reports of one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerStatus {
    /// The peer region's name.
    pub region: String,
    /// Whether decisions count the peer at its conservative share: never
    /// marked, marked longer than the staleness ago, or its clock off by
    /// more than the skew allowed.
    pub stale: bool,
    /// The observed lag: how long before the last status read the peer's
    /// freshest mark was taken (everything the peer admitted before then
    /// had landed here); `None` when never.
    pub last_heard: Option<Duration>,
    /// Whether the peer's clock is off by more than the skew allowed.
    pub skewed: bool,
    /// Bounds of the peer's clock minus this region's, in µs, from the
    /// peer's last mark; `None` before the first.
    pub skew: Option<(i64, i64)>,
    /// Entries of this region's outbox not yet delivered to the peer.
    pub backlog: u64,
    /// Whether this instance's last round of pushes to the peer succeeded.
    pub reachable: bool,
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

/// A script with the shared integer helpers ahead of it.
pub(super) fn script(source: &str) -> Script {
    Script::new(&format!("{}\n{source}", include_str!("lua/numbers.lua")))
}

/// The timing of the store and its sync.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    pub(super) sync: Duration,
    pub(super) staleness: Duration,
    pub(super) max_skew: Duration,
    pub(super) push_timeout: Duration,
}

/// The state the store and its sync tasks share.
pub(super) struct Shared {
    region: String,
    prefix: String,
    local: ConnectionManager,
    pub(super) peers: Vec<Peer>,
    pub(super) timing: Timing,
    fixed_clock: Option<Arc<dyn Clock>>,
    /// A random id of this instance, and its rounds so far: round ids.
    instance: u64,
    rounds: AtomicU64,
    merge: Arc<Script>,
    mark: Arc<Script>,
    outbox: Script,
    cursor: Script,
    heard: Script,
}

/// One read of the outbox.
struct Read {
    epoch: String,
    last: u64,
    done: bool,
    clock: u64,
    born: String,
    entries: Vec<Entry>,
}

/// What a round's mark claims: every count admitted before `ticket` (a time
/// of the peer's Redis) has landed there, read by a last read when this
/// region's clock read `clock`, on top of what the cursor says was
/// delivered into the generation `relied` (empty: nothing, the round
/// started from the outbox's beginning).
struct Mark<'a> {
    ticket: Ticket,
    clock: u64,
    relied: &'a str,
    /// False when the round read only part of a longer backlog: it claims
    /// no ticket, and only learns the generation its part landed in.
    whole: bool,
}

/// The answer to a mark.
enum Marked {
    /// Marked, in this generation of the peer's Redis.
    Yes(String),
    /// The peer's Redis no longer holds what the cursor says.
    StartOver,
    /// A merge of the round had not run.
    Incomplete,
}

fn parse_mark(reply: &Value) -> Result<(Ticket, Marked), StoreError> {
    let bad = || bad_reply("mark.lua", reply);
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let [real, clock, marked, born] = items.as_slice() else {
        return Err(bad());
    };
    let ticket = Ticket {
        real: number(real).ok_or_else(bad)?,
        clock: number(clock).ok_or_else(bad)?,
    };
    let marked = match number(marked).ok_or_else(bad)? {
        1 => Marked::Yes(text(born).ok_or_else(bad)?),
        0 => Marked::StartOver,
        _ => Marked::Incomplete,
    };
    Ok((ticket, marked))
}

/// One entry of the outbox: this region's count of a key in one window.
struct Entry {
    hash: String,
    start: u64,
    window: u64,
    value: u64,
}

fn number(value: &Value) -> Option<u64> {
    text(value)?.parse().ok()
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::Int(n) => Some(n.to_string()),
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn bad_reply(script: &str, reply: &Value) -> StoreError {
    StoreError::Backend(format!("unexpected reply to {script}: {reply:?}").into())
}

/// `<start>:<window>:<hash>`.
fn parse_member(member: &str, value: u64) -> Option<Entry> {
    let (start, rest) = member.split_once(':')?;
    let (window, hash) = rest.split_once(':')?;
    Some(Entry {
        hash: hash.to_owned(),
        start: start.parse().ok()?,
        window: window.parse().ok()?,
        value,
    })
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

impl Shared {
    pub(super) fn new(
        region: String,
        prefix: String,
        local: ConnectionManager,
        peers: Vec<Peer>,
        timing: Timing,
        fixed_clock: Option<Arc<dyn Clock>>,
    ) -> Self {
        Shared {
            region,
            prefix,
            local,
            peers,
            timing,
            fixed_clock,
            instance: {
                use std::hash::{BuildHasher, Hasher};
                std::collections::hash_map::RandomState::new()
                    .build_hasher()
                    .finish()
            },
            rounds: AtomicU64::new(0),
            merge: Arc::new(script(include_str!("lua/merge.lua"))),
            mark: Arc::new(script(include_str!("lua/mark.lua"))),
            outbox: script(include_str!("lua/outbox.lua")),
            cursor: script(include_str!("lua/cursor.lua")),
            heard: Script::new(include_str!("lua/heard.lua")),
        }
    }

    /// Starts one push task per peer and the status task, on the current
    /// runtime. They hold the shared state, not the store: the store aborts
    /// them when its last clone drops.
    pub(super) fn start(self: &Arc<Self>) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::with_capacity(self.peers.len() + 1);
        for index in 0..self.peers.len() {
            tasks.push(self.every_sync(move |shared| async move {
                let _ = shared.push(index).await;
            }));
        }
        tasks.push(self.every_sync(|shared| async move {
            let _ = shared.refresh().await;
        }));
        tasks
    }

    /// A task that runs `tick` on the shared state every sync interval
    /// (a tick that overruns delays the next one).
    fn every_sync<F, Fut>(self: &Arc<Self>, tick: F) -> JoinHandle<()>
    where
        F: Fn(Arc<Self>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(shared.timing.sync);
            interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                tick(Arc::clone(&shared)).await;
            }
        })
    }

    fn fixed_now(&self) -> u64 {
        self.fixed_clock.as_ref().map_or(0, |c| c.now())
    }

    /// Per policy, the units the peers admitted that this region had not
    /// heard of yet, as of the last status read: each peer's rate under the
    /// policy (over the last sync interval) times its lag, capped at the
    /// staleness (beyond it the peer is counted at its share instead).
    pub(super) fn overshoot(&self) -> std::collections::BTreeMap<String, f64> {
        let cap = self.timing.staleness.as_secs_f64();
        let mut estimate = std::collections::BTreeMap::new();
        for peer in &self.peers {
            let seen = peer.seen.lock();
            let lag = seen.lag.map_or(cap, |lag| lag.as_secs_f64().min(cap));
            for (policy, rate) in &seen.rates {
                *estimate.entry(policy.clone()).or_insert(0.0) += rate * lag;
            }
        }
        estimate
    }

    pub(super) fn status(&self) -> Vec<PeerStatus> {
        self.peers
            .iter()
            .map(|p| {
                let seen = p.seen.lock();
                PeerStatus {
                    region: p.name.clone(),
                    stale: seen.conservative,
                    last_heard: seen.lag,
                    skewed: seen.skewed,
                    skew: seen.skew,
                    backlog: seen.backlog,
                    reachable: p.reachable.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// One round of pushes to peer `index` (see the module docs), with its
    /// logs and metrics.
    pub(super) async fn push(self: &Arc<Self>, index: usize) -> Result<(), StoreError> {
        let peer = &self.peers[index];
        let result = self.round(index).await;
        let reachable = result.is_ok();
        if peer.reachable.swap(reachable, Ordering::Relaxed) != reachable {
            if reachable {
                tracing::info!(region = %self.region, peer = %peer.name, "multi-region: peer reachable again");
            } else if let Err(e) = &result {
                tracing::warn!(region = %self.region, peer = %peer.name, error = %e, "multi-region: cannot push to peer");
            }
        }
        #[cfg(feature = "metrics")]
        if !reachable {
            ::metrics::counter!(
                crate::metrics::REGION_PUSH_FAILURES,
                "region" => self.region.clone(),
                "peer" => peer.name.clone()
            )
            .increment(1);
        }
        result
    }

    async fn round(self: &Arc<Self>, index: usize) -> Result<(), StoreError> {
        let peer = &self.peers[index];
        let held = *peer.ticket.lock();
        let ticket = match held {
            Some(ticket) => ticket,
            None => self.ask_ticket(peer).await?,
        };
        // Everything after the cursor, read before anything is sent: the
        // last read, after the ticket, is what the mark claims.
        let mut entries = Vec::new();
        let mut after = None;
        let mut first: Option<(String, String)> = None;
        let end = loop {
            let read = self.read(peer, after).await?;
            match &first {
                Some((epoch, _)) if *epoch != read.epoch => {
                    return Err(StoreError::Backend(
                        "multi-region: the outbox started a new epoch during a round".into(),
                    ));
                }
                Some(_) => {}
                None => first = Some((read.epoch.clone(), read.born.clone())),
            }
            entries.extend(read.entries);
            after = Some(read.last);
            if read.done {
                break Some((read.last, read.clock));
            }
            if entries.len() >= ROUND_ENTRIES {
                break None;
            }
        };
        let (epoch, relied) = first.unwrap_or_default();
        // A backlog longer than one round is delivered in part and claims
        // nothing (the peer counts this region at its share once the
        // staleness passes without a mark); the next round goes on from
        // where this one stopped.
        let (last, clock, whole) = match end {
            Some((last, clock)) => (last, clock, true),
            None => (after.unwrap_or(0), 0, false),
        };
        let mark = Mark {
            ticket,
            clock,
            relied: &relied,
            whole,
        };
        match self.send(peer, &epoch, &entries, mark).await? {
            Marked::Yes(born) => self.move_cursor(peer, Some(last), &epoch, &born).await,
            // The peer's Redis no longer holds what the cursor says: the
            // next round pushes the whole outbox.
            Marked::StartOver => self.move_cursor(peer, None, &epoch, &relied).await,
            Marked::Incomplete => Err(StoreError::Backend(
                "multi-region: a merge of the round had not run when it was marked".into(),
            )),
        }
    }

    /// Sends `entries` to the peer, [`PUSH_BATCH`] per merge and
    /// [`PUSH_PIPELINE`] merges per pipeline, then `mark` at the end of the
    /// last pipeline. The pipelines go out at once, in order, on one
    /// connection, so the peer's Redis runs every merge before the mark
    /// (which checks it did) and a round takes one round trip whatever its
    /// size, plus the time the peer's Redis takes to run it.
    async fn send(
        &self,
        peer: &Peer,
        epoch: &str,
        entries: &[Entry],
        mark: Mark<'_>,
    ) -> Result<Marked, StoreError> {
        let round = self.next_round();
        let batches: Vec<&[Entry]> = entries.chunks(PUSH_BATCH).collect();
        let mut pipes: Vec<redis::Pipeline> = batches
            .chunks(PUSH_PIPELINE)
            .map(|group| {
                let mut pipe = redis::pipe();
                for batch in group {
                    pipe.add_command(self.merge_command(peer, epoch, &round, batch));
                }
                pipe
            })
            .collect();
        if pipes.is_empty() {
            pipes.push(redis::pipe());
        }
        if let Some(last) = pipes.last_mut() {
            last.add_command(self.mark_command(peer, Some(&mark), &round, batches.len()));
        }
        let sends = pipes
            .into_iter()
            .map(|pipe| Box::pin(self.send_pipeline(peer, pipe)) as Pending)
            .collect();
        let mut replies = Vec::new();
        for reply in in_order(sends).await {
            replies = reply?;
        }
        let reply = replies
            .last()
            .ok_or_else(|| StoreError::Backend("multi-region: no reply to the mark".into()))?;
        let (next, marked) = parse_mark(reply)?;
        *peer.ticket.lock() = Some(next);
        Ok(marked)
    }

    /// Sends one pipeline to the peer (loading the scripts first if its
    /// Redis lost them, then sending it once more: merges are idempotent,
    /// and a mark whose round's merges did not all run marks nothing).
    fn send_pipeline(
        &self,
        peer: &Peer,
        pipe: redis::Pipeline,
    ) -> impl Future<Output = Result<Vec<Value>, StoreError>> + Send + 'static {
        let mut connection = peer.connection.clone();
        let timeout = self.timing.push_timeout;
        let (merge, mark) = (Arc::clone(&self.merge), Arc::clone(&self.mark));
        async move {
            let send = async {
                match pipe.query_async::<Vec<Value>>(&mut connection).await {
                    Err(e)
                        if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        merge.prepare_invoke().load_async(&mut connection).await?;
                        mark.prepare_invoke().load_async(&mut connection).await?;
                        pipe.query_async::<Vec<Value>>(&mut connection).await
                    }
                    other => other,
                }
            };
            tokio::time::timeout(timeout, send)
                .await
                .map_err(|_| StoreError::Timeout(timeout))?
                .map_err(backend_error)
        }
    }

    /// A fresh id for one round of this instance.
    fn next_round(&self) -> String {
        let n = self.rounds.fetch_add(1, Ordering::Relaxed);
        format!("{:x}-{n}", self.instance)
    }

    /// `EVALSHA merge.lua` of one batch.
    fn merge_command(&self, peer: &Peer, epoch: &str, round: &str, batch: &[Entry]) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.merge.get_hash())
            .arg(batch.len() + 2)
            .arg(arrived_key(&self.prefix, &self.region))
            .arg(rounds_key(&self.prefix, &self.region));
        for entry in batch {
            cmd.arg(&entry.hash);
        }
        cmd.arg(&self.region)
            .arg(epoch)
            .arg(peer.clock_arg())
            .arg(micros(self.timing.max_skew))
            .arg(&self.prefix)
            .arg(round);
        for entry in batch {
            cmd.arg(entry.start).arg(entry.window).arg(entry.value);
        }
        cmd
    }

    /// `EVALSHA mark.lua`: a mark behind `merges` merges of `round`, or a
    /// request for a ticket only.
    fn mark_command(
        &self,
        peer: &Peer,
        mark: Option<&Mark<'_>>,
        round: &str,
        merges: usize,
    ) -> redis::Cmd {
        // The heard hash outlives the staleness by far, and expires after
        // a day of silence at most.
        let ttl = self
            .timing
            .staleness
            .saturating_mul(10)
            .clamp(Duration::from_secs(60), Duration::from_secs(86_400));
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.mark.get_hash())
            .arg(2)
            .arg(heard_key(&self.prefix, &self.region))
            .arg(rounds_key(&self.prefix, &self.region))
            .arg(mark.map_or(0, |m| m.ticket.real))
            .arg(mark.map_or(0, |m| m.ticket.clock))
            .arg(mark.map_or(0, |m| m.clock))
            .arg(peer.clock_arg())
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
            .arg(micros(self.timing.max_skew))
            .arg(mark.map_or("", |m| m.relied))
            .arg(round)
            .arg(merges)
            .arg(u8::from(mark.is_some_and(|m| m.whole)));
        cmd
    }

    /// Reads the outbox after `after` (the peer's cursor when `None`).
    async fn read(&self, peer: &Peer, after: Option<u64>) -> Result<Read, StoreError> {
        let keys = outbox_keys(&self.prefix);
        let mut invocation = self.outbox.prepare_invoke();
        invocation
            .key(&keys[0])
            .key(&keys[2])
            .key(&keys[3])
            .arg(&peer.name)
            .arg(after.map_or(-1, |a| i64::try_from(a).unwrap_or(i64::MAX)))
            .arg(READ_CHUNK)
            .arg(self.fixed_now())
            .arg(micros(self.timing.max_skew));
        let mut connection = self.local.clone();
        let reply = tokio::time::timeout(
            self.timing.push_timeout,
            invocation.invoke_async::<Value>(&mut connection),
        )
        .await
        .map_err(|_| StoreError::Timeout(self.timing.push_timeout))?
        .map_err(backend_error)?;
        let bad = || bad_reply("outbox.lua", &reply);
        let Value::Array(items) = &reply else {
            return Err(bad());
        };
        if items.len() < 6 || items.len() % 2 != 0 {
            return Err(bad());
        }
        let entries = items[6..]
            .chunks_exact(2)
            .map(|pair| parse_member(&text(&pair[0])?, number(&pair[1])?))
            .collect::<Option<Vec<Entry>>>()
            .ok_or_else(bad)?;
        Ok(Read {
            epoch: text(&items[0]).ok_or_else(bad)?,
            last: number(&items[2]).ok_or_else(bad)?,
            done: number(&items[3]).ok_or_else(bad)? == 1,
            clock: number(&items[4]).ok_or_else(bad)?,
            born: text(&items[5]).ok_or_else(bad)?,
            entries,
        })
    }

    /// A ticket of the peer's Redis, nothing marked.
    async fn ask_ticket(&self, peer: &Peer) -> Result<Ticket, StoreError> {
        let mut pipe = redis::pipe();
        pipe.add_command(self.mark_command(peer, None, "", 0));
        let replies = self.send_pipeline(peer, pipe).await?;
        let reply = replies
            .first()
            .ok_or_else(|| StoreError::Backend("multi-region: no reply to the mark".into()))?;
        let (ticket, _) = parse_mark(reply)?;
        *peer.ticket.lock() = Some(ticket);
        Ok(ticket)
    }

    /// Moves the peer's cursor forward to `to`, or back to 0 when `None`.
    async fn move_cursor(
        &self,
        peer: &Peer,
        to: Option<u64>,
        epoch: &str,
        born: &str,
    ) -> Result<(), StoreError> {
        let keys = outbox_keys(&self.prefix);
        let mut invocation = self.cursor.prepare_invoke();
        invocation
            .key(&keys[3])
            .arg(&peer.name)
            .arg(to.map_or(-1, |t| i64::try_from(t).unwrap_or(i64::MAX)))
            .arg(epoch)
            .arg(born);
        let mut connection = self.local.clone();
        tokio::time::timeout(
            self.timing.push_timeout,
            invocation.invoke_async::<Value>(&mut connection),
        )
        .await
        .map_err(|_| StoreError::Timeout(self.timing.push_timeout))?
        .map_err(backend_error)?;
        Ok(())
    }

    /// Reads what this region's Redis holds of each peer (`heard.lua`):
    /// updates the status, logs changes, and records the lag, skew and
    /// overshoot estimate.
    pub(super) async fn refresh(&self) -> Result<(), StoreError> {
        let keys = outbox_keys(&self.prefix);
        let mut invocation = self.heard.prepare_invoke();
        invocation.key(&keys[0]).key(&keys[3]);
        for peer in &self.peers {
            invocation.key(heard_key(&self.prefix, &peer.name));
        }
        for peer in &self.peers {
            invocation.key(arrived_key(&self.prefix, &peer.name));
            invocation.arg(&peer.name);
        }
        let mut connection = self.local.clone();
        let reply = tokio::time::timeout(
            self.timing.push_timeout,
            invocation.invoke_async::<Value>(&mut connection),
        )
        .await
        .map_err(|_| StoreError::Timeout(self.timing.push_timeout))?
        .map_err(backend_error)?;
        let bad = || bad_reply("heard.lua", &reply);
        let Value::Array(items) = &reply else {
            return Err(bad());
        };
        let Some((now, rest)) = items.split_first() else {
            return Err(bad());
        };
        let now = number(now).ok_or_else(bad)?;
        if rest.len() != self.peers.len() * 6 {
            return Err(bad());
        }
        let read_at = Instant::now();
        let staleness = micros(self.timing.staleness);
        for (peer, fields) in self.peers.iter().zip(rest.chunks_exact(6)) {
            let at = text(&fields[0]).and_then(|t| t.parse::<i64>().ok());
            let lag = at
                .and_then(|at| u64::try_from(at).ok())
                .map(|at| Duration::from_micros(now.saturating_sub(at)));
            let skewed = number(&fields[1]) == Some(1);
            let skew = match (
                text(&fields[2]).and_then(|t| t.parse::<i64>().ok()),
                text(&fields[3]).and_then(|t| t.parse::<i64>().ok()),
            ) {
                (Some(lo), Some(hi)) => Some((lo, hi)),
                _ => None,
            };
            let backlog = number(&fields[4]).unwrap_or(0);
            let arrived: HashMap<String, u64> = match &fields[5] {
                Value::Array(pairs) => pairs
                    .chunks_exact(2)
                    .filter_map(|pair| Some((text(&pair[0])?, number(&pair[1])?)))
                    .collect(),
                _ => HashMap::new(),
            };
            let conservative = lag.is_none_or(|lag| micros(lag) > staleness) || skewed;
            let mut seen = peer.seen.lock();
            if seen.conservative != conservative {
                if conservative {
                    tracing::warn!(region = %self.region, peer = %peer.name, lag = ?lag, skewed, "multi-region: peer counted at its conservative share");
                } else {
                    tracing::info!(region = %self.region, peer = %peer.name, lag = ?lag, "multi-region: peer heard again");
                }
                #[cfg(feature = "metrics")]
                if conservative {
                    ::metrics::counter!(
                        crate::metrics::REGION_STALE_TRANSITIONS,
                        "region" => self.region.clone(),
                        "peer" => peer.name.clone()
                    )
                    .increment(1);
                }
            }
            if skewed && !seen.skewed {
                tracing::warn!(region = %self.region, peer = %peer.name, skew_micros = ?skew, max_skew = ?self.timing.max_skew, "multi-region: peer's clock is off by more than allowed");
            }
            let rates: HashMap<String, f64> = match seen.read_at {
                Some(before) if read_at > before => {
                    let seconds = (read_at - before).as_secs_f64();
                    // Smoothed over about a second: a sync interval is too
                    // short to tell a rate.
                    let keep = (-seconds / RATE_SMOOTHING.as_secs_f64()).exp();
                    let mut rates: HashMap<String, f64> = seen
                        .rates
                        .iter()
                        .map(|(policy, rate)| (policy.clone(), rate * keep))
                        .collect();
                    for (policy, &units) in &arrived {
                        let was = seen.arrived.get(policy).copied().unwrap_or(0);
                        // A counter that went back expired: count from 0.
                        let new = if units >= was { units - was } else { units };
                        *rates.entry(policy.clone()).or_default() +=
                            (1.0 - keep) * new as f64 / seconds;
                    }
                    rates.retain(|_, rate| *rate > 1e-9);
                    rates
                }
                _ => HashMap::new(),
            };
            #[cfg(feature = "metrics")]
            {
                let lag_seconds = lag.map_or(f64::INFINITY, |lag| lag.as_secs_f64());
                ::metrics::gauge!(
                    crate::metrics::REGION_PEER_LAG,
                    "region" => self.region.clone(),
                    "peer" => peer.name.clone()
                )
                .set(lag_seconds);
                if let Some((lo, hi)) = skew {
                    ::metrics::gauge!(
                        crate::metrics::REGION_PEER_SKEW,
                        "region" => self.region.clone(),
                        "peer" => peer.name.clone()
                    )
                    .set((lo as f64 + hi as f64) / 2e6);
                }
            }
            *seen = Seen {
                conservative,
                lag,
                skewed,
                skew,
                backlog,
                arrived,
                read_at: Some(read_at),
                rates,
            };
        }
        #[cfg(feature = "metrics")]
        for (policy, units) in self.overshoot() {
            ::metrics::gauge!(
                crate::metrics::REGION_OVERSHOOT,
                "region" => self.region.clone(),
                "policy" => policy
            )
            .set(units);
        }
        Ok(())
    }
}

/// A pipeline on its way to a peer.
type Pending = std::pin::Pin<Box<dyn Future<Output = Result<Vec<Value>, StoreError>> + Send>>;

/// Drives `sends` together, each first polled in the order given, so their
/// commands go out on the connection in that order; their outputs, in that
/// order.
async fn in_order(mut sends: Vec<Pending>) -> Vec<Result<Vec<Value>, StoreError>> {
    let mut outputs: Vec<Option<Result<Vec<Value>, StoreError>>> =
        sends.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (send, output) in sends.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match send.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}
