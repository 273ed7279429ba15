//! `MultiRegionStore` against a peer's own persistence and hostile keys, on
//! real `redis-server`s through the helpers of `multi_region.rs`.
//!
//! - A peer's Redis that comes back from a snapshot older than its last
//!   deliveries (an RDB save here; AOF `everysec` or a promoted replica lose
//!   the last writes the same way) keeps its generation (`born`) but not all
//!   that landed in it: the sender's next round must not be marked on it,
//!   and the whole outbox goes again before the peer counts the sender as
//!   heard.
//! - Keys that look like fields (`eu:0:3600000000`, `us@1:2:3`) or like the
//!   outbox's own names are delivered and counted once, with a TTL on every
//!   key.

use std::time::{Duration, Instant};

use super::multi_region::{Regions, SYNC, admitted_once_each, fixed, with_budget_left};

/// `us` (region 1) admits 3 of a limit of 10 on one key and `eu` (region 0)
/// hears it; `eu`'s Redis is snapshotted (`SAVE`); `us` admits 5 more and
/// `eu` hears them too (2 left there). `eu`'s Redis is then killed and comes
/// back from its snapshot. Once `eu` has heard `us` again since the
/// restart (so `us`'s counts are claimed to have landed), `eu` must admit at
/// most the 2 left: requests spaced further than `D` admit `limit` exactly.
/// (Before the marks recorded how far the outbox was delivered, it admitted
/// 7, the fleet 15 of 10: the 5 merged after the snapshot were never sent
/// again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_restored_from_a_snapshot_is_not_counted_fresh_without_what_it_lost() {
    let mut regions = Regions::start_fresh(SYNC, Duration::from_secs(2)).await;
    let policy = fixed(10);
    let key = "restored".to_owned();
    let keys = [key.clone()];
    let hash = regions.stores[0].state_key(key.as_bytes(), &policy);
    let mut us_admitted = 0;
    for _ in 0..3 {
        us_admitted += admitted_once_each(&regions.stores[1], &policy, &keys).await;
    }
    assert_eq!(us_admitted, 3);
    let done = Instant::now();
    regions.wait_heard_since(0, 1, done).await;
    assert_eq!(regions.servers[0].cli(&["SAVE"]), "OK");
    for _ in 0..5 {
        us_admitted += admitted_once_each(&regions.stores[1], &policy, &keys).await;
    }
    assert_eq!(us_admitted, 8);
    let done = Instant::now();
    regions.wait_heard_since(0, 1, done).await;
    let before = regions.fields(0, &hash);
    // Killed (nothing saved on the way down), back from the snapshot.
    regions.servers[0].restart();
    let restarted = Instant::now();
    regions.wait_heard_since(0, 1, restarted).await;
    let after = regions.fields(0, &hash);
    let mut eu_admitted = 0;
    for _ in 0..20 {
        eu_admitted += admitted_once_each(&regions.stores[0], &policy, &keys).await;
    }
    let left = with_budget_left(&regions.stores[0], &policy, &keys).await;
    assert!(
        us_admitted + eu_admitted <= 10,
        "eu heard us again after its Redis came back from a snapshot, then admitted \
         {eu_admitted} more where {} were left: the fleet admitted {} of a limit of 10 \
         (left {left}); eu's fields before the restart {before:?}, after {after:?}",
        10 - us_admitted,
        us_admitted + eu_admitted
    );
}

/// Keys made of the characters the protocol uses inside (`:`, `@`, digits
/// in the shape of a field, the outbox's and heard hashes' names): each of
/// them admitted once in `us` (limit 1) leaves no budget in `eu` once `eu`
/// heard `us`, and every key written has a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_the_protocols_delimiters_reach_the_peers() {
    let regions = Regions::start_fresh(SYNC, Duration::from_secs(2)).await;
    let policy = fixed(1);
    let keys: Vec<String> = [
        "eu:0:3600000000",
        "us:1800000000000000:3600000000",
        "us@1:2:3",
        "eu@1800000000000000:0:1",
        "ap:1",
        ":",
        "::",
        "0:0:",
        "mr:out:seq",
        "mr:heard:us",
        "mr:{x}",
        "}:mr",
        "#0123456789abcdef0123456789abcdef",
        "a\u{0}b",
        "é:1:2",
    ]
    .iter()
    .map(|k| (*k).to_owned())
    .collect();
    assert_eq!(
        admitted_once_each(&regions.stores[1], &policy, &keys).await,
        keys.len()
    );
    let done = Instant::now();
    regions.assert_eu_heard_all(&policy, &keys, done).await;
    // Once more in us: nothing passes twice.
    assert_eq!(
        admitted_once_each(&regions.stores[1], &policy, &keys).await,
        0
    );
    regions.assert_every_key_has_a_ttl();
}
