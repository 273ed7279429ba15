//! Tests of the test kit itself: real Redis servers and clusters started by
//! `ratelimit_tests::redis_server`.

use std::path::Path;
use std::time::{Duration, Instant};

use ratelimit_tests::redis_server::MISSING_REDIS;
use ratelimit_tests::{RedisCluster, RedisServer};

/// Whether a process with `pid` still exists (zombies included).
fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Polls `condition` for at most `limit`.
fn eventually(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn server_starts_on_loopback_and_answers_ping() {
    let server = RedisServer::start();
    assert_eq!(server.cli(&["PING"]), "PONG");
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(server.addr().port(), server.port());
    assert!(server.addr().ip().is_loopback());
    assert_eq!(server.cli(&["CONFIG", "GET", "bind"]), "bind\n127.0.0.1");
    assert_eq!(
        server.cli(&["CONFIG", "GET", "appendonly"]),
        "appendonly\nno"
    );
    assert_eq!(server.cli(&["CONFIG", "GET", "save"]), "save");
}

#[test]
fn set_and_get() {
    let server = RedisServer::start();
    assert_eq!(server.cli(&["SET", "greeting", "hello"]), "OK");
    assert_eq!(server.cli(&["GET", "greeting"]), "hello");
    assert_eq!(server.cli(&["GET", "missing"]), "");
    assert_eq!(server.cli(&["INCRBY", "counter", "5"]), "5");
}

#[test]
fn restart_keeps_the_port_and_answers_again() {
    let mut server = RedisServer::start();
    let port = server.port();
    let url = server.url();
    let old_pid = server.pid().expect("running");
    server.cli(&["SET", "k", "v"]);

    server.restart();

    assert_eq!(server.port(), port);
    assert_eq!(server.url(), url);
    let new_pid = server.pid().expect("running again");
    assert_ne!(new_pid, old_pid);
    assert!(!process_exists(old_pid), "the old process was reaped");
    assert_eq!(server.cli(&["PING"]), "PONG");
    // No persistence: the data is gone.
    assert_eq!(server.cli(&["EXISTS", "k"]), "0");
}

#[test]
fn stop_then_restart() {
    let mut server = RedisServer::start();
    let pid = server.pid().expect("running");
    server.stop();
    assert!(!server.is_running());
    assert_eq!(server.pid(), None);
    assert!(!process_exists(pid));
    let output = server.cli_output(&["PING"]);
    assert!(!output.status.success(), "nothing answers a stopped server");
    server.stop(); // Idempotent.

    server.restart();
    assert!(server.is_running());
    assert_eq!(server.cli(&["PING"]), "PONG");
}

#[test]
fn drop_kills_the_process_and_removes_the_directory() {
    let server = RedisServer::start();
    let pid = server.pid().expect("running");
    let dir = server.dir().to_path_buf();
    assert!(process_exists(pid));
    assert!(dir.join("redis.log").exists());
    assert!(server.log().contains("Ready to accept connections"));

    drop(server);

    assert!(
        !process_exists(pid),
        "redis-server {pid} outlived its guard"
    );
    assert!(!dir.exists(), "{} was not removed", dir.display());
}

#[test]
fn extra_arguments_configure_acl_users() {
    let server = RedisServer::start_with_args(&[
        "--user", "default", "off", "--user", "alice", "on", ">secret", "~*", "+@all",
    ]);
    assert!(
        server.cli(&["PING"]).starts_with("NOAUTH"),
        "the default user is off"
    );
    let auth = ["--user", "alice", "--pass", "secret", "--no-auth-warning"];
    assert_eq!(
        server.cli(&[&auth[..], &["ACL", "WHOAMI"]].concat()),
        "alice"
    );
    assert_eq!(server.cli(&[&auth[..], &["SET", "k", "v"]].concat()), "OK");
}

#[test]
fn extra_arguments_make_a_replica() {
    // Without the default 5 s delay before a diskless full sync.
    let primary = RedisServer::start_with_args(&["--repl-diskless-sync-delay", "0"]);
    let primary_port = primary.port().to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &primary_port]);
    primary.cli(&["SET", "replicated", "yes"]);
    assert!(
        eventually(Duration::from_secs(10), || replica
            .cli(&["GET", "replicated"])
            == "yes"),
        "the replica never caught up: {}",
        replica.cli(&["INFO", "replication"])
    );
}

#[test]
fn missing_binary_panics_with_the_install_hint() {
    let panic = std::panic::catch_unwind(|| {
        RedisServer::start_program("redis-server-that-does-not-exist", &[])
    })
    .expect_err("starting a missing binary must panic");
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .expect("a string panic message");
    assert_eq!(
        message,
        "redis-server not found on PATH: run scripts/test, which installs redis-server and redis-tools from Debian's packages"
    );
    assert_eq!(message, MISSING_REDIS);
}

#[test]
#[should_panic(expected = "run scripts/test")]
fn missing_binary_path_panics() {
    RedisServer::start_program("/nonexistent/redis-server", &[]);
}

#[test]
#[should_panic(expected = "exited during startup")]
fn bad_configuration_panics_with_the_log() {
    RedisServer::start_with_args(&["--no-such-directive", "x"]);
}

#[test]
fn cluster_starts_with_three_masters_and_redirects() {
    let cluster = RedisCluster::start();
    assert_eq!(cluster.nodes().len(), 3);
    let urls = cluster.urls();
    assert_eq!(urls.len(), 3);
    for (node, url) in cluster.nodes().iter().zip(&urls) {
        assert_eq!(*url, format!("redis://127.0.0.1:{}", node.port()));
    }

    for index in 0..3 {
        let info = cluster.cli(index, &["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
        assert!(info.contains("cluster_size:3"), "{info}");
    }
    // The tests' slot of a key is the cluster's.
    for key in ["123456789", "rl:a:{user}", "{}x", "a{}{b}", "{b}{c}", "k{"] {
        let slot = cluster.cli(0, &["CLUSTER", "KEYSLOT", key]);
        assert_eq!(
            slot,
            ratelimit_tests::cluster_slot(key.as_bytes()).to_string(),
            "{key}"
        );
    }
    let nodes = cluster.cli(0, &["CLUSTER", "NODES"]);
    let masters = nodes
        .lines()
        .filter(|line| {
            line.split_whitespace()
                .nth(2)
                .unwrap_or("")
                .contains("master")
        })
        .count();
    assert_eq!(masters, 3, "{nodes}");

    // Keys set through node 0 with `-c` land on all three nodes (the slots
    // are split evenly), and every node reads them back with `-c`.
    let keys: Vec<String> = (0..12).map(|i| format!("key-{i}")).collect();
    for key in &keys {
        assert_eq!(cluster.cli(0, &["-c", "SET", key, key]), "OK");
    }
    let sizes: Vec<u64> = (0..3)
        .map(|i| cluster.cli(i, &["DBSIZE"]).parse().expect("DBSIZE"))
        .collect();
    assert_eq!(sizes.iter().sum::<u64>(), 12, "{sizes:?}");
    assert!(
        sizes.iter().all(|&n| n > 0),
        "keys on every node: {sizes:?}"
    );
    for key in &keys {
        for index in 1..3 {
            assert_eq!(cluster.cli(index, &["-c", "GET", key]), *key);
        }
    }
    // Without -c, a node answers MOVED for a key it does not own.
    let moved = (0..3)
        .flat_map(|i| keys.iter().map(move |k| (i, k)))
        .map(|(i, k)| cluster.cli(i, &["GET", k]))
        .filter(|reply| reply.starts_with("MOVED"))
        .count();
    assert_eq!(moved, 2 * keys.len());
}

#[test]
fn cluster_drop_kills_every_node() {
    let cluster = RedisCluster::start();
    let pids: Vec<u32> = cluster
        .nodes()
        .iter()
        .map(|n| n.pid().expect("running"))
        .collect();
    drop(cluster);
    for pid in pids {
        assert!(
            !process_exists(pid),
            "cluster node {pid} outlived its guard"
        );
    }
}

#[test]
fn cluster_node_restart_rejoins() {
    let mut cluster = RedisCluster::start();
    let port = cluster.nodes()[1].port();
    cluster.node_mut(1).restart();
    assert_eq!(cluster.nodes()[1].port(), port);
    assert!(
        eventually(Duration::from_secs(10), || cluster
            .cli(1, &["CLUSTER", "INFO"])
            .contains("cluster_state:ok")),
        "{}",
        cluster.cli(1, &["CLUSTER", "INFO"])
    );
    assert_eq!(cluster.cli(1, &["-c", "SET", "after-restart", "1"]), "OK");
    assert_eq!(cluster.cli(2, &["-c", "GET", "after-restart"]), "1");
}
