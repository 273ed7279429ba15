//! A Redis Cluster's masters, each on multiplexed connections of the
//! store's own: under load, the coalescer sends the requests of one master
//! as one pipeline, a script call per hash slot, so that one round trip
//! carries many decisions where a call per slot carried one or two (with
//! random keys a slot rarely has two requests waiting).
//!
//! Each call of a pipeline declares every key it touches, all of one slot
//! (Redis refuses more, `CROSSSLOT`). redis-rs's cluster client would route
//! such a pipeline, but a redirection of one call makes it answer the whole
//! pipeline with that error, which loses the replies of the calls that ran.
//! So the pipeline goes out on a connection to the master itself, and each
//! call's reply is read on its own:
//!
//! - a decision is delivered;
//! - an error reply (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `READONLY`:
//!   the slot is served elsewhere or not at all now; or `Function not
//!   found`, `NOSCRIPT` and the like) sends each of the call's requests
//!   again on its own, where it meets the path of a call of its own (see
//!   `cluster`): redirections followed, scripts reloaded, errors
//!   reported (a missing function library is loaded once for the pipeline
//!   first, not once per request). Redis checks the slot's ownership and every declared key
//!   before it runs a script, so a redirected call ran nowhere, and sending
//!   it again counts it once. (A script that failed halfway would count
//!   twice at worst, which errs towards denying.) No call is ever followed
//!   to another node as a whole;
//! - a connection that breaks sends every request again on its own, as a
//!   call of its own is sent again after a broken connection; one that
//!   times out is an outage for each, and makes the cluster connections
//!   read the topology again (see `cluster`).
//!
//! A master's connection that is not open (yet, or again after it failed)
//! opens in the background, and the pipelines meanwhile go as calls of
//! their own through the cluster client, as they would without coalescing:
//! a pipeline never waits for a connection to open.
//!
//! Which master serves a slot is redis-rs's slot map, as the cluster
//! client's `first` connection last read it: the store hears it through
//! [`ReadRoutingStrategy::on_topology_changed`] (the strategy routes no
//! read elsewhere: every script call goes to a master). A map out of date
//! sends a call to a master that answers `MOVED`; its requests go again on
//! their own, follow the redirection, and have the store open the cluster
//! client's connections again, which reads the slot map again.
//!
//! Requests that hold concurrency permits never go in a pipeline: their
//! release must follow them on the connection they went on (see
//! `unclaimed`): a call of its own goes on its master's first connection,
//! and so does the release.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use redis::Value;
use redis::aio::ConnectionLike;
use redis::cluster::NodeAddress;
use redis::cluster_read_routing::{
    ClusterTopology, ReadCandidates, ReadRoutingStrategy, ReadRoutingStrategyFactory,
};
use smallvec::SmallVec;
use tokio::time::Instant as Deadline;

use super::cluster::Cluster;
use super::coalesce::{Decided, Item, answer, batch_args, batch_results, share};
use super::connections::{Connections, Gone};
use super::functions::names_no_function;
use super::scripts::{Library, Named, StateKeys, invocation};
use super::unclaimed::SentOn;
use super::{
    Arg, RedisStore, breaks_connection, decision_of, parameters, single_args, text_fields,
};
use crate::StoreError;

/// The slot map of one connection of the cluster client, as redis-rs last
/// read it, with each slot's lane found from it.
#[derive(Default)]
pub(super) struct SlotMap(RwLock<Mapped>);

#[derive(Default)]
struct Mapped {
    /// `None` before redis-rs first read the map.
    topology: Option<ClusterTopology>,
    /// Each slot's lane ([`UNSERVED`] where none is known), found once per
    /// topology and list of masters instead of once per request: empty
    /// until the first request after the topology changed.
    lanes: Vec<u16>,
    /// [`Masters::changes`] when `lanes` were found.
    changes: u64,
}

/// A slot no master serves (or none the store could add) in a [`Mapped`]'s lanes.
const UNSERVED: u16 = u16::MAX;

/// The most masters the store keeps connections to: Redis Cluster's own
/// advice is at most 1,000 nodes.
const MAX_MASTERS: usize = 1_024;

/// The number of hash slots of a Redis Cluster.
const SLOTS: usize = 16384;

/// Gives each connection the `first` cluster client opens a [`SlotMap`] of
/// its own, and keeps the one given last until the store takes it with
/// that connection ([`Watchers::take_last`]): the store opens one such
/// connection at a time.
#[derive(Default)]
pub(super) struct Watchers {
    last: Mutex<Option<Arc<SlotMap>>>,
}

impl Watchers {
    /// The slot map of the connection opened last.
    pub(super) fn take_last(&self) -> Arc<SlotMap> {
        self.last.lock().take().unwrap_or_default()
    }
}

/// The factory redis-rs asks for each new connection's strategy.
pub(super) struct WatcherFactory(pub(super) Arc<Watchers>);

impl ReadRoutingStrategyFactory for WatcherFactory {
    fn create_strategy(&self) -> Box<dyn ReadRoutingStrategy> {
        let map = Arc::new(SlotMap::default());
        *self.0.last.lock() = Some(map.clone());
        Box::new(Watcher(map))
    }
}

/// Records a connection's slot map; routes reads as redis-rs does without
/// a strategy (the store sends none).
struct Watcher(Arc<SlotMap>);

impl ReadRoutingStrategy for Watcher {
    fn on_topology_changed(&self, topology: ClusterTopology) {
        let mut mapped = self.0.0.write();
        mapped.topology = Some(topology);
        mapped.lanes = Vec::new();
    }

    fn route_read<'a>(&self, candidates: &ReadCandidates<'a>) -> &'a NodeAddress {
        match candidates {
            ReadCandidates::AnyNode(candidates) => candidates.primary(),
            ReadCandidates::ReplicasOnly(candidates) => candidates.replicas().choose_random(),
        }
    }
}

/// The masters met so far, each with its own connections; a coalescing
/// lane is an index here.
pub(super) struct Masters {
    /// The first seed URL's settings (user, password, protocol, TLS), which
    /// redis-rs's cluster client also uses for every node.
    seed: redis::ConnectionInfo,
    #[cfg(feature = "tls")]
    root_cert: Option<Vec<u8>>,
    connect_timeout: Duration,
    pool_size: u32,
    /// An entry whose address no longer leads a shard is given to the next
    /// new master, so the list stays as long as the cluster is wide.
    known: RwLock<Vec<Master>>,
    /// How many times `known` changed: a slot map's lanes found before the
    /// last change are found again.
    changes: AtomicU64,
}

struct Master {
    address: NodeAddress,
    connections: Arc<Connections>,
}

impl Masters {
    /// Connections to each master as `seed` (the first seed URL) says, `pool_size`
    /// shared by the masters, each opened within `connect_timeout`.
    pub(super) fn new(
        seed: redis::ConnectionInfo,
        #[cfg(feature = "tls")] root_cert: Option<Vec<u8>>,
        connect_timeout: Duration,
        pool_size: u32,
    ) -> Self {
        Masters {
            seed,
            #[cfg(feature = "tls")]
            root_cert,
            connect_timeout,
            pool_size,
            known: RwLock::new(Vec::new()),
            changes: AtomicU64::new(0),
        }
    }

    /// The lane of the master that serves `slot` in `map`, if it names one
    /// (a new master is added).
    pub(super) fn lane_of(&self, map: &SlotMap, slot: u16) -> Option<u16> {
        let changes = self.changes.load(Ordering::Acquire);
        {
            let mapped = map.0.read();
            mapped.topology.as_ref()?;
            if mapped.changes == changes
                && let Some(&lane) = mapped.lanes.get(usize::from(slot))
            {
                return (lane != UNSERVED).then_some(lane);
            }
        }
        let mut mapped = map.0.write();
        // Found meanwhile by another request.
        let changes = self.changes.load(Ordering::Acquire);
        if mapped.changes == changes
            && let Some(&lane) = mapped.lanes.get(usize::from(slot))
        {
            return (lane != UNSERVED).then_some(lane);
        }
        let Mapped {
            topology, lanes, ..
        } = &mut *mapped;
        let topology = topology.as_ref()?;
        let mut found = vec![UNSERVED; SLOTS];
        for shard in topology.shards() {
            let lane = self.lane_of_primary(topology, shard.primary());
            for &(start, end) in shard.slot_ranges() {
                let range = usize::from(start)..=usize::from(end).min(SLOTS - 1);
                if let Some(slots) = found.get_mut(range) {
                    slots.fill(lane.unwrap_or(UNSERVED));
                }
            }
        }
        *lanes = found;
        // As read before finding them: a change made meanwhile (a master
        // added here, or by another slot map) finds them again.
        mapped.changes = changes;
        mapped
            .lanes
            .get(usize::from(slot))
            .copied()
            .filter(|&lane| lane != UNSERVED)
    }

    /// A node answered `MOVED` for `slot`, naming the known master at
    /// `address`: the slot's lane in `map` is that master's until the map
    /// is read again (the calls in between go straight there).
    pub(super) fn moved(&self, map: &SlotMap, slot: u16, address: &str) {
        let Some(lane) = self.index_of(address).and_then(|i| u16::try_from(i).ok()) else {
            return;
        };
        // The lanes found first, from the map as it is.
        self.lane_of(map, slot);
        if let Some(found) = map.0.write().lanes.get_mut(usize::from(slot)) {
            *found = lane;
        }
    }

    /// The lane of `primary`, a master of `topology` (added if new).
    fn lane_of_primary(&self, topology: &ClusterTopology, primary: &NodeAddress) -> Option<u16> {
        let found = self
            .known
            .read()
            .iter()
            .position(|master| master.address == *primary);
        let index = match found {
            Some(index) => index,
            None => self.add(topology, primary)?,
        };
        u16::try_from(index).ok()
    }

    /// Opens the connections of every master `map` names, within `timeout`
    /// in all (one that does not open by then goes on opening, and the
    /// cluster client serves its master's requests meanwhile).
    pub(super) async fn open_all(&self, map: &SlotMap, timeout: Duration) {
        let masters: Vec<Arc<Connections>> = {
            let map = map.0.read();
            let Some(topology) = map.topology.as_ref() else {
                return;
            };
            topology
                .shards()
                .filter_map(|shard| self.lane_of_primary(topology, shard.primary()))
                .filter_map(|lane| self.connections(lane))
                .collect()
        };
        for connections in &masters {
            for slot in 0..connections.size() {
                connections.open_soon(slot);
            }
        }
        let deadline = Deadline::now() + timeout;
        for connections in &masters {
            for slot in 0..connections.size() {
                let _ = tokio::time::timeout_at(deadline, connections.get(slot)).await;
            }
        }
    }

    /// The connections of the master at `address` (`host:port`), which a
    /// redirection named: one the slot map does not name yet (a master just
    /// added to the cluster) is added, its connections opened when first used.
    pub(super) fn connections_at(&self, address: &str) -> Option<Arc<Connections>> {
        let index = match self.index_of(address) {
            Some(index) => index,
            None => self.add_named(&NodeAddress::try_from(address).ok()?)?,
        };
        self.known
            .read()
            .get(index)
            .map(|master| master.connections.clone())
    }

    /// Adds `primary`, named by a redirection before the slot map named it,
    /// unless [`MAX_MASTERS`] are known (the map's next reading replaces
    /// masters that are gone).
    fn add_named(&self, primary: &NodeAddress) -> Option<usize> {
        let client = self.client(primary)?;
        let mut known = self.known.write();
        if let Some(index) = known.iter().position(|m| m.address == *primary) {
            return Some(index);
        }
        if known.len() >= MAX_MASTERS {
            return None;
        }
        let size = self.pool_size / u32::try_from(known.len() + 1).unwrap_or(u32::MAX);
        known.push(Master {
            address: primary.clone(),
            connections: Arc::new(Connections::unprobed(client, self.connect_timeout, size)),
        });
        self.changes.fetch_add(1, Ordering::AcqRel);
        Some(known.len() - 1)
    }

    /// The index of the known master at `address` (`host:port`).
    fn index_of(&self, address: &str) -> Option<usize> {
        let address = NodeAddress::try_from(address).ok()?;
        self.known
            .read()
            .iter()
            .position(|master| master.address == address)
    }

    /// The connections of the master of `lane`.
    pub(super) fn connections(&self, lane: u16) -> Option<Arc<Connections>> {
        let known = self.known.read();
        known
            .get(usize::from(lane))
            .map(|master| master.connections.clone())
    }

    /// Adds `primary`, in the place of a master `topology` no longer names
    /// if there is one; its connections open when first used.
    fn add(&self, topology: &ClusterTopology, primary: &NodeAddress) -> Option<usize> {
        let client = self.client(primary)?;
        let masters = topology.shards().count().max(1);
        let size = self.pool_size / u32::try_from(masters).unwrap_or(u32::MAX);
        let master = Master {
            address: primary.clone(),
            connections: Arc::new(Connections::unprobed(client, self.connect_timeout, size)),
        };
        let mut known = self.known.write();
        if let Some(index) = known.iter().position(|m| m.address == *primary) {
            return Some(index);
        }
        let gone = known
            .iter()
            .position(|m| topology.shards().all(|shard| *shard.primary() != m.address));
        let index = match gone {
            Some(index) => {
                known[index] = master;
                index
            }
            None => {
                known.push(master);
                known.len() - 1
            }
        };
        self.changes.fetch_add(1, Ordering::AcqRel);
        Some(index)
    }

    /// A client of the node at `address`, with the seed's settings.
    fn client(&self, address: &NodeAddress) -> Option<redis::Client> {
        let (host, port) = (address.host().to_owned(), address.port());
        let addr = match self.seed.addr() {
            redis::ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => redis::ConnectionAddr::Tcp(host, port),
        };
        let info = self.seed.clone().set_addr(addr);
        #[cfg(feature = "tls")]
        let client = super::builder::client_trusting(info, self.root_cert.clone());
        #[cfg(not(feature = "tls"))]
        let client = redis::Client::open(info);
        client.ok()
    }
}

impl RedisStore {
    /// Sends `batch`, requests of the master of `lane`, as one pipeline on
    /// that master's own connection, a call per slot, and gives each request
    /// its answer (see the module's docs).
    pub(super) async fn send_to_master(&self, cluster: &Cluster, lane: u16, mut batch: Vec<Item>) {
        let Some(connections) = cluster.masters().connections(lane) else {
            self.send_again(batch);
            return;
        };
        // Each slot's requests side by side, in their order of arrival (the
        // sort is stable), so that each call is a run of the batch: no list
        // of its own per slot.
        batch.sort_by_key(|item| item.slot);
        let now = self.fixed_now();
        // Each call's requests, and whether its reply comes as text.
        let mut calls: SmallVec<[(usize, bool); 32]> = SmallVec::new();
        let mut pipeline = redis::Pipeline::with_capacity(batch.len());
        for items in batch.chunk_by(|a, b| a.slot == b.slot) {
            let (call, text) = self.slot_call(items, now);
            calls.push((items.len(), text));
            pipeline.add_command(call);
        }
        let slot = connections.next_slot();
        let Some((id, mut link)) = connections.current(slot) else {
            // Not open (yet, or again after it failed): it opens in the
            // background, and the cluster client serves these meanwhile.
            connections.open_soon(slot);
            self.send_again(batch);
            return;
        };
        let deadline = self.inner.deadline();
        let sent = Deadline::now();
        let replies = tokio::time::timeout_at(
            deadline,
            link.req_packed_commands(&pipeline, 0, calls.len()),
        )
        .await;
        let values = match replies {
            Err(_) => {
                if self.inner.stalled(sent, deadline) {
                    connections.discard(slot, id, Gone::Stalled);
                }
                cluster.watch();
                let error = StoreError::Timeout(self.inner.call_timeout);
                answer_all(batch, &error);
                return;
            }
            Ok(Err(e)) => {
                if breaks_connection(&e) {
                    connections.discard(slot, id, Gone::of(&e));
                }
                if e.is_timeout() {
                    cluster.watch();
                    answer_all(batch, &StoreError::Timeout(self.inner.call_timeout));
                } else {
                    // It may have run: sent again, it counts twice at worst.
                    self.send_again(batch);
                }
                return;
            }
            Ok(Ok(values)) => values,
        };
        if values.len() != calls.len() {
            let error = StoreError::Backend(
                format!(
                    "a pipeline of {} calls answered {} replies",
                    calls.len(),
                    values.len()
                )
                .into(),
            );
            answer_all(batch, &error);
            return;
        }
        // Each request's answer, `None` for one whose call Redis did not
        // run (it goes again on its own), read before any is delivered.
        let mut outcomes: Vec<Option<Result<Decided, StoreError>>> =
            Vec::with_capacity(batch.len());
        let (mut start, mut missing) = (0, false);
        for (&(count, text), value) in calls.iter().zip(values) {
            let items = &batch[start..start + count];
            start += count;
            if let Value::ServerError(error) = value {
                missing |= names_no_function(&redis::RedisError::from(error));
                outcomes.extend(std::iter::repeat_with(|| None).take(count));
                continue;
            }
            let results = match (&value, items) {
                (Value::BulkString(bytes), [item]) if text => text_result(item, bytes),
                _ => batch_results(items, &value),
            };
            match results {
                Ok(results) => outcomes.extend(results.into_iter().map(Some)),
                Err(wrong) => {
                    // A reply that does not decode is a bug, never an outage.
                    let error = StoreError::Backend(
                        format!("undecodable reply to a call of a pipeline: {wrong}").into(),
                    );
                    outcomes
                        .extend(std::iter::repeat_with(|| Some(Err(share(&error)))).take(count));
                }
            }
        }
        let sent_on = SentOn::default();
        let mut again = Vec::new();
        for (item, outcome) in batch.into_iter().zip(outcomes) {
            match outcome {
                Some(result) => answer(item, result, &sent_on),
                None => again.push(item),
            }
        }
        if missing {
            // The library, loaded once for the pipeline before its requests
            // go again: each of them would load it.
            let _ = Box::pin(self.inner.load(Library::get(), self.inner.deadline())).await;
        }
        if !again.is_empty() {
            self.send_again(again);
        }
    }

    /// The call of one slot's `items`, and whether its reply comes as text:
    /// a request of one check as it would go alone (its algorithm's
    /// function, its reply one line of text, or script), any other as a
    /// batch. Every other reply reads as a batch's (`batch.lua`): four
    /// integers per check.
    fn slot_call(&self, items: &[Item], now: u64) -> (redis::Cmd, bool) {
        let functions = self.inner.uses_functions();
        let library = Library::get();
        if let [item] = items
            && let [(policy, cost, permit)] = item.requests.as_slice()
        {
            let algorithm = policy.algorithm();
            let (args, sent) = single_args(algorithm, *cost, *permit, now);
            let args: &[Arg<'_>] = &args[..sent];
            return if functions {
                let name = library.text(algorithm);
                (invocation("FCALL", name, &item.keys[..], args), true)
            } else {
                let (script, _) = self.inner.scripts.single(algorithm);
                let call = invocation("EVALSHA", script.get_hash(), &item.keys[..], args);
                (call, false)
            };
        }
        let args = batch_args(items, now);
        let keys = StateKeys(items.iter().flat_map(|item| item.keys.iter()));
        let call = if functions {
            invocation("FCALL", library.batch(), &keys, &args)
        } else {
            let (script, _) = self.inner.scripts.get(Named::Batch);
            invocation("EVALSHA", script.get_hash(), &keys, &args)
        };
        (call, false)
    }
}

/// The decision of `item`, a request of one check, from its call's text
/// reply (see `single.lua`), as [`batch_results`] gives it.
fn text_result(
    item: &Item,
    bytes: &[u8],
) -> Result<SmallVec<[Result<Decided, StoreError>; 1]>, String> {
    let [(policy, cost, permit)] = item.requests.as_slice() else {
        return Err(format!(
            "a text reply for a request of {} checks",
            item.requests.len()
        ));
    };
    let [allowed, remaining, reset, wait] = text_fields(bytes)?;
    let limit = parameters(policy.algorithm()).0;
    let decision = decision_of(allowed == 1, limit, remaining, reset, wait, *permit, *cost);
    Ok(smallvec::smallvec![Ok(smallvec::smallvec![decision])])
}

/// Answers every request of `batch` with `error`.
fn answer_all(batch: Vec<Item>, error: &StoreError) {
    let sent_on = SentOn::default();
    for item in batch {
        answer(item, Err(share(error)), &sent_on);
    }
}
