//! `MultiRegionStore` against a peer's own persistence and hostile keys, on
//! real `redis-server`s through the helpers of `multi_region.rs`.
//!
//! - A peer's Redis that comes back from a snapshot older than its last
//!   deliveries (an RDB save here; AOF `everysec` or a promoted replica lose
//!   the last writes the same way) keeps its generation (`born`) but not all
//!   that landed in it: the sender's next round must not be marked on it,
//!   and the whole outbox goes again before the peer counts the sender as
//!   heard.
//! - A sender's Redis back from a snapshot (its outbox's epoch and
//!   sequence numbers would stand for other, lower counts) starts a new
//!   epoch, so its peers count what it sends afresh; so does one that lost
//!   everything, while its peers keep a higher sequence number of the old
//!   epoch.
//! - A sender's outbox snapshotted before any round recorded its Redis's
//!   run id starts a new epoch too once restored; a sender restarted from
//!   one snapshot again and again stays heard and bounded.
//! - A region's Redis whose data a full resync replaced (demoted, resynced
//!   from a promoted replica that was behind, promoted back: the same
//!   process and run id) starts a new epoch too: the replication id is part
//!   of what the outbox records. Both sides back from snapshots at once
//!   hear each other again within the data-loss slack.
//! - Heard hashes without `seq` (an older version's) or gone, and several
//!   instances racing rounds on the shared cursor.
//! - Keys that look like fields (`eu:0:3600000000`, `us@1:2:3`) or like the
//!   outbox's own names are delivered and counted once, with a TTL on every
//!   key.

use std::time::{Duration, Instant};

use ratelimit_tests::RedisServer;

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

const EU: usize = 0;
const US: usize = 1;
const AP: usize = 2;

const META: &str = "ratelimit:mr:out:meta";

/// Waits until `us` has heard both its peers since `since` (its Redis came
/// back or lost everything then).
async fn us_hears_its_peers_since(regions: &Regions, since: Instant) {
    regions.wait_heard_since(US, EU, since).await;
    regions.wait_heard_since(US, AP, since).await;
}

/// Once `us` heard its peers since `since`, admits `key` there `n` times
/// and waits until `eu` heard `us`: returns `n`.
async fn us_admits_after(regions: &Regions, since: Instant, key: &str, n: usize) -> usize {
    us_hears_its_peers_since(regions, since).await;
    assert_eq!(admit_n(regions, US, key, n).await, n);
    regions.wait_heard_since(EU, US, Instant::now()).await;
    n
}

/// Admits `key` in region `i` up to `tries` times, one at a time.
async fn admit_n(regions: &Regions, i: usize, key: &str, tries: usize) -> usize {
    let keys = [key.to_owned()];
    let mut admitted = 0;
    for _ in 0..tries {
        admitted += admitted_once_each(&regions.stores[i], &fixed(10), &keys).await;
    }
    admitted
}

/// The sender's Redis (`us`) comes back from a snapshot (the same outbox
/// epoch, lower counts and sequence numbers) while its peer `eu` kept
/// everything. `us` admits 3 on one key, is snapshotted, admits 4 more
/// (7, heard by `eu`), comes back from the snapshot (3) and admits 3 more:
/// 10 in all, the limit, every one of them pushed to `eu` afterwards.
/// Once `eu` heard `us` again, `eu` must admit nothing: `us`'s Redis runs
/// anew, so its outbox starts a new epoch and `eu` counts what it sends
/// afresh. (Before, `eu`'s `seen` field of `us`'s epoch said 7, so `us`'s
/// new cumulative 6 added nothing there, and `eu` admitted 3 more: 13 of
/// 10, the extra passing in the region that lost nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_back_from_a_snapshot_is_still_counted_by_its_peers() {
    let mut regions = Regions::start_fresh(SYNC, Duration::from_secs(2)).await;
    let key = "sender-restored";
    let mut us_admitted = admit_n(&regions, US, key, 3).await;
    assert_eq!(us_admitted, 3);
    regions.wait_heard_since(EU, US, Instant::now()).await;
    assert_eq!(regions.servers[US].cli(&["SAVE"]), "OK");
    us_admitted += admit_n(&regions, US, key, 4).await;
    assert_eq!(us_admitted, 7);
    regions.wait_heard_since(EU, US, Instant::now()).await;
    regions.servers[US].restart();
    let restarted = Instant::now();
    us_hears_its_peers_since(&regions, restarted).await;
    us_admitted += admit_n(&regions, US, key, 3).await;
    assert_eq!(
        us_admitted, 10,
        "us forgot 4 and admits 3 of the 4 it sees left"
    );
    regions.wait_heard_since(EU, US, Instant::now()).await;
    let hash = regions.stores[EU].state_key(key.as_bytes(), &fixed(10));
    let fields = regions.fields(EU, &hash);
    let eu_admitted = admit_n(&regions, EU, key, 20).await;
    assert_eq!(
        eu_admitted,
        0,
        "us admitted {us_admitted} of a limit of 10, every one after the snapshot pushed to \
         eu and heard there; eu then admitted {eu_admitted} more: the fleet {} of 10 \
         (eu's fields {fields:?})",
        us_admitted + eu_admitted
    );
}

/// Both Redis restored, at different times: `us` (the sender) from a
/// snapshot taken at sequence `s1`, `eu` from one taken after `us` had
/// delivered up to `s1 + 10` (old keys). Back from its snapshot, `us`
/// reuses the numbers `s1 + 1 ..`: it admits 6 on a new key (sequence
/// `<= s1 + 6`), which lands in `eu`; then `eu` comes back from its
/// snapshot, which lacks them. `eu` must not count `us` as heard without
/// them. (Before `us`'s restart started a new epoch, `eu`'s heard hash
/// said `seq = s1 + 10` in the same epoch and generation, beyond `us`'s
/// cursor: the mark took the round, and `eu` admitted the whole limit
/// again, 16 of 10.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_numbers_reused_after_a_senders_snapshot_do_not_pass_for_delivered() {
    let mut regions = Regions::start_fresh(SYNC, Duration::from_secs(2)).await;
    let policy = fixed(10);
    for i in 0..3 {
        assert_eq!(admit_n(&regions, US, &format!("first-{i}"), 1).await, 1);
    }
    regions.wait_heard_since(EU, US, Instant::now()).await;
    assert_eq!(regions.servers[US].cli(&["SAVE"]), "OK");
    let old: Vec<String> = (0..10).map(|i| format!("old-{i}")).collect();
    assert_eq!(
        admitted_once_each(&regions.stores[US], &policy, &old).await,
        10
    );
    regions.wait_heard_since(EU, US, Instant::now()).await;
    assert_eq!(regions.servers[EU].cli(&["SAVE"]), "OK");
    let heard_at_eu_save = regions.servers[EU].cli(&["HGETALL", "ratelimit:mr:heard:us"]);
    regions.servers[US].restart();
    let restarted = Instant::now();
    let key = "after-both";
    let us_admitted = us_admits_after(&regions, restarted, key, 6).await;
    let meta = regions.servers[US].cli(&["HGETALL", "ratelimit:mr:out:meta"]);
    // eu had the 6: 4 left there.
    assert_eq!(
        with_budget_left(&regions.stores[EU], &policy, &[key.to_owned()]).await,
        1
    );
    regions.servers[EU].restart();
    let restarted = Instant::now();
    regions.wait_heard_since(EU, US, restarted).await;
    regions.wait_heard_since(EU, US, Instant::now()).await;
    let heard = regions.servers[EU].cli(&["HGETALL", "ratelimit:mr:heard:us"]);
    let eu_admitted = admit_n(&regions, EU, key, 20).await;
    assert!(
        us_admitted + eu_admitted <= 10,
        "eu heard us again after its Redis came back from a snapshot that lacked us's 6 on \
         {key:?}, then admitted {eu_admitted}: the fleet {} of 10. eu's heard hash at its \
         snapshot {heard_at_eu_save:?}, after {heard:?}; us's outbox meta {meta:?}",
        us_admitted + eu_admitted
    );
}

/// The sender's Redis loses everything (`FLUSHALL`): a new epoch, sequence
/// numbers from 1 again, while `eu`'s heard hash keeps a high `seq` of the
/// old epoch. What `us` admits afterwards reaches `eu` before `eu` counts
/// it as heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_epoch_below_the_old_seq_is_delivered() {
    let regions = Regions::start_fresh(SYNC, Duration::from_secs(2)).await;
    let policy = fixed(10);
    let old: Vec<String> = (0..50).map(|i| format!("old-{i}")).collect();
    assert_eq!(
        admitted_once_each(&regions.stores[US], &policy, &old).await,
        50
    );
    regions.wait_heard_since(EU, US, Instant::now()).await;
    assert_eq!(regions.servers[US].cli(&["FLUSHALL"]), "OK");
    let flushed = Instant::now();
    let key = "new-epoch";
    let us_admitted = us_admits_after(&regions, flushed, key, 6).await;
    let eu_admitted = admit_n(&regions, EU, key, 20).await;
    assert_eq!(us_admitted + eu_admitted, 10);
    regions.assert_every_key_has_a_ttl();
}

/// `eu`'s heard hash of `us` as an older version wrote it (no `epoch`, no
/// `seq`), then gone altogether (expired while `us`'s cursor stayed): each
/// time `us`'s next round is refused and the whole outbox goes again, `eu`
/// hears `us` again, and nothing counts twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heard_hashes_without_seq_or_gone_are_pushed_everything_again() {
    let regions = Regions::start_fresh(SYNC, Duration::from_secs(2)).await;
    let key = "mixed";
    assert_eq!(admit_n(&regions, US, key, 3).await, 3);
    regions.wait_heard_since(EU, US, Instant::now()).await;
    let heard = "ratelimit:mr:heard:us";
    assert_eq!(
        regions.servers[EU].cli(&["HDEL", heard, "epoch", "seq"]),
        "2"
    );
    assert_eq!(admit_n(&regions, US, key, 2).await, 2);
    regions.wait_heard_since(EU, US, Instant::now()).await;
    let fields = regions.servers[EU].cli(&["HMGET", heard, "epoch", "seq"]);
    assert!(!fields.lines().any(str::is_empty), "{fields:?}");
    assert_eq!(regions.servers[EU].cli(&["DEL", heard]), "1");
    assert_eq!(admit_n(&regions, US, key, 1).await, 1);
    regions.wait_heard_since(EU, US, Instant::now()).await;
    // 6 admitted in us, counted once in eu.
    assert_eq!(admit_n(&regions, EU, key, 20).await, 4);
    regions.assert_every_key_has_a_ttl();
}

/// Three instances of `us` racing rounds on the one cursor while all of
/// them admit: `eu` keeps hearing `us` (no instance's round refuses the
/// others' for good) and, each time, has every count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_racing_on_the_cursor_keep_the_peer_heard() {
    let regions = Regions::start_fresh(SYNC, Duration::from_secs(2)).await;
    let policy = fixed(1);
    let (second, _p2) = regions.instance(US, None, Duration::from_secs(2)).await;
    let (third, _p3) = regions.instance(US, None, Duration::from_secs(2)).await;
    let instances = [&regions.stores[US], &second, &third];
    for round in 0..5 {
        let mut all = Vec::new();
        for (n, store) in instances.iter().enumerate() {
            let keys: Vec<String> = (0..40).map(|k| format!("race-{round}-{n}-{k}")).collect();
            assert_eq!(admitted_once_each(store, &policy, &keys).await, 40);
            all.extend(keys);
        }
        let since = Instant::now();
        let took = regions.wait_heard_since(EU, US, since).await;
        assert!(
            took < Duration::from_secs(5),
            "round {round}: heard after {took:?}"
        );
        assert_eq!(
            with_budget_left(&regions.stores[EU], &policy, &all).await,
            0
        );
    }
}

/// `us`'s Redis refuses `INFO` for a while (an ACL without it, a transient
/// failure: rounds fail before reading the outbox), during which `us`
/// admits 3 on a key: the outbox is created by `decide.lua` with an epoch
/// but no `run`, and that is what a snapshot (`SAVE`) holds. `INFO` comes
/// back; `eu` hears the 3, then 4 more (7). `us`'s Redis then comes back
/// from the snapshot (3, the same epoch, no `run`) and admits 3 more: 10
/// in all, every one pushed to `eu` afterwards. Once `eu` heard `us`
/// again, `eu` must admit nothing: an outbox without a recorded `run` also
/// starts a new epoch. (Before, a missing `run` was only recorded, so
/// `us`'s new cumulative counts (4, 5, 6) stayed below `eu`'s `seen` 7 of
/// the same epoch and `eu` admitted 3 more: 13 of 10.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_taken_before_the_run_was_recorded_does_not_hide_the_senders_new_counts() {
    let mut regions = Regions::start_fresh(SYNC, std::time::Duration::from_secs(2)).await;
    let key = "run-missing";
    assert_eq!(
        regions.servers[US].cli(&["ACL", "SETUSER", "default", "-info"]),
        "OK"
    );
    let mut us_admitted = admit_n(&regions, US, key, 3).await;
    assert_eq!(us_admitted, 3);
    // Let a few rounds try (and fail at INFO).
    tokio::time::sleep(SYNC * 5).await;
    let meta_at_save = regions.servers[US].cli(&["HGETALL", META]);
    assert!(
        !meta_at_save.lines().any(|l| l == "run"),
        "the outbox meta already has a run: {meta_at_save:?}"
    );
    assert_eq!(regions.servers[US].cli(&["SAVE"]), "OK");
    assert_eq!(
        regions.servers[US].cli(&["ACL", "SETUSER", "default", "+info"]),
        "OK"
    );
    regions.wait_heard_since(EU, US, Instant::now()).await;
    us_admitted += admit_n(&regions, US, key, 4).await;
    assert_eq!(us_admitted, 7);
    regions.wait_heard_since(EU, US, Instant::now()).await;
    let meta_before = regions.servers[US].cli(&["HGETALL", META]);
    regions.servers[US].restart();
    let restarted = Instant::now();
    us_hears_its_peers_since(&regions, restarted).await;
    us_admitted += admit_n(&regions, US, key, 3).await;
    assert_eq!(us_admitted, 10, "us forgot 4 and admits 3 more");
    regions.wait_heard_since(EU, US, Instant::now()).await;
    regions.wait_heard_since(EU, US, Instant::now()).await;
    let meta_after = regions.servers[US].cli(&["HGETALL", META]);
    let hash = regions.stores[EU].state_key(key.as_bytes(), &fixed(10));
    let fields = regions.fields(EU, &hash);
    let eu_admitted = admit_n(&regions, EU, key, 20).await;
    assert_eq!(
        eu_admitted,
        0,
        "us admitted {us_admitted} of a limit of 10 (the last 3 after its Redis came back \
         from a snapshot whose outbox meta had no run), all pushed to eu and heard there; eu \
         then admitted {eu_admitted}: the fleet {} of 10. us's meta at the save \
         {meta_at_save:?}, before the restart {meta_before:?}, after {meta_after:?}; eu's \
         fields {fields:?}",
        us_admitted + eu_admitted
    );
}

/// `us`'s Redis is snapshotted once (2 admitted on a key), then killed and
/// brought back from that snapshot four times, admitting 1 on the key each
/// time. Each time `eu` hears `us` again (liveness) under a new epoch, and
/// counts at least everything `us` admitted (its epochs afresh: towards
/// denying), so `eu` admits nothing beyond the limit less `us`'s
/// admissions; the outbox meta and `eu`'s heard hash of `us` stay a
/// handful of fields; every key has a TTL. (`us` itself forgets what it
/// admitted after the snapshot at each restart: the data-loss slack
/// RELIABILITY.md states, once per loss.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_restarted_again_and_again_from_one_snapshot_stays_heard_and_bounded() {
    let mut regions = Regions::start_fresh(SYNC, std::time::Duration::from_secs(2)).await;
    let key = "again-and-again";
    let mut us_admitted = admit_n(&regions, US, key, 2).await;
    regions.wait_heard_since(EU, US, Instant::now()).await;
    assert_eq!(regions.servers[US].cli(&["SAVE"]), "OK");
    let mut epochs = Vec::new();
    let mut eu_before = 0;
    for restart in 0..4 {
        regions.servers[US].restart();
        let restarted = Instant::now();
        us_hears_its_peers_since(&regions, restarted).await;
        us_admitted += admit_n(&regions, US, key, 1).await;
        regions.wait_heard_since(EU, US, Instant::now()).await;
        let meta: Vec<String> = regions.servers[US]
            .cli(&["HGETALL", META])
            .lines()
            .map(str::to_owned)
            .collect();
        let epoch = meta
            .chunks_exact(2)
            .find(|p| p[0] == "epoch")
            .map(|p| p[1].clone())
            .expect("an epoch");
        assert!(
            !epochs.contains(&epoch),
            "restart {restart}: epoch {epoch} reused ({epochs:?})"
        );
        epochs.push(epoch);
        assert!(meta.len() / 2 <= 3 + 2 * 2, "restart {restart}: {meta:?}");
        let heard: usize = regions.servers[EU]
            .cli(&["HLEN", "ratelimit:mr:heard:us"])
            .parse()
            .expect("a length");
        assert!(
            heard <= 10,
            "restart {restart}: heard hash of {heard} fields"
        );
        let hash = regions.stores[EU].state_key(key.as_bytes(), &fixed(10));
        let fields = regions.fields(EU, &hash);
        let eu_admitted = admit_n(&regions, EU, key, 20).await;
        assert!(
            eu_admitted <= 10usize.saturating_sub(us_admitted + eu_before),
            "restart {restart}: us admitted {us_admitted}, eu {eu_before} before and \
             {eu_admitted} now; eu's fields {fields:?}"
        );
        eu_before += eu_admitted;
    }
    regions.assert_every_key_has_a_ttl();
}

/// `INFO server`'s run id of `server`.
fn run_id(server: &RedisServer) -> String {
    server
        .cli(&["INFO", "server"])
        .lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .map(|r| r.trim().to_owned())
        .expect("a run id")
}

/// The value of `field` in the `HGETALL` output `out`.
fn field(out: &str, field: &str) -> Option<String> {
    let lines: Vec<&str> = out.lines().collect();
    lines
        .chunks_exact(2)
        .find(|p| p[0] == field)
        .map(|p| p[1].to_owned())
}

/// `us`'s Redis (process P1) has a replica P2. `us` admits 3 on one key;
/// P2 has them, then is cut off from P1 (promoted: `REPLICAOF NO ONE`, as
/// Sentinel does when P1 looks down), so it stays behind. `us` admits 4 more
/// on P1 (7), and `eu` hears all 7. P1 is then demoted and resynced from P2
/// (a full sync: P1's data is now P2's, 3 on the key) and promoted back, as a
/// fail-back does. P1 runs on with the same run id, and the outbox meta it
/// got from P2 records it (P2 served no round), but its replication id is
/// new, so the outbox starts a new epoch. `us` forgot 4 (the data-loss
/// slack) and admits 3 more, 10 in all, every one after the fail-back
/// pushed to `eu`. Once `eu` heard `us` again it must admit nothing.
/// (With the run id alone, the old epoch stayed, `eu`'s `seen` of `us` said
/// 7, `us`'s new cumulative 4, 5, 6 added nothing there, and `eu` admitted
/// 3 more: 13 of 10.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_resynced_from_a_replica_behind_starts_a_new_epoch() {
    let regions = Regions::start_fresh(SYNC, Duration::from_secs(10)).await;
    let key = "fail-back";
    let replica = RedisServer::start();
    let us_port = regions.servers[US].port().to_string();
    assert_eq!(replica.cli(&["REPLICAOF", "127.0.0.1", &us_port]), "OK");
    let mut us_admitted = admit_n(&regions, US, key, 3).await;
    assert_eq!(us_admitted, 3);
    regions.wait_heard_since(EU, US, Instant::now()).await;
    // P2 catches up with P1 (a round recorded P1's run id in the meta).
    let deadline = Instant::now();
    loop {
        if replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
        {
            break;
        }
        assert!(
            deadline.elapsed() < Duration::from_secs(10),
            "replica never linked"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    regions.servers[US].wait_replicated(&replica);
    let p1_run = run_id(&regions.servers[US]);
    let meta_on_p2 = replica.cli(&["HGETALL", META]);
    assert!(
        field(&meta_on_p2, "run").is_some_and(|run| run.starts_with(&p1_run)),
        "P2's copy of the meta records P1's run: {meta_on_p2:?}"
    );
    // P2 promoted (cut off from P1): behind from now on.
    assert_eq!(replica.cli(&["REPLICAOF", "NO", "ONE"]), "OK");
    us_admitted += admit_n(&regions, US, key, 4).await;
    assert_eq!(us_admitted, 7);
    regions.wait_heard_since(EU, US, Instant::now()).await;
    let meta_before = regions.servers[US].cli(&["HGETALL", META]);
    // Fail-back: P1 demoted, fully resynced from P2, promoted again.
    let p2_port = replica.port().to_string();
    assert_eq!(
        regions.servers[US].cli(&["REPLICAOF", "127.0.0.1", &p2_port]),
        "OK"
    );
    let deadline = Instant::now();
    loop {
        let info = regions.servers[US].cli(&["INFO", "replication"]);
        if info.contains("master_link_status:up") && info.contains("master_sync_in_progress:0") {
            break;
        }
        assert!(
            deadline.elapsed() < Duration::from_secs(10),
            "P1 never resynced: {info}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    replica.wait_replicated(&regions.servers[US]);
    assert_eq!(regions.servers[US].cli(&["REPLICAOF", "NO", "ONE"]), "OK");
    let failed_back = Instant::now();
    assert_eq!(run_id(&regions.servers[US]), p1_run, "the same process");
    let hash = regions.stores[US].state_key(key.as_bytes(), &fixed(10));
    let us_fields = regions.fields(US, &hash);
    regions.wait_heard_since(US, EU, failed_back).await;
    regions.wait_heard_since(US, AP, failed_back).await;
    us_admitted += admit_n(&regions, US, key, 3).await;
    assert_eq!(
        us_admitted, 10,
        "us forgot 4 and admits 3 of the 7 it sees left (its fields after the resync \
         {us_fields:?})"
    );
    regions.wait_heard_since(EU, US, Instant::now()).await;
    regions.wait_heard_since(EU, US, Instant::now()).await;
    let meta_after = regions.servers[US].cli(&["HGETALL", META]);
    let fields = regions.fields(
        EU,
        &regions.stores[EU].state_key(key.as_bytes(), &fixed(10)),
    );
    let eu_admitted = admit_n(&regions, EU, key, 20).await;
    assert_eq!(
        eu_admitted,
        0,
        "us admitted {us_admitted} of a limit of 10 (the last 3 after its Redis process was \
         resynced from a replica behind and promoted back, the same run id), all pushed to eu \
         and heard there; eu then admitted {eu_admitted}: the fleet {} of 10. us's meta before \
         {meta_before:?}, after {meta_after:?}; eu's fields {fields:?}",
        us_admitted + eu_admitted
    );
    regions.assert_every_key_has_a_ttl();
}

/// `eu` and `us` both snapshotted (`SAVE`) after `us` admitted 3 on a key
/// (heard by `eu`), then `us` admits 4 more (heard), then both Redis are
/// killed and come back from their snapshots at once. Each hears the other
/// again (liveness), and after `us` admits 3 more (10 in all, 4 of them
/// forgotten by both sides: one loss's slack) the fleet admits at most one
/// more limit in all: `eu` at most the 10 `us`'s forgotten 4 leave, less
/// what `eu` counts of `us`. Every key has a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sides_back_from_snapshots_at_once_hear_each_other_within_the_slack() {
    let mut regions = Regions::start_fresh(SYNC, Duration::from_secs(2)).await;
    let key = "both-restored";
    let mut us_admitted = admit_n(&regions, US, key, 3).await;
    regions.wait_heard_since(EU, US, Instant::now()).await;
    assert_eq!(regions.servers[US].cli(&["SAVE"]), "OK");
    assert_eq!(regions.servers[EU].cli(&["SAVE"]), "OK");
    us_admitted += admit_n(&regions, US, key, 4).await;
    assert_eq!(us_admitted, 7);
    regions.wait_heard_since(EU, US, Instant::now()).await;
    regions.servers[US].restart();
    regions.servers[EU].restart();
    let restarted = Instant::now();
    for (to, from) in [(US, EU), (US, AP), (EU, US), (EU, AP), (AP, US), (AP, EU)] {
        regions.wait_heard_since(to, from, restarted).await;
    }
    us_admitted += admit_n(&regions, US, key, 3).await;
    assert_eq!(
        us_admitted, 10,
        "us forgot 4 and admits 3 of the 4 it sees left"
    );
    regions.wait_heard_since(EU, US, Instant::now()).await;
    regions.wait_heard_since(EU, US, Instant::now()).await;
    let eu_admitted = admit_n(&regions, EU, key, 20).await;
    // 4 forgotten fleet-wide (the loss's slack): at most 4 more anywhere.
    assert!(
        eu_admitted <= 4,
        "the fleet admitted {} of 10 after one loss of 4",
        us_admitted + eu_admitted
    );
    regions.assert_every_key_has_a_ttl();
}
