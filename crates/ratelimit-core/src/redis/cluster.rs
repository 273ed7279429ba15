//! A Redis Cluster, through redis-rs's cluster client, and the masters'
//! own connections.
//!
//! redis-rs's cluster client reads the topology, routes each command to the
//! master of its slot, follows `MOVED` and `ASK`, waits out `TRYAGAIN` and
//! `CLUSTERDOWN`, reconnects, and reads the slot map again when a node
//! answers `MOVED`. The store keeps two of its connections:
//!
//! - `first`, whose client retries nothing: its slot map is the store's
//!   (see `masters`). Every script call of the store's (a decision, a
//!   release, a refund) goes out once to the master of its keys' slot in
//!   that map, on the store's own first connection to that master (opened
//!   first if it is not open), or on `first` before the map names one. A
//!   reply of `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `CROSSSLOT` or
//!   `READONLY` means the node did not run the call (Redis checks every
//!   declared key before it runs a script, and a script touches no key it
//!   did not declare), and comes back to the store instead of being
//!   followed;
//! - `routed`, with redis-rs's retries: a call whose master refuses
//!   connections after its connection broke three times (it may have run
//!   each time: sent again, on new connections of the store's own and then
//!   here, it counts more than once at worst, which errs towards denying;
//!   a master that closes connections without refusing them is tried again
//!   on the store's own, after a pause that doubles, while the call has
//!   time) goes again through it, and redis-rs
//!   follows the redirection as it always does (a call on keys of one slot, all declared, is served
//!   by a node only when it holds all of them or none: Redis answers
//!   `TRYAGAIN` in between). Every other command (`PING`, `FUNCTION LOAD`,
//!   `DEL`) goes through `routed` too.
//!
//! A call that comes back redirected goes again, by the store itself, to
//! the master Redis names (one the slot map does not name yet, just added
//! to the cluster, included), on the store's own first connection to it: after
//! `MOVED`, as it is; after `ASK`, as `ASKING` and the call in one
//! pipeline. And on `MOVED` the store opens both connections again
//! ([`Cluster::refresh`]; redis-rs reads the slot map as it opens them), so
//! the calls that follow go to the new master. Why not redis-rs's
//! following:
//!
//! - it sends `ASKING`, awaits its reply, then sends the call, and another
//!   call on that connection may come between them and take the flag: under
//!   load the importing master answered `MOVED` back to the source, which
//!   asked again, until redis-rs's retries ran out or the call timed out,
//!   outages while every node was up;
//! - on `MOVED`, redis-rs 1.8 reads the slot map again under a lock that
//!   its own requests, waiting and not polled meanwhile, can hold: in about
//!   one slot move of a hundred under load, that client served nothing
//!   until each of its calls timed out.
//!
//! While a slot moves, the store also waits out `TRYAGAIN` itself. A
//! release follows its check on the same first connection to the same
//! master, so it runs after it. (A check redirected and then dropped by its
//! caller in flight may have its release run first, on another connection:
//! the permit is then held until its lease ends.) The coalescer's pipelines
//! go on the masters' connections too (see `masters`); a call of a pipeline
//! that Redis redirects goes again as a call of its own, here.
//!
//! A master that hangs answers nothing, not even `MOVED`, and the slot map
//! keeps sending its slots' calls there after its replica has been promoted. So a
//! call that times out makes the store open both connections again
//! (redis-rs reads the slot map as it opens them), at once and then every
//! [`REFRESH_EVERY`] for [`FAILOVER_WATCH`] after the last such call
//! ([`Cluster::watch`]): the calls that follow a promotion go to the new
//! master whatever the rate of traffic. The connections are swapped whole
//! (the slot map the pipelines follow with them); calls in flight finish
//! on the old ones. The same happens when the cluster client's own task is
//! gone with the runtime that ran it. (A master that refuses connections
//! needs none of this: its calls go through `routed` and `first`, and
//! redis-rs sends them to a node of its shard, which serves them once
//! promoted.)

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{ErrorKind, ServerErrorKind, Value};
use tokio::time::Instant as Deadline;

use super::connections::{Connections as MasterConnections, Gone};
use super::masters::{Masters, SlotMap, Watchers};
use super::scripts::Command;
use super::{Inner, backend_error, breaks_connection, cluster_error, slot_number};
use crate::StoreError;

/// A store's way to a Redis Cluster: its two connections, and how to open
/// them again (see the module's docs on failovers).
pub(super) struct Cluster {
    shared: Arc<Shared>,
}

/// What the calls and the task that reads the topology again share.
struct Shared {
    clients: Clients,
    connections: RwLock<Arc<Connections>>,
    /// Each master's own connections, for pipelines (see `masters`).
    masters: Masters,
    /// The wait between two of redis-rs's retries, and between two calls
    /// through `routed` when its retries ran out on a slot still moving.
    retry_wait: Duration,
    /// The bound on opening both connections.
    connect_timeout: Duration,
    /// Whether a task reads the topology again (one at a time).
    refreshing: AtomicBool,
    /// Milliseconds since `origin` until which the topology is read again
    /// every [`REFRESH_EVERY`].
    watch_until: AtomicU64,
    origin: Instant,
}

/// The clients the connections come from.
pub(super) struct Clients {
    /// Built with no retries.
    pub(super) first: ClusterClient,
    /// Built with redis-rs's retries, `retry_wait` apart.
    pub(super) routed: ClusterClient,
    /// The slot maps of `first`'s connections.
    pub(super) watchers: Arc<Watchers>,
}

struct Connections {
    /// Retries nothing: each script call's first attempt.
    first: ClusterConnection,
    /// redis-rs's routing and retries.
    routed: ClusterConnection,
    /// `first`'s slot map, as redis-rs last read it.
    slot_map: Arc<SlotMap>,
}

/// How many times a script call goes out at once on the store's own
/// connections when they break under it (killed, or their master
/// restarted), before it pauses between attempts, or goes through `routed`
/// when its master refuses connections. Calls sent to `routed` as soon as a
/// connection broke met redis-rs's own connections just broken as well, and
/// redis-rs answered some only when they timed out.
const OWN_ATTEMPTS: u32 = 3;

/// How often the topology is read again while a failover may be under way.
pub(super) const REFRESH_EVERY: Duration = Duration::from_millis(250);

/// How long after a call timed out the topology is read again, every
/// [`REFRESH_EVERY`].
pub(super) const FAILOVER_WATCH: Duration = Duration::from_secs(5);

impl Cluster {
    /// Opens the connections of `clients` (`routed` waiting `retry_wait`
    /// between its retries), each node within `connect_timeout`, then
    /// `masters`' own connections to each master the slot map names.
    pub(super) async fn connect(
        clients: Clients,
        masters: Masters,
        retry_wait: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let connections = open(&clients, connect_timeout).await?;
        masters
            .open_all(&connections.slot_map, connect_timeout)
            .await;
        Ok(Cluster {
            shared: Arc::new(Shared {
                clients,
                connections: RwLock::new(Arc::new(connections)),
                masters,
                retry_wait,
                connect_timeout,
                refreshing: AtomicBool::new(false),
                watch_until: AtomicU64::new(0),
                origin: Instant::now(),
            }),
        })
    }

    /// A connection through redis-rs's routing, for whatever it sends
    /// (probes, `INFO`).
    pub(super) fn routed(&self) -> ClusterConnection {
        self.shared.connections.read().routed.clone()
    }

    /// The masters' own connections.
    pub(super) fn masters(&self) -> &Masters {
        &self.shared.masters
    }

    /// The coalescing lane of `key`, and its slot: the lane is the master
    /// that serves the slot in the slot map of the current `first`
    /// connection (`None` before that connection read one, or while no
    /// master serves the slot).
    pub(super) fn lane_of(&self, key: &str) -> Option<(u16, u16)> {
        let slot = slot_number(redis::cluster_routing::Slot::for_key(key))?;
        // Read in place: a clone of the map's `Arc` per request is two
        // writes to a count every thread shares.
        let connections = self.shared.connections.read();
        let lane = self.shared.masters.lane_of(&connections.slot_map, slot)?;
        Some((lane, slot))
    }

    /// A call timed out (or found the cluster client's task gone): the node
    /// may hang, and its replica be promoted. The store reads the slot map
    /// again when a node answers `MOVED`, which a hung master never does, so
    /// it opens both connections again now (redis-rs reads the slot
    /// map as it opens them), then every [`REFRESH_EVERY`] until
    /// [`FAILOVER_WATCH`] has passed without another such call: the calls
    /// that follow a promotion find its master at any rate of traffic, one
    /// call every few seconds as well as thousands.
    pub(super) fn watch(&self) {
        let shared = &self.shared;
        let until = shared
            .millis()
            .saturating_add(u64::try_from(FAILOVER_WATCH.as_millis()).unwrap_or(u64::MAX));
        shared.watch_until.fetch_max(until, Ordering::Relaxed);
        self.refresh();
    }

    /// If `e` is a `MOVED` of `slot`: the store's slot map is out of date.
    /// The slot goes to the master named until the map is read again, and
    /// both connections open again once (redis-rs reads the slot map as it
    /// opens them), unless that is under way.
    fn moved(&self, slot: Slot, e: &redis::RedisError) {
        if e.kind() != ErrorKind::Server(ServerErrorKind::Moved) {
            return;
        }
        if let (Some(slot), Some((address, _))) = (slot_number(slot), e.redirect_node()) {
            let connections = self.shared.connections.read();
            self.shared
                .masters
                .moved(&connections.slot_map, slot, address);
        }
        self.refresh();
    }

    /// Opens both connections again once (redis-rs reads the slot map as it
    /// opens them), unless that is under way.
    fn refresh(&self) {
        let shared = &self.shared;
        if shared.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let refreshing = Refreshing(shared.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(refreshing.run());
        }
    }
}

impl Shared {
    fn millis(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// The task that opens the connections again; when it ends, or is dropped
/// with its runtime, the next call that times out or meets `MOVED` starts
/// another.
struct Refreshing(Arc<Shared>);

impl Refreshing {
    async fn run(self) {
        let shared = &self.0;
        loop {
            let started = Instant::now();
            // A failed opening keeps the connections there are.
            if let Ok(connections) = open(&shared.clients, shared.connect_timeout).await {
                *shared.connections.write() = Arc::new(connections);
            }
            if shared.millis() >= shared.watch_until.load(Ordering::Relaxed) {
                return;
            }
            tokio::time::sleep_until((started + REFRESH_EVERY).into()).await;
        }
    }
}

impl Drop for Refreshing {
    fn drop(&mut self) {
        self.0.refreshing.store(false, Ordering::Release);
    }
}

/// Both connections of `clients`, within three connect timeouts (a node
/// that does not answer holds each up for one).
async fn open(clients: &Clients, connect_timeout: Duration) -> Result<Connections, StoreError> {
    let opening = both(
        clients.first.get_async_connection(),
        clients.routed.get_async_connection(),
    );
    let (first, routed) = tokio::time::timeout(connect_timeout.saturating_mul(3), opening)
        .await
        .map_err(|_| StoreError::Timeout(connect_timeout))?;
    Ok(Connections {
        first: first.map_err(backend_error)?,
        routed: routed.map_err(backend_error)?,
        // One opening at a time: the map given last is `first`'s.
        slot_map: clients.watchers.take_last(),
    })
}

/// The outputs of `a` and `b`, run together (a node that does not answer
/// holds up each connection's opening for the connect timeout: once, not
/// twice).
async fn both<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut from_a, mut from_b) = (None, None);
    std::future::poll_fn(|cx| {
        if from_a.is_none()
            && let Poll::Ready(output) = a.as_mut().poll(cx)
        {
            from_a = Some(output);
        }
        if from_b.is_none()
            && let Poll::Ready(output) = b.as_mut().poll(cx)
        {
            from_b = Some(output);
        }
        match (from_a.take(), from_b.take()) {
            (Some(a), Some(b)) => Poll::Ready((a, b)),
            (a, b) => {
                (from_a, from_b) = (a, b);
                Poll::Pending
            }
        }
    })
    .await
}

impl Inner {
    /// Runs `cmd` on the cluster before `deadline`: a script call goes out
    /// to the master of its slot on the store's own first connection to it
    /// (through `first` while that connection is not open), follows a
    /// redirection the same way, and goes again through `routed` after a
    /// broken connection; any other command through `routed`.
    pub(super) async fn run_on_cluster(
        &self,
        cluster: &Cluster,
        cmd: &dyn Command,
        deadline: Deadline,
    ) -> Result<Value, StoreError> {
        let timeout = || {
            cluster.watch();
            StoreError::Timeout(self.call_timeout)
        };
        // redis-rs's routing hands back a server's error reply as a value
        // (the reply's own error, or a pipeline's); a call's is its error.
        let outcome = |result: Option<Result<Value, redis::RedisError>>| match result
            .map(|result| result.and_then(Value::extract_error))
        {
            None => Err(timeout()),
            Some(Err(e)) if e.is_timeout() => Err(timeout()),
            Some(Err(e)) => {
                if lost(&e) {
                    cluster.watch();
                }
                Err(cluster_error(e))
            }
            Some(Ok(value)) => Ok(value),
        };
        let connections = cluster.shared.connections.read().clone();
        let Some(slot) = cmd.slot() else {
            let mut routed = connections.routed.clone();
            let cmd = cmd.cmd();
            let sent = cmd.query_async::<Value>(&mut routed);
            return outcome(tokio::time::timeout_at(deadline, sent).await.ok());
        };
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
            Route::with_slot(slot, SlotAddr::Master),
        ));
        let retry_wait = cluster.shared.retry_wait;
        // How many connections broke under the call so far.
        let mut broken = 0;
        loop {
            let sent = match self.on_master_of(cluster, &connections, slot, cmd, deadline) {
                Some(sent) => Some(sent.await),
                None => {
                    let mut first = connections.first.clone();
                    let sent = first.route_command(cmd.cmd().into_owned(), routing.clone());
                    let sent = async { sent.await.and_then(Value::extract_error) };
                    tokio::time::timeout_at(deadline, sent).await.ok()
                }
            };
            let e = match sent {
                Some(Err(e)) if not_run(&e) || broke(&e) => e,
                other => return outcome(other),
            };
            // A connection that broke after the write may have run the
            // call: sent again, it counts twice at worst, which errs
            // towards denying, as on a single node's connections. Again on
            // a new connection of the store's own (the broken one is
            // dropped): [`OWN_ATTEMPTS`] at once, then, while the master
            // keeps closing connections, after a pause that doubles, while
            // the call has time. A master that refuses connections (gone,
            // or failing over) leaves the call to `routed`, which reads the
            // slot map again.
            if broke(&e) {
                broken += 1;
                if broken >= OWN_ATTEMPTS {
                    if e.is_connection_refusal() {
                        break;
                    }
                    let past = usize::try_from(broken - OWN_ATTEMPTS).unwrap_or(usize::MAX);
                    let pause = super::pause_before(past);
                    if Deadline::now() + pause >= deadline {
                        return outcome(Some(Err(e)));
                    }
                    tokio::time::sleep(pause).await;
                }
                continue;
            }
            // The slot is moving and the call's keys are split between its
            // two nodes: nothing ran; again while the call has time.
            if e.kind() == ErrorKind::Server(ServerErrorKind::TryAgain)
                && Deadline::now() + retry_wait < deadline
            {
                tokio::time::sleep(retry_wait).await;
                continue;
            }
            // The slot moved (the store's slot map is out of date: read it
            // again), or is moving and the call's keys are not on its
            // owner: sent to the master Redis names, on the store's own
            // connection to it.
            // The master named first, so that one just added to the
            // cluster is known when the slot's lane is patched.
            let redirected = if matches!(
                e.kind(),
                ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
            ) {
                self.redirected(cluster, &e, cmd, deadline)
            } else {
                None
            };
            cluster.moved(slot, &e);
            if let Some(redirected) = redirected {
                match redirected.await {
                    // Nothing ran (the keys are split between the nodes, or
                    // the slot moved on): again from the start, while the
                    // call has time.
                    Err(e) if not_run(&e) && Deadline::now() + retry_wait < deadline => {
                        cluster.moved(slot, &e);
                        tokio::time::sleep(retry_wait).await;
                        continue;
                    }
                    Err(e) if broke(&e) && broken + 1 < OWN_ATTEMPTS => {
                        broken += 1;
                        continue;
                    }
                    Err(e) if not_run(&e) || broke(&e) => {}
                    other => return outcome(Some(other)),
                }
            }
            break;
        }
        let mut routed = connections.routed.clone();
        loop {
            let sent = routed.route_command(cmd.cmd().into_owned(), routing.clone());
            let sent = async { sent.await.and_then(Value::extract_error) };
            match tokio::time::timeout_at(deadline, sent).await {
                // redis-rs's retries ran out between the two nodes of a slot
                // being moved: an `ASK` whose `ASKING` another command on
                // the target's connection took first, so that the target
                // answered `MOVED` back to the source, which asked again.
                // Nothing ran: again, while the call has time. (A `MOVED`
                // left at the end is a master that cannot be reached: an
                // outage, answered now.)
                Ok(Err(e))
                    if e.kind() == ErrorKind::Server(ServerErrorKind::Ask)
                        && Deadline::now() + retry_wait < deadline =>
                {
                    tokio::time::sleep(retry_wait).await;
                }
                other => return outcome(other.ok()),
            }
        }
    }

    /// Sends `cmd` to the master of `slot` in the slot map of
    /// `connections`, on the store's own first connection to it; `None`
    /// when the map names no master (not read yet, or the slot unserved).
    fn on_master_of<'a>(
        &self,
        cluster: &Cluster,
        connections: &Connections,
        slot: Slot,
        cmd: &'a dyn Command,
        deadline: Deadline,
    ) -> Option<impl Future<Output = Result<Value, redis::RedisError>> + 'a> {
        let masters = cluster.masters();
        let lane = masters.lane_of(&connections.slot_map, slot_number(slot)?)?;
        Some(on_first_connection(
            masters.connections(lane)?,
            None,
            cmd,
            deadline,
        ))
    }

    /// Sends `cmd`, which met `redirect` (a `MOVED` or an `ASK`), to the
    /// master it names, on the store's own first connection to that master;
    /// after an `ASK`, as `ASKING` and the call in one pipeline. A master the
    /// slot map does not name yet (just added to the cluster) is added.
    /// `None` when the address does not parse or too many masters are known
    /// (the caller goes through `routed`).
    ///
    /// One write, so no other command on the connection comes between
    /// `ASKING` and the call and takes the flag: redis-rs's cluster client
    /// sends `ASKING` and awaits it before it sends the call, a call that
    /// took another's flag is served by the importing master as if
    /// redirected, and one whose flag was taken meets `MOVED` back to the
    /// source; under load the two nodes answered the same call in turn until
    /// redis-rs's retries ran out.
    fn redirected<'a>(
        &self,
        cluster: &Cluster,
        redirect: &redis::RedisError,
        cmd: &'a dyn Command,
        deadline: Deadline,
    ) -> Option<impl Future<Output = Result<Value, redis::RedisError>> + 'a> {
        let asking = redirect.kind() == ErrorKind::Server(ServerErrorKind::Ask);
        let (address, _) = redirect.redirect_node()?;
        let connections = cluster.masters().connections_at(address)?;
        Some(on_first_connection(
            connections,
            asking.then(|| redis::cmd("ASKING")),
            cmd,
            deadline,
        ))
    }
}

/// Sends `cmd`, after `before` if given, in one pipeline on the first
/// connection of `connections` (a master's), opened first if it is not
/// open, before `deadline`.
///
/// Always the first: a permit's release then goes on the connection its
/// check went on, and runs after it (Redis runs one connection's commands
/// in order).
fn on_first_connection<'a>(
    connections: Arc<MasterConnections>,
    before: Option<redis::Cmd>,
    cmd: &'a dyn Command,
    deadline: Deadline,
) -> impl Future<Output = Result<Value, redis::RedisError>> + 'a {
    use redis::aio::ConnectionLike;

    let slot = 0;
    let timed_out = || {
        redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the master did not answer in time",
        ))
    };
    async move {
        let (id, mut link) = match connections.current(slot) {
            Some(open) => open,
            None => tokio::time::timeout_at(deadline, connections.get(slot))
                .await
                .unwrap_or_else(|_| Err(timed_out()))?,
        };
        let mut pipeline = redis::Pipeline::with_capacity(2);
        if let Some(before) = before {
            pipeline.add_command(before);
        }
        pipeline.add_command(cmd.cmd().into_owned());
        let sent = link.req_packed_commands(&pipeline, 0, pipeline.len());
        let result = tokio::time::timeout_at(deadline, sent)
            .await
            .unwrap_or_else(|_| Err(timed_out()));
        if let Err(e) = &result
            && breaks_connection(e)
        {
            connections.discard(slot, id, Gone::of(e));
        }
        // `ASKING` refused (`NOPERM`: the user lacks it) is the call's
        // error, a mistake to fix: without the flag the call meets `MOVED`,
        // and would go on asking until it timed out.
        result.and_then(|values| {
            if values.len() != pipeline.len() {
                return Err(redis::RedisError::from((
                    ErrorKind::Parse,
                    "a pipeline answered another number of replies than it sent",
                    format!("{} replies to {}", values.len(), pipeline.len()),
                )));
            }
            // The call's reply, or the first error (`before`'s, then the call's).
            values
                .into_iter()
                .try_fold(Value::Nil, |_, value| value.extract_error())
        })
    }
}

/// Whether `e` says the call's connection broke (the call may have run),
/// other than by a timeout.
fn broke(e: &redis::RedisError) -> bool {
    breaks_connection(e) && !e.is_timeout()
}

/// Whether `e` says the node did not run the call, its slot being served
/// elsewhere or not at all now (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`,
/// `CROSSSLOT`, or `READONLY` from a master demoted meanwhile).
fn not_run(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::CrossSlot
                | ServerErrorKind::ReadOnly
        )
    )
}

/// Whether `e` says the cluster client's own task is gone (it ended with
/// the runtime that ran it): redis-rs 1.8 could then neither send the
/// command to it nor hear back. A node that refuses or drops its
/// connection is not such a case: redis-rs reconnects to it, or sends its
/// slots' calls to its replica, without the store.
fn lost(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Io && e.to_string().contains("redis_cluster: Unable to")
}
