//! A few multiplexed connections to one Redis node, shared by every call.
//!
//! A multiplexed connection pipelines the commands of concurrent callers on
//! one socket: 64 decisions in flight are 64 commands written back to back,
//! not 64 round trips waiting for a free connection. Calls are spread over
//! the connections in turn. A connection that fails with an I/O error is
//! dropped, the calls still waiting on it are told (and sent again), and
//! the next call on its slot opens a new one, so a restarted or
//! failed-over Redis is used again without a health-check on every call.
//!
//! Behind Redis Sentinel (feature `sentinel`), the node is the master the
//! sentinels name (see `sentinel`): each connection remembers the master's
//! epoch it was opened in, and one of an older epoch is dropped unused.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError};
use tokio::sync::watch;
use tokio::time::Instant;

use super::scripts::AclProbe;

/// Runs `task` on the current tokio runtime, or fails as a store used
/// outside one.
pub(super) fn spawn_here(
    task: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RedisError> {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return Err(RedisError::from((
            redis::ErrorKind::Client,
            "RedisStore needs a tokio runtime",
        )));
    };
    runtime.spawn(task);
    Ok(())
}

/// What the task that holds `receiver`'s sender sends; none when the task
/// was dropped unfinished (its runtime shut down).
pub(super) async fn answer<T: Clone>(receiver: &mut watch::Receiver<Option<T>>) -> Option<T> {
    let sent = receiver.wait_for(Option::is_some).await.ok()?;
    Option::clone(&sent)
}

/// A connection and the id that tells it apart from its replacements.
pub(super) type Shared = (u64, Link);

/// A connection to a node: redis-rs's multiplexed connection, and whether
/// the store saw it break. Clones share both.
#[derive(Clone)]
pub(super) struct Link {
    connection: MultiplexedConnection,
    state: Arc<LinkState>,
}

/// What the clones of a [`Link`] share.
struct LinkState {
    broken: watch::Sender<bool>,
    /// Whether a probe of the connection is under way (one at a time).
    probing: AtomicBool,
    /// The connection, for probes.
    connection: MultiplexedConnection,
}

/// How long a call waits for its reply before its connection is probed.
const PROBE_AFTER: Duration = Duration::from_millis(20);

/// How long a probe waits for its `PING`.
const PROBE_FOR: Duration = Duration::from_secs(1);

impl Link {
    pub(super) fn new(connection: MultiplexedConnection) -> Self {
        Link {
            state: Arc::new(LinkState {
                broken: watch::Sender::new(false),
                probing: AtomicBool::new(false),
                connection: connection.clone(),
            }),
            connection,
        }
    }

    /// Tells every call still waiting on this connection that it broke.
    fn break_off(&self) {
        self.state.broken.send_replace(true);
    }
}

impl LinkState {
    /// Sends a `PING` on the connection, unless one is on its way, and
    /// tells the calls waiting on it that it broke if the `PING` fails so.
    fn probe(self: &Arc<Self>) {
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let state = Arc::clone(self);
        let probe = async move {
            let mut connection = state.connection.clone();
            let ping = redis::cmd("PING");
            let ping = ping.query_async::<redis::Value>(&mut connection);
            if let Ok(Err(e)) = tokio::time::timeout(PROBE_FOR, ping).await
                && (e.is_io_error() || e.is_connection_dropped())
                && !e.is_timeout()
            {
                state.broken.send_replace(true);
            }
            state.probing.store(false, Ordering::Release);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(probe)),
            Err(_) => self.probing.store(false, Ordering::Release),
        }
    }
}

/// `sent`, or a broken connection's error as soon as `state` says so,
/// whichever comes first (a reply that came wins).
///
/// When a node closes a connection under many calls, redis-rs 1.8 now and
/// then leaves a few of them with neither a reply nor an error, and they
/// would wait out their whole call timeout (under the default failure
/// policy, requests pass unlimited meanwhile). The first call that meets
/// the break tells the others (see [`Connections::discard`]), and each is
/// sent again on a new connection as any call whose connection broke: it
/// may have run, so it counts twice at worst, towards denying. When no
/// call meets it (every call on the connection lost so), a call that waited
/// [`PROBE_AFTER`] sends a `PING` on the connection: on a connection
/// redis-rs has closed, it fails at once, and the calls are told.
fn until_broken<'a, T: Send + 'a>(
    state: &Arc<LinkState>,
    mut sent: redis::RedisFuture<'a, T>,
) -> redis::RedisFuture<'a, T> {
    let mut broken = state.broken.subscribe();
    let state = Arc::clone(state);
    Box::pin(async move {
        let mut told = std::pin::pin!(broken.wait_for(|broken| *broken));
        let mut probe_at = std::pin::pin!(tokio::time::sleep(PROBE_AFTER));
        // Off once the signal ended without a break (its sender gone).
        let mut listening = true;
        let mut probed = false;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(result) = sent.as_mut().poll(cx) {
                return Poll::Ready(result);
            }
            if listening && let Poll::Ready(told) = told.as_mut().poll(cx) {
                listening = false;
                if told.is_ok() {
                    return Poll::Ready(Err(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "the connection broke under the call",
                    ))));
                }
            }
            if !probed && probe_at.as_mut().poll(cx).is_ready() {
                probed = true;
                state.probe();
            }
            Poll::Pending
        })
        .await
    })
}

impl redis::aio::ConnectionLike for Link {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        until_broken(&self.state, self.connection.req_packed_command(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        let sent = self.connection.req_packed_commands(pipeline, offset, count);
        until_broken(&self.state, sent)
    }

    fn get_db(&self) -> i64 {
        self.connection.get_db()
    }
}

/// What an opening gives its waiters: nothing yet, then the connection or
/// why it could not be opened.
type Opened = Option<Result<Shared, RedisError>>;

pub(super) struct Connections {
    opener: Arc<Opener>,
    slots: Box<[Arc<Slot>]>,
    turn: AtomicUsize,
}

/// What opening a connection takes, shared with the tasks that open them.
struct Opener {
    /// The node's client (behind Sentinel unused: each lookup of the master
    /// gives the master's).
    client: redis::Client,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    /// `None` for a cluster master's connections (see `masters`).
    probe: Option<AclProbe>,
    ids: AtomicU64,
    /// The master the sentinels name, when the node is theirs.
    #[cfg(feature = "sentinel")]
    master: Option<Arc<super::sentinel::Master>>,
}

#[derive(Default)]
struct Slot {
    current: Mutex<Option<Shared>>,
    /// The opening under way, if any: one per slot at a time, run by a task
    /// of its own, so that it completes whoever waits for it.
    opening: Mutex<Option<Underway>>,
    /// The sentinels' master epoch `current` was opened in.
    #[cfg(feature = "sentinel")]
    epoch: AtomicU64,
}

/// An opening under way: its id, what it gives, and when its connect
/// timeout ends (past it, its task would have ended it: the runtime that
/// runs the task is no longer driven, and another opening takes its place).
struct Underway {
    id: u64,
    opened: watch::Receiver<Opened>,
    ends: Instant,
}

impl Connections {
    /// `size` connections (at least 1), each opened within
    /// `connect_timeout` (log-in and `probe` included) and checked by `probe`
    /// when it opens.
    pub(super) fn new(
        client: redis::Client,
        connect_timeout: Duration,
        size: u32,
        probe: AclProbe,
    ) -> Self {
        Self::probed_by(client, connect_timeout, size, Some(probe))
    }

    fn probed_by(
        client: redis::Client,
        connect_timeout: Duration,
        size: u32,
        probe: Option<AclProbe>,
    ) -> Self {
        let size = usize::try_from(size.max(1)).unwrap_or(1);
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            // The store times each call itself (see `run_on_node`).
            .set_response_timeout(None);
        Connections {
            opener: Arc::new(Opener {
                client,
                config,
                connect_timeout,
                probe,
                ids: AtomicU64::new(1),
                #[cfg(feature = "sentinel")]
                master: None,
            }),
            slots: (0..size).map(|_| Arc::default()).collect(),
            turn: AtomicUsize::new(0),
        }
    }

    /// `size` connections (at least 1) to a master of a Redis Cluster,
    /// opened as [`new`](Self::new) opens them but not probed: the probe's
    /// key lives on one master, which the others redirect (the store probes
    /// the cluster once, as it builds).
    #[cfg(feature = "redis-cluster")]
    pub(super) fn unprobed(client: redis::Client, connect_timeout: Duration, size: u32) -> Self {
        Self::probed_by(client, connect_timeout, size, None)
    }

    /// `size` multiplexed connections (at least 1) to the master the
    /// sentinels name, as [`new`](Self::new) opens them.
    #[cfg(feature = "sentinel")]
    pub(super) fn following(
        master: Arc<super::sentinel::Master>,
        client: redis::Client,
        connect_timeout: Duration,
        size: u32,
        probe: AclProbe,
    ) -> Self {
        let mut connections = Self::new(client, connect_timeout, size, probe);
        // Always: the opener is not shared yet.
        if let Some(opener) = Arc::get_mut(&mut connections.opener) {
            opener.master = Some(master);
        }
        connections
    }

    /// The master the sentinels name, when the node is theirs.
    #[cfg(feature = "sentinel")]
    pub(super) fn master(&self) -> Option<&Arc<super::sentinel::Master>> {
        self.opener.master.as_ref()
    }

    /// Something failed that may mean the master changed: behind Sentinel,
    /// the next call asks the sentinels first (elsewhere, nothing to do).
    pub(super) fn suspect(&self) {
        #[cfg(feature = "sentinel")]
        if let Some(master) = &self.opener.master {
            master.suspect();
        }
    }

    /// The number of connections kept.
    pub(super) fn size(&self) -> usize {
        self.slots.len()
    }

    /// The next slot in turn.
    pub(super) fn next_slot(&self) -> usize {
        self.turn.fetch_add(1, Ordering::Relaxed) % self.slots.len()
    }

    /// The connection of `slot`, opened now if it has none, and kept only
    /// once the ACL probe passed on it (a missing write permission fails the
    /// call, and the next call probes again). A refused connection fails at
    /// once.
    ///
    /// The opening runs in a task of its own, not in the caller: a caller
    /// whose call times out first (a connection slower to open, TLS and
    /// log-in included, than a call may take) stops waiting, and the opening
    /// goes on, so a later call finds the connection open instead of
    /// starting again, and timing out again, for ever.
    pub(super) async fn get(&self, slot: usize) -> Result<Shared, RedisError> {
        // Behind Sentinel, a master that may have changed is looked up
        // before any call uses a connection to it. Boxed: rare.
        #[cfg(feature = "sentinel")]
        if let Some(master) = &self.opener.master {
            super::sentinel::keep_watching(master);
            master.failover_under_way()?;
            if master.is_suspect() {
                Box::pin(master.look_up()).await?;
            }
        }
        if let Some(shared) = self.current(slot) {
            return Ok(shared);
        }
        // Boxed: waiting for an opening is rare; kept inline, it made every
        // call's future larger.
        Box::pin(self.open(&self.slots[slot])).await
    }

    /// The connection of `slot`, if it has one open.
    pub(super) fn current(&self, slot: usize) -> Option<Shared> {
        self.fresh(&self.slots[slot])
    }

    /// The connection of `slot`, unless it leads to a master the sentinels
    /// no longer name (then it is dropped, and the next opening replaces it).
    fn fresh(&self, slot: &Slot) -> Option<Shared> {
        #[cfg(feature = "sentinel")]
        if let Some(master) = &self.opener.master {
            let mut current = slot.current.lock();
            if slot.epoch.load(Ordering::Acquire) != master.epoch() {
                *current = None;
            }
            return current.clone();
        }
        slot.current.lock().clone()
    }

    /// Waits for the opening of `slot`'s connection, started now unless one
    /// is under way (or the connection was opened meanwhile).
    async fn open(&self, slot: &Arc<Slot>) -> Result<Shared, RedisError> {
        // Another round when the opening was lost with its runtime (a store
        // shared by runtimes, one of them shut down), or when the node
        // closed the new connection (one that closes every connection
        // again and again): once more, not for ever.
        let mut lost = None;
        for _ in 0..2 {
            let (mut opened, start) = {
                let mut opening = slot.opening.lock();
                if let Some(shared) = self.fresh(slot) {
                    return Ok(shared);
                }
                self.underway(slot, &mut opening)
            };
            // Spawned with the slot's lock released: a task that cannot run
            // is dropped at once, and its drop takes the lock.
            if let Some(task) = start {
                spawn_here(task.run(Arc::clone(&self.opener)))?;
            }
            // None: the opening was dropped unfinished (its runtime shut
            // down), its slot freed.
            match answer(&mut opened).await {
                Some(Err(e)) if super::errors::closed_by_node(&e) => lost = Some(e),
                Some(result) => return result,
                None => {}
            }
        }
        Err(lost.unwrap_or_else(|| {
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the connection's opening stopped with the runtime that ran it",
            ))
        }))
    }

    /// The opening of `slot` under way (`opening`, its lock held), and the
    /// task to spawn when none was, now recorded there.
    fn underway(
        &self,
        slot: &Arc<Slot>,
        opening: &mut Option<Underway>,
    ) -> (watch::Receiver<Opened>, Option<Opening>) {
        let now = Instant::now();
        match &*opening {
            Some(underway) if now <= underway.ends => (underway.opened.clone(), None),
            _ => {
                let id = self.opener.ids.fetch_add(1, Ordering::Relaxed);
                let (sender, opened) = watch::channel(None);
                *opening = Some(Underway {
                    id,
                    opened: opened.clone(),
                    ends: now + self.opener.connect_timeout,
                });
                let task = Opening {
                    slot: Arc::clone(slot),
                    id,
                    sender,
                };
                (opened, Some(task))
            }
        }
    }

    /// Starts opening the connection of `slot`, unless it is open or being
    /// opened, and waits for nothing (a cluster's master connections: the
    /// cluster client serves their requests meanwhile).
    #[cfg(feature = "redis-cluster")]
    pub(super) fn open_soon(&self, slot: usize) {
        let slot = &self.slots[slot];
        let start = {
            let mut opening = slot.opening.lock();
            if self.fresh(slot).is_some() {
                return;
            }
            self.underway(slot, &mut opening).1
        };
        // Spawned with the slot's lock released, as in `open`.
        if let (Some(task), Ok(runtime)) = (start, tokio::runtime::Handle::try_current()) {
            runtime.spawn(task.run(Arc::clone(&self.opener)));
        }
    }

    /// Forgets the connection `id` of `slot` (it failed), unless it was
    /// already replaced; when it [`Broke`](Gone::Broke), tells the calls
    /// still waiting on it (see [`until_broken`]).
    pub(super) fn discard(&self, slot: usize, id: u64, gone: Gone) {
        self.suspect();
        let mut current = self.slots[slot].current.lock();
        if current.as_ref().is_some_and(|(current, _)| *current == id)
            && let Some((_, link)) = current.take()
            && gone == Gone::Broke
        {
            link.break_off();
        }
    }
}

/// Why a connection is given up.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Gone {
    /// It broke (closed, reset, failed): what was sent on it and not
    /// answered either ran already or never will, so the calls still
    /// waiting on it are told, and sent again.
    Broke,
    /// It stalled (no reply by a call's deadline), or it leads to a node
    /// that is no longer a master: it is still open, and what was sent on
    /// it may still run. The calls waiting on it are not told (sent again,
    /// a call would run twice, and a concurrency permit taken by a run
    /// that comes late would be left held), and wait for their own reply
    /// or deadline; a release of an unclaimed permit sent on it then runs
    /// after the check it undoes, as `unclaimed` requires.
    Stalled,
}

impl Gone {
    /// Why a connection whose call failed with `e`, which
    /// [`breaks_connection`](super::breaks_connection), is given up.
    pub(super) fn of(e: &RedisError) -> Gone {
        if (e.is_io_error() || e.is_connection_dropped()) && !e.is_timeout() {
            Gone::Broke
        } else {
            Gone::Stalled
        }
    }
}

/// One slot's opening, run as a task; dropped unfinished (its runtime shut
/// down), it frees its slot for another.
struct Opening {
    slot: Arc<Slot>,
    id: u64,
    sender: watch::Sender<Opened>,
}

impl Opening {
    async fn run(self, opener: Arc<Opener>) {
        let opened = tokio::time::timeout(opener.connect_timeout, opener.open_in_epoch())
            .await
            .unwrap_or_else(|_| {
                Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "opening a connection (log-in and ACL probe included) took longer \
                     than the connect timeout",
                )))
            })
            .map(|(connection, epoch)| ((self.id, connection), epoch));
        #[cfg(feature = "sentinel")]
        if opened.is_err() {
            // Timed out or failed: the master may have changed.
            if let Some(master) = &opener.master {
                master.suspect();
            }
        }
        let mut opening = self.slot.opening.lock();
        let opened = opened.map(|(shared, epoch)| {
            let mut current = self.slot.current.lock();
            #[cfg(feature = "sentinel")]
            self.slot.epoch.store(epoch, Ordering::Release);
            #[cfg(not(feature = "sentinel"))]
            let _ = epoch;
            *current = Some(shared.clone());
            shared
        });
        self.end(&mut opening);
        self.sender.send_replace(Some(opened));
        drop(opening);
    }

    /// Frees the slot, unless another opening took it meanwhile.
    fn end(&self, opening: &mut Option<Underway>) {
        if opening
            .as_ref()
            .is_some_and(|underway| underway.id == self.id)
        {
            *opening = None;
        }
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        self.end(&mut self.slot.opening.lock());
    }
}

impl Opener {
    /// A new connection, probed, and the sentinels' master epoch it was
    /// opened in (0 on a node of its own).
    async fn open_in_epoch(&self) -> Result<(Link, u64), RedisError> {
        #[cfg(feature = "sentinel")]
        if let (Some(master), Some(probe)) = (&self.master, &self.probe) {
            return master.open(&self.config, probe).await;
        }
        self.open().await.map(|connection| (connection, 0))
    }

    /// A new connection, probed.
    async fn open(&self) -> Result<Link, RedisError> {
        let mut connection = Link::new(
            self.client
                .get_multiplexed_async_connection_with_config(&self.config)
                .await?,
        );
        if let Some(probe) = &self.probe {
            probe.run(&mut connection).await?;
        }
        Ok(connection)
    }
}

/// Where a single-node store takes its connections: its own few multiplexed
/// connections (the default), or the application's `bb8` pool (feature
/// `bb8`, see `pool`).
pub(super) enum Node {
    Own(Box<Connections>),
    #[cfg(feature = "bb8")]
    Pool(super::pool::Bb8),
}

/// A connection taken for one command, and how to give it back.
pub(super) struct Checkout {
    /// The connection to send the command on.
    pub(super) connection: Link,
    lease: Lease,
}

impl Checkout {
    /// The slot of the store's own connection (none for a pool's).
    pub(super) fn slot(&self) -> Option<usize> {
        match self.lease {
            Lease::Own { slot, .. } => Some(slot),
            #[cfg(feature = "bb8")]
            Lease::Pool(_) => None,
        }
    }
}

enum Lease {
    /// The connection of `slot`, whose id is `id`.
    Own { slot: usize, id: u64 },
    /// A connection of the pool, in use until dropped (then back in the pool).
    #[cfg(feature = "bb8")]
    Pool(super::pool::Pooled),
}

impl Node {
    /// How many connections the store uses at once: a call tries that many
    /// (plus one), and the coalescer keeps at most that many calls in flight.
    pub(super) fn size(&self) -> usize {
        match self {
            Node::Own(connections) => connections.size(),
            #[cfg(feature = "bb8")]
            Node::Pool(pool) => pool.size(),
        }
    }

    /// A connection for one command, probed if it is new (see [`AclProbe`]):
    /// the one of slot `again` when given, else the next in turn, after
    /// `pause` (boxed: rare, and its timer, inline, made every decision's
    /// future larger).
    pub(super) async fn checkout(
        &self,
        again: Option<usize>,
        pause: Duration,
    ) -> Result<Checkout, crate::StoreError> {
        if !pause.is_zero() {
            Box::pin(tokio::time::sleep(pause)).await;
        }
        match self {
            Node::Own(connections) => {
                let slot = again.unwrap_or_else(|| connections.next_slot());
                let (id, connection) = connections.get(slot).await.map_err(super::backend_error)?;
                Ok(Checkout {
                    connection,
                    lease: Lease::Own { slot, id },
                })
            }
            #[cfg(feature = "bb8")]
            Node::Pool(pool) => {
                let pooled = pool.checkout().await?;
                Ok(Checkout {
                    connection: Link::new(pooled.connection().clone()),
                    lease: Lease::Pool(pooled),
                })
            }
        }
    }

    /// The master the sentinels name, when the node is theirs.
    #[cfg(feature = "sentinel")]
    pub(super) fn master(&self) -> Option<&Arc<super::sentinel::Master>> {
        match self {
            Node::Own(connections) => connections.master(),
            #[cfg(feature = "bb8")]
            Node::Pool(_) => None,
        }
    }

    /// Something failed that may mean the master changed (a timeout): behind
    /// Sentinel, the next call asks the sentinels first.
    pub(super) fn suspect(&self) {
        match self {
            Node::Own(connections) => connections.suspect(),
            #[cfg(feature = "bb8")]
            Node::Pool(_) => {}
        }
    }

    /// Gives up `checkout`, whose connection failed or stalled: the store's
    /// own connection is dropped, and replaced by the next call on its slot;
    /// a pooled one is replaced in the pool (see `pool`).
    pub(super) fn discard(&self, checkout: Checkout, gone: Gone) {
        match (self, checkout.lease) {
            (Node::Own(connections), Lease::Own { slot, id }) => {
                connections.discard(slot, id, gone)
            }
            #[cfg(feature = "bb8")]
            (Node::Pool(pool), Lease::Pool(pooled)) => pool.replace(pooled),
            #[cfg(feature = "bb8")]
            _ => {}
        }
    }
}
