//! A Redis Cluster: redis-rs's cluster client, and a direct path beside it.
//!
//! redis-rs's cluster client does everything a cluster needs (it reads the
//! topology, follows `MOVED` and `ASK`, waits out `TRYAGAIN`, reconnects
//! after a failover), and every command passes through its routing task and
//! then through the node connection's own: measured with `bench --cluster`
//! at 64 in flight on 2 cores, about 10 µs of client CPU per decision,
//! against about 5 for the same call on a single node's connections.
//!
//! So a script call (`FCALL`, `EVALSHA`, `EVAL` on keys of one slot, which
//! is every decision, batch and release) goes straight to the master of its
//! slot, on connections of that master's own (the same [`Connections`] a
//! single node uses, each probed when it opens), by a slot map read with
//! `CLUSTER SLOTS`. Over plain TCP each is the store's own
//! [`Wire`](super::wire::Wire), which writes the calls queued on it in one
//! turn of the runtime together; over TLS a multiplexed connection, with an
//! [`Outbox`] that does the same. A slot always takes the same connection
//! of its master, so a release follows its check.
//! The store's `pool_size` is shared among the masters (`pool_size /
//! masters`, at least one each): fewer connections carry more commands per
//! write, and the nodes' CPU per decision falls with every command a read
//! brings (BENCHMARKS.md). The cluster client stays the authority:
//!
//! - a reply of `MOVED`, `ASK`, `TRYAGAIN` or `CLUSTERDOWN` means the node
//!   did not run the command; the map is read again (in the background, one
//!   read at a time) and this call goes through the cluster client, which
//!   follows the redirection as it always did;
//! - a refused or broken connection, or one that could not be opened
//!   (log-in, ACL probe), does the same, and the node is left to the
//!   cluster client for [`NODE_PAUSE`] (a stopped master fails as the
//!   cluster client fails it, not once per call on the direct path first).
//!   A connection that broke after the write may have run the call (and the
//!   others of its pipeline): sent again, it counts twice at worst, which
//!   errs towards denying, never towards admitting, as a single node's
//!   retry on a dead connection does;
//! - a call that times out is an outage, as on a single node: it may have
//!   run, so it is never sent again;
//! - every other command, and every slot the map does not know, goes
//!   through the cluster client.
//!
//! A node only runs commands for the slots it serves, so a stale map costs a
//! redirection, never a decision made on the wrong node.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionAddr, ConnectionInfo, RedisError, Value};
use tokio::time::Instant as Deadline;

use super::connections::{Connections, Kind, Link};
use super::outbox::Outbox;
use super::scripts::{AclProbe, Command};
use super::unclaimed::Via;
use super::{Inner, backend_error, breaks_connection, cluster_error};
use crate::{StoreError, key};

/// How long a node whose direct connection failed is left to the cluster
/// client before the direct path tries it again.
pub(super) const NODE_PAUSE: Duration = Duration::from_secs(1);

/// The number of hash slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// A slot no known master serves (in [`SlotMap::owners`]).
const NO_NODE: u16 = u16::MAX;

/// A store's way to a Redis Cluster.
pub(super) struct Cluster {
    /// redis-rs's cluster client: topology, redirections, retries.
    pub(super) client: ClusterConnection,
    direct: Arc<Direct>,
}

/// How the direct path connects to each master.
pub(super) struct DirectSettings<'a> {
    /// The URL whose settings (credentials, TLS, protocol) every master's
    /// connections use, with the master's own address.
    pub(super) url: &'a str,
    /// The time allowed to open one connection.
    pub(super) connect_timeout: Duration,
    /// The store's key prefix (for each master's ACL probe).
    pub(super) prefix: &'a str,
    /// Connections per master.
    pub(super) pool_size: u32,
    /// The CA to trust over TLS instead of the system's roots.
    #[cfg(feature = "tls")]
    pub(super) root_cert: Option<Vec<u8>>,
}

/// The direct path: the slot map and each master's connections.
struct Direct {
    /// The first URL's connection settings (credentials, TLS, protocol);
    /// each master's connections use them with its own address.
    base: ConnectionInfo,
    /// The CA its TLS connections trust (`None`: the system's roots).
    #[cfg(feature = "tls")]
    root_cert: Option<Vec<u8>>,
    /// The time allowed to open one of them.
    connect_timeout: Duration,
    prefix: String,
    pool_size: u32,
    map: RwLock<Arc<SlotMap>>,
    refreshing: AtomicBool,
    /// When this store was built: the origin of `DirectNode::paused_until`.
    origin: Instant,
}

#[derive(Default)]
struct SlotMap {
    /// The index in `nodes` of each slot's master ([`NO_NODE`]: unknown);
    /// empty before the first read.
    owners: Vec<u16>,
    nodes: Vec<Arc<DirectNode>>,
}

struct DirectNode {
    host: String,
    port: u16,
    connections: Connections,
    /// One per connection slot.
    outboxes: Box<[Arc<Outbox>]>,
    /// Milliseconds since [`Direct::origin`] before which the direct path
    /// leaves this node to the cluster client (0: not paused; a pause ends
    /// at least [`NODE_PAUSE`] after the origin, so never at 0).
    paused_until: AtomicU64,
}

/// What the direct path made of a call.
enum Attempt {
    /// The node answered (or the call timed out): this is the result.
    Done(Result<Value, StoreError>),
    /// The node did not run the command (a redirection, or no connection),
    /// or its connection broke (see the module's list): the cluster client
    /// is to send it.
    Elsewhere,
}

impl Cluster {
    /// The cluster client, with a direct path whose connections use the
    /// settings of `url` (the first of the store's URLs) and probe each
    /// master with a key under `prefix`. Reads the slot map now (a failed
    /// read leaves every call to the cluster client until a later one).
    pub(super) async fn new(
        client: ClusterConnection,
        settings: DirectSettings<'_>,
    ) -> Result<Self, StoreError> {
        let DirectSettings {
            url,
            connect_timeout,
            prefix,
            pool_size,
            #[cfg(feature = "tls")]
            root_cert,
        } = settings;
        let base = redis::IntoConnectionInfo::into_connection_info(url).map_err(backend_error)?;
        let direct = Arc::new(Direct {
            base,
            #[cfg(feature = "tls")]
            root_cert,
            connect_timeout,
            prefix: prefix.to_owned(),
            pool_size,
            map: RwLock::new(Arc::default()),
            refreshing: AtomicBool::new(true),
            origin: Instant::now(),
        });
        if let Ok(Ok(slots)) = tokio::time::timeout(connect_timeout, read_slots(&client)).await {
            direct.install(&slots);
        }
        direct.refreshing.store(false, Ordering::Release);
        Ok(Cluster { client, direct })
    }

    /// The place in the slot map of the master that serves `slot`, if the
    /// map places it and the direct path is not leaving that master to the
    /// cluster client: the requests of its slots may share a call (see
    /// `coalesce`).
    pub(super) fn master_of(&self, slot: u16) -> Option<u16> {
        let direct = &self.direct;
        let map = direct.map.read();
        let index = *map.owners.get(usize::from(slot))?;
        let node = map.nodes.get(usize::from(index))?;
        direct.serves(node).then_some(index)
    }
}

impl Inner {
    /// Runs `cmd` on the cluster before `deadline`: on the direct path when
    /// it is a script call the slot map can place, else (or when the direct
    /// path hands it back) through the cluster client.
    pub(super) async fn run_on_cluster(
        &self,
        cluster: &Cluster,
        cmd: &dyn Command,
        via: Via<'_>,
        deadline: Deadline,
    ) -> Result<Value, StoreError> {
        let direct = match via {
            Via::On(connection) => {
                Some(self.run_direct_on(cluster, connection, cmd, deadline).await)
            }
            Via::Pool | Via::Record(_) => match cluster.direct.node_for(cmd) {
                Some((node, slot)) => Some(
                    self.run_direct(cluster, &node, slot, cmd, via, deadline)
                        .await,
                ),
                None => None,
            },
        };
        if let Some(Attempt::Done(result)) = direct {
            return result;
        }
        let timeout = StoreError::Timeout(self.call_timeout);
        let routed = async {
            cmd.cmd()
                .query_async::<Value>(&mut cluster.client.clone())
                .await
                .map_err(|e| {
                    if e.is_timeout() {
                        StoreError::Timeout(self.call_timeout)
                    } else {
                        cluster_error(e)
                    }
                })
        };
        tokio::time::timeout_at(deadline, routed)
            .await
            .unwrap_or(Err(timeout))
    }

    /// One attempt on `node`'s own connections, on the one that hash slot
    /// `slot` takes.
    async fn run_direct(
        &self,
        cluster: &Cluster,
        node: &DirectNode,
        slot: u16,
        cmd: &dyn Command,
        via: Via<'_>,
        deadline: Deadline,
    ) -> Attempt {
        let timeout = || Attempt::Done(Err(StoreError::Timeout(self.call_timeout)));
        let connections = &node.connections;
        let index = usize::from(slot) % node.outboxes.len();
        // No timer when the connection is open (the common case).
        let opened = match connections.current(index) {
            Some(shared) => Ok(Ok(shared)),
            None => tokio::time::timeout_at(deadline, connections.get(index)).await,
        };
        let (id, connection) = match opened {
            Err(_) => return timeout(),
            Ok(Ok(shared)) => shared,
            // Whatever failed (connecting, logging in, the ACL probe), the
            // node is left to the cluster client for a while, not reopened
            // by every call.
            Ok(Err(_)) => return cluster.direct.failed(node, &cluster.client, true),
        };
        if let Via::Record(sent_on) = via {
            sent_on.record(&connection);
        }
        let sent_at = Deadline::now();
        // `connection` is kept until the reply comes: the last handle on a
        // wire closes it, failing the calls it carries (the slot may drop
        // its handle meanwhile, see `discard`).
        let reply = match &connection {
            Link::Wire(wire) => wire.send(cmd, Some(deadline)),
            connection => {
                match node.outboxes[index].send(
                    cmd.cmd().into_owned(),
                    Some(id),
                    connection.clone(),
                    deadline,
                ) {
                    Ok(reply) => reply,
                    Err(_) => return Attempt::Done(Err(no_runtime())),
                }
            }
        };
        match sent(
            tokio::time::timeout_at(deadline, reply)
                .await
                .ok()
                .and_then(Result::ok),
        ) {
            Sent::Answered(result) => Attempt::Done(result),
            // It may have run: never sent again (see `run_on_node`).
            Sent::TimedOut => {
                if self.stalled(sent_at, deadline) {
                    connections.discard(index, id);
                }
                timeout()
            }
            Sent::NotRun(e) => {
                let broke = breaks_connection(&e);
                if broke {
                    connections.discard(index, id);
                }
                cluster.direct.failed(node, &cluster.client, broke)
            }
        }
    }

    /// One attempt on `connection`, a master's direct connection that an
    /// earlier call was sent on (see `unclaimed`): queued on the outbox of
    /// its slot, behind that earlier call, while the map still places the
    /// slot on a master; else sent at once.
    async fn run_direct_on(
        &self,
        cluster: &Cluster,
        connection: &Link,
        cmd: &dyn Command,
        deadline: Deadline,
    ) -> Attempt {
        let outcome = match (cluster.direct.node_for(cmd), connection) {
            // A wire writes in the order calls are queued on it.
            (_, Link::Wire(wire)) => {
                tokio::time::timeout_at(deadline, wire.send(cmd, Some(deadline)))
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
            (Some((node, slot)), _) => {
                let outbox = &node.outboxes[usize::from(slot) % node.outboxes.len()];
                let Ok(reply) =
                    outbox.send(cmd.cmd().into_owned(), None, connection.clone(), deadline)
                else {
                    return Attempt::Done(Err(no_runtime()));
                };
                tokio::time::timeout_at(deadline, reply)
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
            (None, _) => {
                let mut connection = connection.clone();
                let cmd = cmd.cmd();
                tokio::time::timeout_at(deadline, cmd.query_async(&mut connection))
                    .await
                    .ok()
            }
        };
        match sent(outcome) {
            Sent::Answered(result) => Attempt::Done(result),
            Sent::TimedOut => Attempt::Done(Err(StoreError::Timeout(self.call_timeout))),
            Sent::NotRun(_) => {
                cluster.direct.refresh(&cluster.client);
                Attempt::Elsewhere
            }
        }
    }
}

/// What became of a call sent to a master directly.
enum Sent {
    /// The node answered: its result (an error reply included).
    Answered(Result<Value, StoreError>),
    /// No answer in time: the call may have run.
    TimedOut,
    /// The node did not run it (a redirection or a cluster-state reply, a
    /// refused connection), or its connection broke, maybe after it ran.
    NotRun(RedisError),
}

/// A call made outside a tokio runtime: a mistake, not an outage.
fn no_runtime() -> StoreError {
    StoreError::Backend("RedisStore needs a tokio runtime".into())
}

/// Sorts the outcome of a direct call sent within a deadline (`None`: no
/// reply in time, or its flush gave up).
fn sent(outcome: Option<Result<Value, RedisError>>) -> Sent {
    match outcome {
        None => Sent::TimedOut,
        Some(Err(e)) if e.is_timeout() => Sent::TimedOut,
        Some(Err(e)) if not_run(&e) || breaks_connection(&e) => Sent::NotRun(e),
        Some(result) => Sent::Answered(result.map_err(backend_error)),
    }
}

impl Direct {
    /// The master a script call goes to directly, and the call's hash slot,
    /// if the map places that slot and the master is not paused.
    fn node_for(&self, cmd: &dyn Command) -> Option<(Arc<DirectNode>, u16)> {
        let slot = cmd.slot()?;
        let map = self.map.read();
        let node = map
            .nodes
            .get(usize::from(*map.owners.get(usize::from(slot))?))?;
        self.serves(node).then(|| (node.clone(), slot))
    }

    /// Whether the direct path sends to `node`: it is not paused. A node
    /// never paused, or whose pause has ended, holds 0, which is read
    /// without reading the clock (once per call otherwise).
    fn serves(&self, node: &DirectNode) -> bool {
        let until = node.paused_until.load(Ordering::Relaxed);
        if until == 0 {
            return true;
        }
        if until > self.millis() {
            return false;
        }
        // Over: 0 again, unless a new pause began meanwhile.
        let _ = node
            .paused_until
            .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed);
        true
    }

    fn millis(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// `node` did not run a command: the map is read again, the node
    /// is paused when `pause` says so (it could not be reached, or a
    /// connection to it could not be opened), and the call goes elsewhere.
    fn failed(
        self: &Arc<Self>,
        node: &DirectNode,
        client: &ClusterConnection,
        pause: bool,
    ) -> Attempt {
        if pause {
            let until = self
                .millis()
                .saturating_add(u64::try_from(NODE_PAUSE.as_millis()).unwrap_or(u64::MAX));
            node.paused_until.store(until, Ordering::Relaxed);
        }
        self.refresh(client);
        Attempt::Elsewhere
    }

    /// Reads the slot map again in the background, unless a read is under way.
    fn refresh(self: &Arc<Self>, client: &ClusterConnection) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let reading = Reading(self.clone());
        let client = client.clone();
        tokio::spawn(async move {
            let read = tokio::time::timeout(Duration::from_secs(5), read_slots(&client)).await;
            if let Ok(Ok(slots)) = read {
                reading.0.install(&slots);
            }
        });
    }

    /// Installs the map `CLUSTER SLOTS` answered, keeping the connections of
    /// the masters it already knew.
    fn install(&self, slots: &Value) {
        let Some(ranges) = parse_slots(slots) else {
            return;
        };
        let old = self.map.read().clone();
        let mut owners = vec![NO_NODE; SLOTS];
        let mut nodes: Vec<Arc<DirectNode>> = Vec::new();
        let mut index: HashMap<(&str, u16), u16> = HashMap::new();
        let mut masters: Vec<(&str, u16)> =
            ranges.iter().map(|r| (r.host.as_str(), r.port)).collect();
        masters.sort_unstable();
        masters.dedup();
        let per_master =
            (self.pool_size / u32::try_from(masters.len()).unwrap_or(u32::MAX).max(1)).max(1);
        for range in &ranges {
            let position = match index.get(&(range.host.as_str(), range.port)) {
                Some(&position) => position,
                None => {
                    let Ok(position) = u16::try_from(nodes.len()) else {
                        continue;
                    };
                    let known = old
                        .nodes
                        .iter()
                        .find(|n| n.host == range.host && n.port == range.port);
                    let node = match known {
                        Some(node) => node.clone(),
                        None => match self.node(&range.host, range.port, &ranges, per_master) {
                            Some(node) => Arc::new(node),
                            None => continue,
                        },
                    };
                    nodes.push(node);
                    index.insert((range.host.as_str(), range.port), position);
                    position
                }
            };
            for slot in range.start..=range.end {
                owners[usize::from(slot)] = position;
            }
        }
        *self.map.write() = Arc::new(SlotMap { owners, nodes });
    }

    /// A master's `connections` direct connections, probed with a key of one of its own
    /// slots (`None`: it serves none, or the address cannot be used).
    fn node(
        &self,
        host: &str,
        port: u16,
        ranges: &[SlotRange],
        connections: u32,
    ) -> Option<DirectNode> {
        let addr = match self.base.addr() {
            ConnectionAddr::Tcp(..) => ConnectionAddr::Tcp(host.to_owned(), port),
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => return None,
        };
        let serves = |slot: u16| {
            ranges
                .iter()
                .any(|r| r.host == host && r.port == port && (r.start..=r.end).contains(&slot))
        };
        let probe_key = (0..100_000u32)
            .map(|n| format!("{}:acl-probe:{{{n}}}", self.prefix))
            .find(|k| serves(key::cluster_slot(k.as_bytes())))?;
        let info = self.base.clone().set_addr(addr);
        #[cfg(feature = "tls")]
        let client = super::builder::client_trusting(info, self.root_cert.clone()).ok()?;
        #[cfg(not(feature = "tls"))]
        let client = redis::Client::open(info).ok()?;
        let connections = Connections::new(
            client,
            self.connect_timeout,
            connections,
            AclProbe::on_key(probe_key),
            Kind::Wire,
        );
        Some(DirectNode {
            host: host.to_owned(),
            port,
            outboxes: (0..connections.size())
                .map(|_| Arc::new(Outbox::default()))
                .collect(),
            connections,
            paused_until: AtomicU64::new(0),
        })
    }
}

/// Whether `e` says the node did not run the command because it does not
/// serve its slot as a master now (`MOVED`, `ASK`, `TRYAGAIN`,
/// `CLUSTERDOWN`, `READONLY`, `MASTERDOWN`).
fn not_run(e: &RedisError) -> bool {
    e.is_cluster_error()
        || matches!(
            e.kind(),
            redis::ErrorKind::Server(
                redis::ServerErrorKind::ReadOnly | redis::ServerErrorKind::MasterDown
            )
        )
}

/// A read of the slot map under way: when it ends, or its task is dropped
/// with its runtime, the next redirection may start another.
struct Reading(Arc<Direct>);

impl Drop for Reading {
    fn drop(&mut self) {
        self.0.refreshing.store(false, Ordering::Release);
    }
}

async fn read_slots(client: &ClusterConnection) -> Result<Value, RedisError> {
    redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut client.clone())
        .await
}

/// One range of `CLUSTER SLOTS`: its slots and its master's address.
#[derive(Debug, PartialEq, Eq)]
struct SlotRange {
    start: u16,
    end: u16,
    host: String,
    port: u16,
}

/// The ranges of a `CLUSTER SLOTS` reply whose master has a usable address
/// (`None`: not such a reply). A master announced without an address (an
/// empty or `?` endpoint) is left out: its slots stay with the cluster
/// client.
fn parse_slots(reply: &Value) -> Option<Vec<SlotRange>> {
    let Value::Array(entries) = reply else {
        return None;
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(fields) = entry else {
            return None;
        };
        let slot = |v: Option<&Value>| match v {
            Some(Value::Int(n)) => u16::try_from(*n).ok().filter(|&s| usize::from(s) < SLOTS),
            _ => None,
        };
        let (start, end) = (slot(fields.first())?, slot(fields.get(1))?);
        let Some(Value::Array(master)) = fields.get(2) else {
            return None;
        };
        let host = match master.first() {
            Some(Value::BulkString(bytes)) => String::from_utf8(bytes.clone()).ok()?,
            Some(Value::SimpleString(text)) => text.clone(),
            _ => return None,
        };
        let port = match master.get(1) {
            Some(Value::Int(port)) => u16::try_from(*port).ok()?,
            _ => return None,
        };
        if host.is_empty() || host == "?" || start > end {
            continue;
        }
        ranges.push(SlotRange {
            start,
            end,
            host,
            port,
        });
    }
    Some(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(text: &str) -> Value {
        redis::parse_redis_value(text.as_bytes()).expect("a RESP reply")
    }

    #[test]
    fn cluster_slots_gives_each_range_its_master() {
        // Two ranges, the second with a replica; a third whose master has no
        // known endpoint.
        let value = reply(concat!(
            "*3\r\n",
            "*3\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n",
            "*4\r\n:5461\r\n:10922\r\n*3\r\n$9\r\n127.0.0.1\r\n:7001\r\n$2\r\nid\r\n",
            "*3\r\n$9\r\n127.0.0.1\r\n:7004\r\n$2\r\nid\r\n",
            "*3\r\n:10923\r\n:16383\r\n*3\r\n$1\r\n?\r\n:7002\r\n$2\r\nid\r\n",
        ));
        let ranges = parse_slots(&value).unwrap();
        assert_eq!(
            ranges,
            [
                SlotRange {
                    start: 0,
                    end: 5460,
                    host: "127.0.0.1".into(),
                    port: 7000
                },
                SlotRange {
                    start: 5461,
                    end: 10922,
                    host: "127.0.0.1".into(),
                    port: 7001
                },
            ]
        );
    }

    #[test]
    fn a_reply_that_is_not_a_slot_map_is_refused() {
        for text in [
            "+OK\r\n",
            "*1\r\n:5\r\n",
            "*1\r\n*3\r\n:0\r\n:99999\r\n*2\r\n$1\r\na\r\n:1\r\n",
            "*1\r\n*3\r\n:0\r\n:10\r\n*2\r\n$1\r\na\r\n:70000\r\n",
        ] {
            assert!(parse_slots(&reply(text)).is_none(), "{text:?}");
        }
    }

    #[test]
    fn only_script_calls_with_keys_are_placed() {
        let mut fcall = redis::cmd("FCALL");
        fcall.arg("rl_gcra").arg(1).arg("p:api:{alice}").arg(5);
        assert_eq!(Command::slot(&fcall), Some(key::cluster_slot(b"alice")));
        let mut evalsha = redis::cmd("evalsha");
        evalsha.arg("abc").arg(2).arg("p:a:{bob}").arg("p:b:{bob}");
        assert_eq!(Command::slot(&evalsha), Some(key::cluster_slot(b"bob")));
        let mut no_keys = redis::cmd("FCALL");
        no_keys.arg("f").arg(0);
        assert_eq!(Command::slot(&no_keys), None);
        let mut get = redis::cmd("GET");
        get.arg("p:api:{alice}");
        assert_eq!(Command::slot(&get), None);
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg("code");
        assert_eq!(Command::slot(&load), None);
    }
}
