//! Stores several modules of this binary build alike, and slots moved by
//! hand between a cluster's masters.

use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::RedisStore;
use ratelimit_tests::{CALL_TIMEOUT, RedisCluster, build, cluster_slot};

/// A store on `cluster` whose scripts take their time from `clock`, calls
/// timing out after [`CALL_TIMEOUT`] (as `redis_store_on_clock` on one
/// node).
pub(crate) async fn cluster_store_on_clock(
    cluster: &RedisCluster,
    clock: &ManualClock,
) -> RedisStore {
    build(
        RedisStore::cluster_builder(cluster.urls())
            .script_clock_for_tests(clock.clone())
            .call_timeout(CALL_TIMEOUT),
    )
    .await
}

/// A store on `cluster` whose calls time out after `call_timeout`.
pub(crate) async fn store_timing_out_after(
    cluster: &RedisCluster,
    call_timeout: std::time::Duration,
) -> RedisStore {
    build(RedisStore::cluster_builder(cluster.urls()).call_timeout(call_timeout)).await
}

/// A cluster, and a store on it whose calls time out after 2 s: time for
/// the redirections of slots on the move.
pub(crate) async fn started_cluster() -> (RedisCluster, RedisStore) {
    let cluster = RedisCluster::start();
    let store = store_timing_out_after(&cluster, std::time::Duration::from_secs(2)).await;
    (cluster, store)
}

/// A slot moved by hand from its master (`source`) to the next one
/// (`target`): `CLUSTER SETSLOT ... IMPORTING` and `MIGRATING`, a `MIGRATE`
/// of one key at a time, then `SETSLOT ... NODE` on every master.
pub(crate) struct SlotMove<'a> {
    cluster: &'a RedisCluster,
    pub(crate) slot: u16,
    pub(crate) source: usize,
    pub(crate) target: usize,
    /// Every node's id (`CLUSTER MYID`).
    ids: Vec<String>,
}

impl<'a> SlotMove<'a> {
    /// The move of `slot` to the master after its own; nothing sent yet.
    pub(crate) fn of(cluster: &'a RedisCluster, slot: u16) -> SlotMove<'a> {
        let source = cluster.master_of(slot);
        let ids = (0..3)
            .map(|i| cluster.cli(i, &["CLUSTER", "MYID"]))
            .collect();
        SlotMove {
            cluster,
            slot,
            source,
            target: (source + 1) % 3,
            ids,
        }
    }

    fn setslot(&self, node: usize, state: &str, other: usize) {
        let slot = self.slot.to_string();
        let reply = self.cluster.cli(
            node,
            &["CLUSTER", "SETSLOT", &slot, state, &self.ids[other]],
        );
        assert_eq!(reply, "OK", "SETSLOT {} {state} on node {node}", self.slot);
    }

    /// The slot half moved: importing on the target, migrating on the
    /// source.
    pub(crate) fn begin(&self) {
        self.setslot(self.target, "IMPORTING", self.source);
        self.setslot(self.source, "MIGRATING", self.target);
    }

    /// `MIGRATE`s the key `state` to the target; returns the reply.
    pub(crate) fn migrate_reply(&self, state: &str) -> String {
        let port = self.cluster.nodes()[self.target].port().to_string();
        self.cluster.cli(
            self.source,
            &["MIGRATE", "127.0.0.1", &port, state, "0", "5000"],
        )
    }

    /// `MIGRATE`s the key `state` to the target, which must take it.
    pub(crate) fn migrate(&self, state: &str) {
        let reply = self.migrate_reply(state);
        assert_eq!(reply, "OK", "MIGRATE {state}");
    }

    /// `MIGRATE`s the key `state` to the target, if the source holds it.
    pub(crate) fn migrate_if_any(&self, state: &str) {
        let reply = self.migrate_reply(state);
        assert!(
            reply == "OK" || reply == "NOKEY",
            "MIGRATE {state}: {reply}"
        );
    }

    /// An empty slot given to the target at once: [`begin`](Self::begin),
    /// then [`finish`](Self::finish). `SETSLOT ... NODE` alone is not a
    /// move Redis keeps: the target claims the slot under its own config
    /// epoch, which may be below the source's, and a claim the source
    /// gossiped before it gave the slot away then hands the slot back to the
    /// source on the target. Source and target redirect to each other for
    /// good, every node up and the slot served by none. A target that was
    /// importing the slot raises its epoch above every other as it takes it.
    pub(crate) fn give_empty(&self) {
        self.begin();
        self.finish();
    }

    /// The slot given to the target on every master.
    pub(crate) fn finish(&self) {
        let (source, target) = (self.source, self.target);
        for node in [target, source, 3 - target - source] {
            self.setslot(node, "NODE", target);
        }
    }
}

/// `n` user keys whose state keys under `policy` hash to `slot`.
pub(crate) fn keys_in_slot(
    store: &RedisStore,
    policy: &ratelimit_core::Policy,
    slot: u16,
    n: usize,
) -> Vec<String> {
    let keys: Vec<String> = (0..5_000_000)
        .map(|i| format!("k{i}"))
        .filter(|k| cluster_slot(store.state_key(k.as_bytes(), policy).as_bytes()) == slot)
        .take(n)
        .collect();
    assert_eq!(keys.len(), n, "keys of slot {slot}");
    keys
}
