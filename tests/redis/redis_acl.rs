//! The least-privileged Redis ACL user for `RedisStore`, as documented in
//! `SECURITY.md`, found and checked against real servers:
//!
//! - a user with exactly that ACL runs every algorithm's check, `check_all`,
//!   `release`, `renew`, `settle`, `ping` and the `NOSCRIPT` reload (after `SCRIPT FLUSH` by an
//!   admin user), on one node and on a Redis Cluster (with its refunds), and
//!   Redis logs no denied command for it;
//! - a user lacking any one of those commands gets an error from the store
//!   (never a panic, never a wrong decision), or, for the commands only
//!   cluster refunds use, loses the refund (which errs towards denying);
//! - the key pattern confines the user to its prefix.
//!
//! Redis 7 checks every command a script calls against the ACL of the user
//! running the script, so the list names the scripts' commands too.

use std::time::Duration;

use http::{Request, StatusCode};
use ratelimit_core::redis::bb8_redis::RedisConnectionManager;
use ratelimit_core::redis::{RedisStore, bb8};
use ratelimit_core::{
    AdminStore, Check, Decision, Policy, Rate, Settle, SettlementId, Store, StoreError,
};
use ratelimit_tests::fixtures::ok_service;
use ratelimit_tests::{
    Boxed, CALL_TIMEOUT, NO_EDGE, RedisCluster, RedisServer, admits, build, join_in_order,
    long_policies, named,
};
use ratelimit_tower::{FailurePolicy, GlobalKey, RateLimitLayer};
use tower::{Layer, ServiceExt};

use crate::shared::SlotMove;

const ADMIN_PASSWORD: &str = "admin-pw";
const LIMITER_PASSWORD: &str = "limiter-pw";

/// The commands of the documented ACL (SECURITY.md), in its order.
const COMMANDS: &[&str] = &[
    // The client: single decisions by Redis Functions, the library loaded
    // when missing (both optional: see FALLBACK) ...
    "fcall",
    "function|load",
    // ... everything else by scripts, by hash, reloaded by source after
    // NOSCRIPT.
    "evalsha",
    "eval",
    // Inside the scripts.
    "time",
    "get",
    "set",
    "pexpire",
    "del",
    // Read only to convert a key of an earlier layout (a semaphore or a
    // sliding log kept as a sorted set).
    "zrange",
    // A block (`block.lua`) keeps the TTL of the state it goes in front of.
    "pttl",
    // `RedisStore::ping`, `build()`'s credential check, and the cluster
    // client on every new node connection.
    "ping",
    // `build()` reads the node's `maxmemory_policy`.
    "info",
];

/// Without these, the store decides by scripts instead of functions (after
/// one denied try, in `ACL LOG`): slower, never wrong, never failing.
const FALLBACK: &[&str] = &["fcall", "function|load"];

/// Without this, `build()` does not read the eviction policy (after one
/// denied try, in `ACL LOG`): nothing else changes.
const UNCHECKED: &[&str] = &["info"];

/// What a Redis Cluster client needs besides [`COMMANDS`]: the topology,
/// `READONLY`, which redis-rs sends on each node connection of the
/// client whose slot map the store follows (a no-op on a master; without
/// it, one `ACL LOG` entry per connection), and `ASKING`, with which a call
/// redirected by `ASK` goes to the importing master while a slot moves.
const CLUSTER_COMMANDS: &[&str] = &["cluster|slots", "readonly", "asking"];

/// `ACL SETUSER <name> ...` rules: the password, the key pattern, and
/// nothing but `commands`.
fn rules(commands: &[&str]) -> Vec<String> {
    let mut rules: Vec<String> = [
        "reset",
        "on",
        &format!(">{LIMITER_PASSWORD}"),
        "~ratelimit:*",
        "resetchannels",
        "-@all",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    rules.extend(commands.iter().map(|c| format!("+{c}")));
    rules
}

/// Sets the ACL user `name`, allowed [`rules`] of `commands`, on every node
/// of `cluster`.
fn set_user_on_every_node(cluster: &RedisCluster, name: &str, commands: &[&str]) {
    let rules = rules(commands);
    let mut args = vec!["ACL", "SETUSER", name];
    args.extend(rules.iter().map(String::as_str));
    for i in 0..cluster.nodes().len() {
        assert_eq!(cluster.cli(i, &args), "OK");
    }
}

/// The URLs of `cluster`'s nodes, logged in as `user`.
fn urls_as(cluster: &RedisCluster, user: &str) -> Vec<String> {
    cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://{user}:{LIMITER_PASSWORD}@127.0.0.1:{}", n.port()))
        .collect()
}

/// A server whose default user is off, with an `admin` user for `SCRIPT
/// FLUSH`, `ACL SETUSER` and `ACL LOG`.
fn server() -> RedisServer {
    RedisServer::start_with_args(&[
        "--user",
        "default",
        "off",
        "--user",
        "admin",
        "on",
        ">admin-pw",
        "~*",
        "&*",
        "+@all",
    ])
}

fn admin(server: &RedisServer, args: &[&str]) -> String {
    let auth = [
        "--user",
        "admin",
        "--pass",
        ADMIN_PASSWORD,
        "--no-auth-warning",
    ];
    server.cli(&[&auth[..], args].concat())
}

fn set_user(server: &RedisServer, name: &str, commands: &[&str]) {
    let rules = rules(commands);
    let mut args = vec!["ACL", "SETUSER", name];
    args.extend(rules.iter().map(String::as_str));
    assert_eq!(admin(server, &args), "OK", "ACL SETUSER {name} {rules:?}");
}

/// The commands the server denied, from `ACL LOG` (`object` of each entry),
/// without `client|setinfo`: redis-rs sends `CLIENT SETINFO` on connect to
/// Redis 7.2 and later and ignores its reply, so it may be denied.
fn denied(acl_log: &str) -> Vec<String> {
    let lines: Vec<&str> = acl_log.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter(|w| w[0] == "object")
        .map(|w| w[1].to_owned())
        .filter(|object| object != "client|setinfo")
        .collect()
}

fn url(server: &RedisServer, user: &str, db: u8) -> String {
    format!(
        "redis://{user}:{LIMITER_PASSWORD}@127.0.0.1:{}/{db}",
        server.port()
    )
}

async fn store(url: String) -> RedisStore {
    build(
        RedisStore::builder(url)
            .call_timeout(CALL_TIMEOUT)
            .connect_timeout(Duration::from_secs(5)),
    )
    .await
}

/// Every algorithm with a limit of 2 and a long window (nothing refills).
fn policies() -> Vec<Policy> {
    long_policies(2)
}

/// The policy of [`policies`] whose algorithm is `kind`.
fn policy_of(kind: &str) -> Policy {
    policies()
        .into_iter()
        .find(|p| p.algorithm().kind() == kind)
        .unwrap_or_else(|| panic!("no {kind} policy"))
}

/// Why an operation failed.
#[derive(Debug)]
enum Failure {
    /// The store returned an error: what a missing permission must give.
    Store(StoreError),
    /// The store answered, but not what the algorithm decides: never acceptable.
    Wrong(String),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

fn expect(what: &str, d: &Decision, allowed: bool, remaining: u64) -> Result<(), Failure> {
    if d.is_allowed() == allowed && d.remaining() == remaining {
        Ok(())
    } else {
        Err(Failure::Wrong(format!(
            "{what}: expected allowed={allowed} remaining={remaining}, got {d:?}"
        )))
    }
}

/// Two admissions, then a denial with a retry time.
async fn check_op(store: &RedisStore, key: &[u8], policy: &Policy) -> Result<(), Failure> {
    let first = store.check(key, policy, 1).await?;
    expect("first", &first, true, 1)?;
    let second = store.check(key, policy, 1).await?;
    expect("second", &second, true, 0)?;
    let third = store.check(key, policy, 1).await?;
    expect("third", &third, false, 0)?;
    if third.retry_after().is_none() {
        return Err(Failure::Wrong(format!("a denial without retry: {third:?}")));
    }
    Ok(())
}

/// One unit of a semaphore of 2 taken: its permit.
async fn acquire(
    store: &RedisStore,
    key: &[u8],
    policy: &Policy,
) -> Result<ratelimit_core::PermitId, Failure> {
    let d = store.check(key, policy, 1).await?;
    expect("acquire", &d, true, 1)?;
    d.permit().ok_or_else(|| Failure::Wrong("no permit".into()))
}

/// A permit taken, released, and taken again.
async fn release_op(store: &RedisStore, key: &[u8], policy: &Policy) -> Result<(), Failure> {
    let permit = acquire(store, key, policy).await?;
    store.release(key, policy, permit).await?;
    let again = store.check(key, policy, 2).await?;
    expect("after release", &again, true, 0)?;
    Ok(())
}

/// A permit taken and renewed; once released, its renewal finds nothing.
async fn renew_op(store: &RedisStore, key: &[u8], policy: &Policy) -> Result<(), Failure> {
    let permit = acquire(store, key, policy).await?;
    if !store.renew(key, policy, permit).await? {
        return Err(Failure::Wrong("a held permit was not renewed".into()));
    }
    store.release(key, policy, permit).await?;
    if store.renew(key, policy, permit).await? {
        return Err(Failure::Wrong("a released permit was renewed".into()));
    }
    Ok(())
}

/// Every algorithm at once, all or nothing.
async fn check_all_op(store: &RedisStore, key: &[u8]) -> Result<(), Failure> {
    let policies = policies();
    let checks =
        |cost| -> Vec<Check<'_>> { policies.iter().map(|p| Check::new(key, p, cost)).collect() };
    for (cost, allowed, remaining) in [(1, true, 1), (2, false, 1), (1, true, 0), (1, false, 0)] {
        let decisions = store.check_all(&checks(cost)).await?;
        for (policy, d) in policies.iter().zip(&decisions) {
            // A refused group reports peeks: the limits that had room say so.
            let allowed_here = allowed || d.remaining() >= cost;
            expect(policy.name(), d, allowed_here, remaining)?;
        }
        if decisions.iter().all(Decision::is_allowed) != allowed {
            return Err(Failure::Wrong(format!(
                "group of cost {cost}: {decisions:?}"
            )));
        }
    }
    Ok(())
}

/// Every operation of the store, on keys fresh for `round`: the name of each
/// operation and what became of it.
async fn exercise(store: &RedisStore, round: &str) -> Vec<(String, Result<(), Failure>)> {
    let mut report = Vec::new();
    report.push(("ping".to_owned(), store.ping().await.map_err(Failure::from)));
    for policy in policies() {
        let kind = policy.algorithm().kind();
        let key = format!("{round}-{kind}");
        let result = check_op(store, key.as_bytes(), &policy).await;
        report.push((format!("check {kind}"), result));
        if kind == "concurrency" {
            let key = format!("{round}-release");
            let result = release_op(store, key.as_bytes(), &policy).await;
            report.push(("release".to_owned(), result));
            let key = format!("{round}-renew");
            let result = renew_op(store, key.as_bytes(), &policy).await;
            report.push(("renew".to_owned(), result));
        }
    }
    let key = format!("{round}-multi");
    let result = check_all_op(store, key.as_bytes()).await;
    report.push(("check_all".to_owned(), result));
    let result = batch_op(store, round).await;
    report.push(("batch".to_owned(), result));
    report
}

/// A check of a semaphore the admin wrote in the previous layout (a
/// sorted set holding one permit), which the store converts.
async fn old_semaphore_op(
    server: &RedisServer,
    store: &RedisStore,
    key: &[u8],
) -> Result<(), Failure> {
    let policy = policy_of("concurrency");
    let state_key = store.state_key(key, &policy);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let expires = (now + Duration::from_secs(1800)).as_micros().to_string();
    let member = format!("{:032x}:1", 7);
    admin(server, &["ZADD", &state_key, &expires, &member]);
    admin(server, &["PEXPIRE", &state_key, "3600000"]);
    let d = store.check(key, &policy, 1).await?;
    expect("an old semaphore", &d, true, 0)
}

/// A block of a key that holds a state, whose TTL it keeps.
async fn block_op(store: &RedisStore, key: &[u8], policy: &Policy) -> Result<(), Failure> {
    store.check(key, policy, 1).await?;
    store.block(key, policy, Duration::from_secs(60)).await?;
    let d = store.check(key, policy, 1).await?;
    expect("a blocked key", &d, false, 0)
}

/// A penalty, which remembers its id beside the state for as long as the
/// state lives (so a resend changes nothing).
async fn penalize_op(store: &RedisStore, key: &[u8], policy: &Policy) -> Result<(), Failure> {
    let d = store.penalize(key, policy, 1).await?;
    expect("a penalized key", &d, true, 1)
}

/// A settlement of two limits, `policy` and a fixed window, which
/// remembers its id beside each state.
async fn settle_op(store: &RedisStore, key: &[u8], policy: &Policy) -> Result<(), Failure> {
    let window = policy_of("fixed-window");
    let checks = [Check::new(key, policy, 1), Check::new(key, &window, 1)];
    let reserved = store.check_all(&checks).await?;
    let settles = [
        Settle::new(key, policy, 1, 2, &reserved[0]),
        Settle::new(key, &window, 1, 0, &reserved[1]),
    ];
    let settled = store.settle(SettlementId::random(), &settles).await?;
    expect("a settled key", &settled[0], true, 0)?;
    expect("a settled key", &settled[1], true, 2)
}

/// [`exercise`] on a single node, and what only a single node is asked
/// here: a semaphore in the previous layout, a block, a penalty, a
/// settlement.
async fn exercise_node(
    server: &RedisServer,
    store: &RedisStore,
    round: &str,
) -> Vec<(String, Result<(), Failure>)> {
    let mut report = exercise(store, round).await;
    let gcra = policy_of("gcra");
    let key = |name: &str| format!("{round}-{name}").into_bytes();
    let results = [
        (
            "check an old semaphore",
            old_semaphore_op(server, store, &key("old")).await,
        ),
        ("block", block_op(store, &key("blocked"), &gcra).await),
        (
            "penalize",
            penalize_op(store, &key("penalized"), &gcra).await,
        ),
        ("settle", settle_op(store, &key("settled"), &gcra).await),
    ];
    report.extend(results.map(|(name, result)| (name.to_owned(), result)));
    report
}

/// More checks at once than the store has connections, so that the ones
/// that wait go together as one coalesced call (`batch.lua`): every
/// algorithm, two keys each, each admitted once.
async fn batch_op(store: &RedisStore, round: &str) -> Result<(), Failure> {
    let policies = policies();
    let keys: Vec<(String, &Policy)> = policies
        .iter()
        .flat_map(|p| (0..2).map(move |i| (format!("{round}-batch-{i}"), p)))
        .collect();
    let before = store.coalescing();
    let calls: Vec<Boxed<Result<Decision, StoreError>>> = keys
        .iter()
        .map(|(key, policy)| {
            let (store, key, policy) = (store.clone(), key.clone(), (*policy).clone());
            Box::pin(async move { store.check(key.as_bytes(), &policy, 1).await }) as Boxed<_>
        })
        .collect();
    let decisions = join_in_order(calls).await;
    let after = store.coalescing();
    for ((key, _), decision) in keys.iter().zip(decisions) {
        expect(key, &decision?, true, 1)?;
    }
    if after.calls - before.calls >= after.requests - before.requests {
        return Err(Failure::Wrong(format!(
            "no batch formed: {before:?} then {after:?}"
        )));
    }
    Ok(())
}

fn assert_all_ok(report: &[(String, Result<(), Failure>)], context: &str) {
    let failures: Vec<_> = report.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(failures.is_empty(), "{context}: {failures:#?}");
}

/// On the store's own connections and on the application's bb8 pool.
#[tokio::test]
async fn the_documented_acl_runs_every_operation_and_the_noscript_reload() {
    for on_pool in [false, true] {
        let server = server();
        set_user(&server, "limiter", COMMANDS);
        let url = url(&server, "limiter", 0);
        let store = if on_pool {
            store_on_pool(url).await
        } else {
            store(url).await
        };
        runs_every_operation_and_the_noscript_reload(&server, &store).await;
    }
}

/// Every operation on `store` of the `limiter` user of `server` (fresh),
/// with a cold script cache, a warm one, and after both flushes: nothing is
/// denied, and every key is under the prefix with a TTL.
async fn runs_every_operation_and_the_noscript_reload(server: &RedisServer, store: &RedisStore) {
    // A fresh server has no script cached: every first call is EVALSHA,
    // NOSCRIPT, then EVAL.
    assert_all_ok(
        &exercise_node(server, store, "cold").await,
        "cold script cache",
    );
    assert_all_ok(
        &exercise_node(server, store, "warm").await,
        "warm script cache",
    );
    assert_eq!(admin(server, &["SCRIPT", "FLUSH"]), "OK");
    assert_eq!(admin(server, &["FUNCTION", "FLUSH"]), "OK");
    assert_all_ok(
        &exercise_node(server, store, "flushed").await,
        "after SCRIPT FLUSH and FUNCTION FLUSH",
    );
    // Nothing was denied, not even a command whose reply is ignored.
    assert_eq!(
        denied(&admin(server, &["ACL", "LOG"])),
        Vec::<String>::new()
    );
    // Everything the user wrote is under its prefix, and has a TTL.
    let keys = admin(server, &["--scan"]);
    assert!(!keys.is_empty());
    for key in keys.lines() {
        assert!(key.starts_with("ratelimit:"), "{key}");
        let ttl: i64 = admin(server, &["PTTL", key]).parse().unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
}

/// Which operation a user lacking `command` cannot do, on a single node.
fn witness(command: &str) -> &'static str {
    match command {
        "evalsha" | "eval" | "time" | "get" | "set" => "check fixed-window",
        // Write commands: the connection's probe fails every operation.
        "pexpire" => "check sliding-log",
        // Read only to convert a key of the previous layout.
        "zrange" => "check an old semaphore",
        // A release of the last permit held deletes the key.
        "del" => "release",
        "pttl" => "penalize",
        "ping" => "ping",
        other => panic!("no witness for {other}"),
    }
}

#[tokio::test]
async fn a_user_lacking_any_one_command_gets_errors_never_wrong_decisions() {
    let server = server();
    for &missing in COMMANDS {
        let user = format!("lacks-{missing}");
        let commands: Vec<&str> = COMMANDS.iter().copied().filter(|c| *c != missing).collect();
        set_user(&server, &user, &commands);
        assert_eq!(admin(&server, &["SCRIPT", "FLUSH"]), "OK");
        assert_eq!(admin(&server, &["FUNCTION", "FLUSH"]), "OK");
        let store = store(url(&server, &user, 0)).await;
        let mut report = exercise_node(&server, &store, &format!("{user}-cold")).await;
        report.extend(exercise_node(&server, &store, &format!("{user}-warm")).await);
        if FALLBACK.contains(&missing) || UNCHECKED.contains(&missing) {
            assert_all_ok(&report, &format!("without {missing}"));
            let log = admin(&server, &["ACL", "LOG"]);
            assert!(
                denied(&log).iter().any(|c| c == missing),
                "ACL LOG does not show {missing}: {log}"
            );
            assert_eq!(admin(&server, &["ACL", "LOG", "RESET"]), "OK");
            continue;
        }
        let mut witnessed = false;
        for (op, result) in &report {
            match result {
                Ok(()) => {}
                Err(Failure::Wrong(what)) => {
                    panic!("without {missing}, {op} decided wrongly: {what}")
                }
                Err(Failure::Store(e)) => {
                    assert!(
                        matches!(e, StoreError::Backend(_)) && !e.is_outage(),
                        "{missing}: {op}: {e:?}"
                    );
                    let text = e.to_string();
                    assert!(
                        text.contains("NoPerm") || text.contains("can't run this command"),
                        "without {missing}, {op}: {text}"
                    );
                    witnessed |= op == witness(missing);
                }
            }
        }
        assert!(
            witnessed,
            "without {missing}, {} did not fail: {report:#?}",
            witness(missing)
        );
        if ["set", "pexpire"].contains(&missing) {
            // Write commands are checked before any write: the error names
            // the command, and no key was written half-way (without a TTL).
            let named = report.iter().any(|(_, r)| {
                matches!(r, Err(Failure::Store(e)) if e.to_string().contains(&format!("needs {missing}")))
            });
            assert!(named, "without {missing}: no error names it: {report:#?}");
            for key in admin(&server, &["--scan"])
                .lines()
                .filter(|k| !k.is_empty())
            {
                let ttl = admin(&server, &["PTTL", key]);
                assert_ne!(ttl, "-1", "without {missing}, {key} was left without a TTL");
            }
        } else {
            let log = admin(&server, &["ACL", "LOG"]);
            assert!(
                denied(&log).iter().any(|c| c == missing),
                "ACL LOG does not show {missing}: {log}"
            );
        }
        assert_eq!(admin(&server, &["ACL", "LOG", "RESET"]), "OK");
    }
}

/// The write permissions are checked once per connection, when the store
/// connects (and reconnects), not inside every decision: a missing one fails
/// even `ping` (a health check then sees the misconfiguration) and a peek,
/// which writes nothing, with an error naming the command, and nothing is
/// written. The user is fixed and connects again: everything works.
#[tokio::test]
async fn a_missing_write_permission_fails_at_connect_even_ping_and_peek() {
    let server = server();
    for missing in ["set", "pexpire"] {
        let user = format!("connect-lacks-{missing}");
        let commands: Vec<&str> = COMMANDS.iter().copied().filter(|c| *c != missing).collect();
        set_user(&server, &user, &commands);
        let store = store(url(&server, &user, 0)).await;
        let ping = store.ping().await.unwrap_err();
        assert!(
            matches!(ping, StoreError::Backend(_)) && !ping.is_outage(),
            "{missing}: {ping:?}"
        );
        assert!(
            ping.to_string().contains(&format!("needs {missing}")),
            "{missing}: {ping}"
        );
        let policy = Policy::gcra(2, Rate::per_hour(1)).unwrap();
        let peek = store.check(b"k", &policy, 0).await.unwrap_err();
        assert!(
            peek.to_string().contains(&format!("needs {missing}")),
            "{peek}"
        );
        assert_eq!(
            admin(&server, &["--scan"]),
            "",
            "{missing}: a key was written"
        );

        set_user(&server, &user, COMMANDS);
        let store = self::store(url(&server, &user, 0)).await;
        store.ping().await.unwrap();
        assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
        assert_eq!(admin(&server, &["FLUSHALL"]), "OK");
    }
}

#[tokio::test]
async fn the_key_pattern_confines_the_user_to_its_prefix() {
    let server = server();
    set_user(&server, "limiter", COMMANDS);
    let policy = Policy::sliding_window_log(2, Duration::from_secs(60)).unwrap();
    let other = build(
        RedisStore::builder(url(&server, "limiter", 0))
            .prefix("other-app")
            .call_timeout(CALL_TIMEOUT),
    )
    .await;
    let error = other.check(b"k", &policy, 1).await.unwrap_err();
    assert!(error.to_string().contains("NoPerm"), "{error}");
    assert!(admin(&server, &["--scan"]).is_empty());
}

#[tokio::test]
async fn a_database_number_in_the_url_needs_select() {
    let server = server();
    set_user(&server, "limiter", COMMANDS);
    let policy = Policy::sliding_window_log(2, Duration::from_secs(60)).unwrap();
    let denied_select = store(url(&server, "limiter", 3)).await;
    let error = denied_select.check(b"k", &policy, 1).await.unwrap_err();
    // A permission the Redis user lacks is a configuration mistake, not an
    // outage: no failure policy may lift the limit for it.
    assert!(
        matches!(error, StoreError::Backend(_)) && !error.is_outage(),
        "{error:?}"
    );

    let with_select: Vec<&str> = COMMANDS.iter().copied().chain(["select"]).collect();
    set_user(&server, "limiter-db", &with_select);
    let store = store(url(&server, "limiter-db", 3)).await;
    assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    let keys = admin(&server, &["-n", "3", "--scan"]);
    assert_eq!(keys, "ratelimit:sliding-log-2-per-1m:{k}");
}

/// A missing permission is a configuration mistake, not an outage: the
/// layer refuses every request with `500` whatever its failure policy (it
/// used to follow the failure policy, so the default, fail open, admitted
/// everything), and counts it.
#[tokio::test]
async fn through_the_layer_a_missing_permission_is_refused_whatever_the_failure_policy() {
    let server = server();
    let commands: Vec<&str> = COMMANDS.iter().copied().filter(|c| *c != "get").collect();
    set_user(&server, "lacks-get", &commands);
    let store = store(url(&server, "lacks-get", 0)).await;
    let policy = Policy::sliding_window_log(1, Duration::from_secs(60)).unwrap();
    let inner = ok_service();
    for failure in [FailurePolicy::Closed, FailurePolicy::Open] {
        let layer = RateLimitLayer::new(store.clone(), policy.clone(), GlobalKey::default())
            .on_failure(failure.clone());
        let service = layer.clone().layer(inner);
        for _ in 0..3 {
            let response = service.clone().oneshot(Request::new("")).await.unwrap();
            assert_eq!(
                response.status(),
                StatusCode::INTERNAL_SERVER_ERROR,
                "{failure:?}"
            );
        }
        let stats = layer.stats();
        assert_eq!(stats.refused_on_error(), 3, "{failure:?}");
        assert_eq!(
            stats.failed_open() + stats.failed_closed(),
            0,
            "{failure:?}"
        );
    }
}

/// On a Redis Cluster: the documented ACL plus `cluster|slots` and
/// `readonly` runs every operation, and limits spanning slots are refunded
/// when a later slot denies (`refund.lua`: GET, SET, DEL, ZREM). Without DEL the refunds of
/// keys that were fresh are lost, which only ever denies more;
/// without `cluster|slots` the store cannot be built.
#[tokio::test]
async fn the_documented_acl_on_a_cluster_with_cross_slot_refunds() {
    let cluster = RedisCluster::start();
    let with_cluster: Vec<&str> = COMMANDS.iter().chain(CLUSTER_COMMANDS).copied().collect();
    let set_user_everywhere =
        |name: &str, commands: &[&str]| set_user_on_every_node(&cluster, name, commands);
    let cluster_store = |user: &str| {
        RedisStore::cluster_builder(urls_as(&cluster, user))
            .call_timeout(Duration::from_secs(5))
            .connect_timeout(Duration::from_secs(5))
            .build()
    };
    let acl_denials = || -> Vec<String> {
        (0..cluster.nodes().len())
            .flat_map(|i| {
                let denials = denied(&cluster.cli(i, &["ACL", "LOG"]));
                assert_eq!(cluster.cli(i, &["ACL", "LOG", "RESET"]), "OK");
                denials
            })
            .collect()
    };

    set_user_everywhere("limiter", &with_cluster);
    let store = cluster_store("limiter").await.unwrap();
    assert_all_ok(&exercise(&store, "cluster-cold").await, "cluster, cold");
    for i in 0..cluster.nodes().len() {
        assert_eq!(cluster.cli(i, &["SCRIPT", "FLUSH"]), "OK");
        assert_eq!(cluster.cli(i, &["FUNCTION", "FLUSH"]), "OK");
    }
    assert_all_ok(
        &exercise(&store, "cluster-flushed").await,
        "cluster, flushed",
    );
    assert_eq!(refunds(&store, "full").await, vec![2; 7], "every refund");
    assert_eq!(acl_denials(), Vec::<String>::new());

    // Without `del`, refunds are lost (the key keeps the consumption: fewer
    // admissions, never more) and Redis logs the denial.
    for missing in ["del"] {
        let user = format!("lacks-{missing}");
        let commands: Vec<&str> = with_cluster
            .iter()
            .copied()
            .filter(|c| *c != missing)
            .collect();
        set_user_everywhere(&user, &commands);
        let store = cluster_store(&user).await.unwrap();
        let remaining = refunds(&store, &user).await;
        assert!(remaining.iter().all(|&r| r == 1 || r == 2), "{remaining:?}");
        assert!(remaining.contains(&1), "{missing}: no refund was lost");
        assert!(acl_denials().iter().any(|c| c == missing), "{missing}");
    }

    set_user_everywhere("lacks-slots", COMMANDS);
    let error = cluster_store("lacks-slots").await.unwrap_err();
    assert!(error.to_string().contains("cluster|slots"), "{error}");
}

/// For each algorithm, a per-user limit and an exhausted shared limit in a
/// later slot, checked together: the shared limit denies, so the per-user
/// consumption is refunded. Returns what each per-user limit has left (2 when
/// refunded, 1 when the refund was lost).
async fn refunds(store: &RedisStore, tag: &str) -> Vec<u64> {
    let shared = named(format!("{tag}-shared"), Policy::fixed_window(1, NO_EDGE));
    let slot = |key: &str, policy: &Policy| {
        ratelimit_tests::cluster_slot(store.state_key(key.as_bytes(), policy).as_bytes())
    };
    // The shared key in a high slot, so that per-user keys come before it.
    let shared_key = (0..10_000)
        .map(|i| format!("shared-{i}"))
        .find(|k| slot(k, &shared) > 12_000)
        .unwrap();
    assert!(admits(store, shared_key.as_bytes(), &shared).await);
    let mut remaining = Vec::new();
    for policy in policies() {
        let kind = policy.algorithm().kind();
        let policy = policy.with_name(format!("{tag}-{kind}")).unwrap();
        let user = (0..10_000)
            .map(|i| format!("user-{i}"))
            .find(|u| slot(u, &policy) < 4_000)
            .unwrap();
        let checks = [
            Check::new(user.as_bytes(), &policy, 1),
            Check::new(shared_key.as_bytes(), &shared, 1),
        ];
        let decisions = store.check_all(&checks).await.unwrap();
        assert!(!decisions[1].is_allowed(), "{kind}: {decisions:?}");
        let peek = store.check(user.as_bytes(), &policy, 0).await.unwrap();
        remaining.push(peek.remaining());
    }
    remaining
}

/// A store on a bb8 pool of `url`'s connections (feature `bb8`).
async fn store_on_pool(url: String) -> RedisStore {
    let manager = RedisConnectionManager::new(url).expect("a valid URL");
    let pool = bb8::Pool::builder()
        .max_size(2)
        .connection_timeout(Duration::from_secs(5))
        .build_unchecked(manager);
    RedisStore::bb8_builder(pool)
        .call_timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("a store on a bb8 pool")
}

/// The ACL probe runs on the pool's connections: a user lacking a write
/// command is refused before any script (even a peek, which writes
/// nothing), as a mistake and not an outage; fixed, the next call probes
/// again and passes; and a connection the pool opens later is probed again.
#[tokio::test]
async fn the_acl_probe_refuses_a_tight_user_on_a_bb8_pool() {
    let server = server();
    let lacking = |missing: &str| -> Vec<&str> {
        COMMANDS.iter().copied().filter(|c| *c != missing).collect()
    };
    set_user(&server, "limiter", &lacking("set"));
    let store = store_on_pool(url(&server, "limiter", 0)).await;
    let policy = Policy::gcra(2, Rate::per_hour(1)).unwrap();
    let peek = store.check(b"k", &policy, 0).await.unwrap_err();
    assert!(
        matches!(peek, StoreError::Backend(_)) && !peek.is_outage(),
        "{peek:?}"
    );
    assert!(peek.to_string().contains("needs set"), "{peek}");
    assert_eq!(admin(&server, &["--scan"]), "", "a key was written");

    set_user(&server, "limiter", COMMANDS);
    assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());

    // The user loses `pexpire`, and its connections drop: the pool opens a
    // new one, which the store probes before using it.
    set_user(&server, "limiter", &lacking("pexpire"));
    assert_ne!(admin(&server, &["CLIENT", "KILL", "USER", "limiter"]), "0");
    let peek = store.check(b"k", &policy, 0).await.unwrap_err();
    assert!(peek.to_string().contains("needs pexpire"), "{peek}");
}

/// A pool of one connection, and calls at once whose probe fails: each is
/// refused with the mistake and gives its turn at the pool back (none is
/// left waiting for a turn past the call timeout, which would be an
/// outage); fixed, calls at once are all decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_at_once_whose_probe_fails_on_a_pool_of_one_are_all_refused() {
    const CALLS: usize = 8;
    let server = server();
    let lacking: Vec<&str> = COMMANDS.iter().copied().filter(|c| *c != "set").collect();
    set_user(&server, "limiter", &lacking);
    let manager = RedisConnectionManager::new(url(&server, "limiter", 0)).expect("a valid URL");
    let pool = bb8::Pool::builder()
        .max_size(1)
        .connection_timeout(Duration::from_secs(5))
        .build_unchecked(manager);
    let store = RedisStore::bb8_builder(pool)
        .call_timeout(Duration::from_secs(5))
        .max_batch(1)
        .build()
        .await
        .expect("a store on a bb8 pool");
    let policy = Policy::gcra(100, Rate::per_hour(1)).unwrap();
    let at_once = || {
        (0..CALLS)
            .map(|i| {
                let (store, policy) = (store.clone(), policy.clone());
                tokio::spawn(
                    async move { store.check(format!("k{i}").as_bytes(), &policy, 1).await },
                )
            })
            .collect::<Vec<_>>()
    };
    for call in at_once() {
        let error = call
            .await
            .expect("a call that did not panic")
            .expect_err("the probe fails");
        assert!(
            matches!(error, StoreError::Backend(_)) && !error.is_outage(),
            "{error:?}"
        );
        assert!(error.to_string().contains("needs set"), "{error}");
    }

    set_user(&server, "limiter", COMMANDS);
    for call in at_once() {
        let decision = call
            .await
            .expect("a call that did not panic")
            .expect("decided once the user may write");
        assert!(decision.is_allowed(), "{decision:?}");
    }
}

/// On a Redis Cluster whose slot is moving (`SETSLOT ... IMPORTING` and
/// `MIGRATING`), the documented cluster ACL decides a key the source no
/// longer has: the source answers `ASK`, and the store sends `ASKING` and
/// the call to the importing master, which the user may run. A user
/// without `asking` is refused (`NOPERM`), never answered as an outage
/// that a failure policy would admit.
#[tokio::test]
async fn the_documented_acl_on_a_cluster_follows_an_ask_while_a_slot_moves() {
    let cluster = RedisCluster::start();
    let with_cluster: Vec<&str> = COMMANDS.iter().chain(CLUSTER_COMMANDS).copied().collect();
    let without_asking: Vec<&str> = with_cluster
        .iter()
        .filter(|c| **c != "asking")
        .copied()
        .collect();
    for (user, commands) in [("limiter", &with_cluster), ("no-asking", &without_asking)] {
        set_user_on_every_node(&cluster, user, commands);
    }
    let store_of = |user: &str| {
        build(
            RedisStore::cluster_builder(urls_as(&cluster, user))
                .call_timeout(Duration::from_secs(2)),
        )
    };
    let store = store_of("limiter").await;
    let lacking = store_of("no-asking").await;
    let policy = named("asked", Policy::fixed_window(1, NO_EDGE));
    assert!(admits(&store, b"warm", &policy).await);
    assert!(admits(&lacking, b"warm-too", &policy).await);
    let slot = ratelimit_tests::cluster_slot(store.state_key(b"moving", &policy).as_bytes());
    let slot_move = SlotMove::of(&cluster, slot);
    let target = slot_move.target;
    let slot_arg = slot.to_string();
    slot_move.begin();
    for i in 0..cluster.nodes().len() {
        assert_eq!(cluster.cli(i, &["ACL", "LOG", "RESET"]), "OK");
    }
    // A fresh key: the source lacks it, and asks the target.
    let d = store
        .check(b"moving", &policy, 1)
        .await
        .expect("decided on the importing master");
    assert!(d.is_allowed(), "{d:?}");
    assert!(!admits(&store, b"moving", &policy).await, "counted there");
    let state = store.state_key(b"moving", &policy);
    let on_target = cluster.cli(target, &["CLUSTER", "GETKEYSINSLOT", &slot_arg, "10"]);
    assert_eq!(on_target, state, "the key lives on the target");
    let denials: Vec<String> = (0..cluster.nodes().len())
        .flat_map(|i| denied(&cluster.cli(i, &["ACL", "LOG"])))
        .collect();
    assert_eq!(denials, Vec::<String>::new());
    // Another fresh key of the slot, by the user without `asking`.
    let other = (0..100_000)
        .map(|i| format!("moving-{i}"))
        .find(|k| {
            ratelimit_tests::cluster_slot(store.state_key(k.as_bytes(), &policy).as_bytes()) == slot
        })
        .expect("another key of the slot");
    let error = lacking
        .check(other.as_bytes(), &policy, 1)
        .await
        .expect_err("ASKING is denied");
    assert!(!error.is_outage(), "{error}");
    assert!(error.to_string().contains("asking"), "{error}");
}
