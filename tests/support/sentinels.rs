//! A Redis Sentinel set-up on loopback: a master, one replica of it, and
//! three `redis-sentinel` processes monitoring the master with a quorum of
//! two, each on a free port of 127.0.0.1 in a temporary directory of its own
//! (its configuration file there). Every process is killed when the set is
//! dropped, the sentinels first, so none fails over while the nodes stop.

use std::time::{Duration, Instant};

use crate::redis_server::poll_until;
use crate::{Certificates, RedisServer};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "ratelimit-master";

/// How long the master must not answer before a sentinel thinks it down
/// (`down-after-milliseconds`).
pub const DOWN_AFTER: Duration = Duration::from_millis(500);

/// The sentinels' `failover-timeout`: also how long a failover may wait for
/// the promoted replica, and (twice it) before the next failover of the
/// same master.
pub const FAILOVER_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the sentinels may take to find the replica and one another.
const MONITORED_TIMEOUT: Duration = Duration::from_secs(20);

/// A master, its replica and three sentinels; all killed on drop.
#[derive(Debug)]
pub struct RedisSentinels {
    // Dropped in this order: the sentinels first.
    sentinels: Vec<RedisServer>,
    master: RedisServer,
    replica: RedisServer,
    /// `redis-cli` arguments to reach the nodes (a password, TLS).
    cli_args: Vec<String>,
}

impl RedisSentinels {
    /// Starts the master, the replica (`--replicaof`), and the three
    /// sentinels (`sentinel monitor` [`MASTER_NAME`] with a quorum of 2,
    /// [`DOWN_AFTER`], [`FAILOVER_TIMEOUT`]), and waits until the replica is
    /// in sync and every sentinel knows the replica. (Each sentinel knows the
    /// others from its configuration; call
    /// [`wait_for_quorum`](Self::wait_for_quorum) before a failover all the
    /// same.)
    ///
    /// # Panics
    ///
    /// When `redis-server` or `redis-sentinel` is missing (the message names
    /// scripts/test), or when the set is not ready within 20 s (the message
    /// holds every sentinel's log).
    pub fn start() -> RedisSentinels {
        Self::start_with(&[], Vec::new(), "")
    }

    /// As [`start`](Self::start), the master and the replica asking for
    /// `password` (`requirepass`, and `masterauth` for the replica), which
    /// the sentinels log in with (`sentinel auth-pass`).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with_password(password: &str) -> RedisSentinels {
        let cli = ["--no-auth-warning", "-a", password]
            .map(String::from)
            .to_vec();
        let extra = format!("sentinel auth-pass {MASTER_NAME} {password}\n");
        Self::start_with(
            &["--requirepass", password, "--masterauth", password],
            cli,
            &extra,
        )
    }

    /// As [`start`](Self::start), the master and the replica speaking TLS
    /// only, with the server certificate of `certs` (the replica replicating
    /// over TLS); the sentinels reach them over TLS (`tls-replication yes`)
    /// but take plain connections themselves.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_tls(certs: &Certificates) -> RedisSentinels {
        let mut node_args = certs.server_args();
        node_args.extend(["--tls-replication", "yes"].map(String::from));
        let node_args: Vec<&str> = node_args.iter().map(String::as_str).collect();
        let extra = format!(
            "tls-replication yes\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n",
            certs.path("server.crt"),
            certs.path("server.key"),
            certs.path("ca.crt"),
        );
        Self::start_with(&node_args, certs.cli_args(), &extra)
    }

    fn start_with(node_args: &[&str], cli_args: Vec<String>, extra: &str) -> RedisSentinels {
        let mut set = Self::start_nodes(node_args, cli_args);
        set.start_sentinels(extra);
        set
    }

    fn start_nodes(node_args: &[&str], cli_args: Vec<String>) -> RedisSentinels {
        // A diskless full sync without delay: the replica is in sync at once.
        let master_args = [&["--repl-diskless-sync-delay", "0"][..], node_args].concat();
        let master = RedisServer::start_with_args(&master_args);
        let master_port = master.port().to_string();
        let replica_args = [&["--replicaof", "127.0.0.1", &master_port][..], node_args].concat();
        let replica = RedisServer::start_with_args(&replica_args);
        RedisSentinels {
            sentinels: Vec::new(),
            master,
            replica,
            cli_args,
        }
    }

    fn start_sentinels(&mut self, extra: &str) {
        let start = Instant::now();
        let auth: Vec<&str> = self.auth_args();
        // In sync is not yet streaming: after a full sync the master sends
        // writes only once the replica has acknowledged it (within a second),
        // and a failover before then would lose the writes in between. So a
        // write that touches no key (`PUBLISH` is replicated) must be
        // acknowledged by the replica. `WAIT` asks the replica for its
        // offset at once rather than at its next once-a-second report, and
        // counts its own connection's writes only: hence one connection.
        let info = |node: &RedisServer| node.cli(&[&auth[..], &["INFO", "replication"]].concat());
        let in_sync = || {
            let replica = info(&self.replica);
            let up = replica.lines().any(|l| l.trim() == "master_link_status:up");
            if up { Ok(()) } else { Err(replica) }
        };
        poll_until(start, MONITORED_TIMEOUT, in_sync, |replica| {
            format!(
                "the replica did not sync within {MONITORED_TIMEOUT:?}:\n{replica}\n{}",
                self.replica.log()
            )
        });
        // `CLIENT ID` before and after: the same id shows that the write and
        // the `WAIT` went on one connection (redis-cli reconnects silently).
        let acknowledged = || {
            let replies = self.master.cli_commands(
                &auth,
                "CLIENT ID\nPUBLISH ratelimit-test-sync 1\nWAIT 1 1000\nCLIENT ID\n",
            );
            let lines: Vec<&str> = replies.lines().map(str::trim).collect();
            let acked = matches!(lines.as_slice(), [before, _, "1", after] if before == after);
            if acked { Ok(()) } else { Err(replies) }
        };
        poll_until(start, MONITORED_TIMEOUT, acknowledged, |replies| {
            format!(
                "the replica did not acknowledge a write within {MONITORED_TIMEOUT:?} \
                 (CLIENT ID, PUBLISH, WAIT, CLIENT ID: {replies:?}):\n{}\n{}",
                info(&self.master),
                self.replica.log()
            )
        });
        // Each sentinel knows the others from its configuration (they would
        // otherwise hear of one another only every 2 s), so a test waits for
        // the quorum only as long as the sentinels take to start.
        let id = |port: u16| format!("{port:040x}");
        self.sentinels = RedisServer::start_sentinels(3, |ports, i| {
            let mut config = format!(
                "sentinel myid {id}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {down}\n\
                 sentinel failover-timeout {MASTER_NAME} {failover}\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n{extra}",
                id = id(ports[i]),
                port = self.master.port(),
                down = DOWN_AFTER.as_millis(),
                failover = FAILOVER_TIMEOUT.as_millis(),
            );
            for &other in ports.iter().filter(|&&p| p != ports[i]) {
                config.push_str(&format!(
                    "sentinel known-sentinel {MASTER_NAME} 127.0.0.1 {other} {}\n",
                    id(other)
                ));
            }
            config
        });
        self.wait_for(start, false);
    }

    /// Waits until every sentinel knows the two others, so that a failover
    /// can be agreed on.
    ///
    /// # Panics
    ///
    /// When they do not within 20 s (the message holds every sentinel's log).
    pub fn wait_for_quorum(&self) {
        self.wait_for(Instant::now(), true);
    }

    /// `redis-cli` arguments to reach the nodes (a password, TLS; none for
    /// a plain set); put them before the command.
    pub fn auth_args(&self) -> Vec<&str> {
        self.cli_args.iter().map(String::as_str).collect()
    }

    /// Polls every sentinel until it knows one replica and, with `quorum`,
    /// two other sentinels.
    fn wait_for(&self, start: Instant, quorum: bool) {
        let monitored = || {
            let ready = self.sentinels.iter().all(|sentinel| {
                let fields = sentinel_fields(sentinel, &["SENTINEL", "MASTER", MASTER_NAME]);
                let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v);
                field("num-slaves").is_some_and(|v| v == "1")
                    && (!quorum || field("num-other-sentinels").is_some_and(|v| v == "2"))
            });
            if ready { Ok(()) } else { Err(()) }
        };
        poll_until(start, MONITORED_TIMEOUT, monitored, |()| {
            let logs: Vec<String> = self
                .sentinels
                .iter()
                .map(|s| format!("--- sentinel {}\n{}", s.port(), s.log()))
                .collect();
            format!(
                "the sentinels did not find the replica and one another within {MONITORED_TIMEOUT:?}\n{}",
                logs.join("\n")
            )
        });
    }

    /// The sentinels' addresses, `127.0.0.1:port` each.
    pub fn addresses(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| s.addr().to_string())
            .collect()
    }

    /// The three sentinels.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// Sentinel `index` (0, 1 or 2), mutably, to stop or restart it.
    ///
    /// # Panics
    ///
    /// When `index` is not below 3.
    pub fn sentinel_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.sentinels[index]
    }

    /// The node that was the master when the set started (it may have been
    /// failed over since).
    pub fn master(&self) -> &RedisServer {
        &self.master
    }

    /// As [`master`](Self::master), mutably, to stop it.
    pub fn master_mut(&mut self) -> &mut RedisServer {
        &mut self.master
    }

    /// The node that was the replica when the set started.
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// The port of the master a sentinel that answers names now
    /// (`SENTINEL get-master-addr-by-name`), `None` if none answers.
    pub fn named_master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|sentinel| {
            let output = sentinel.cli_output(&["SENTINEL", "get-master-addr-by-name", MASTER_NAME]);
            let text = String::from_utf8_lossy(&output.stdout);
            text.lines().nth(1)?.trim().parse().ok()
        })
    }
}

/// The field-value pairs of a sentinel's reply (`SENTINEL MASTER name`).
fn sentinel_fields(sentinel: &RedisServer, args: &[&str]) -> Vec<(String, String)> {
    let output = sentinel.cli_output(args);
    let text = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    lines
        .chunks(2)
        .filter_map(|pair| match pair {
            [k, v] => Some(((*k).to_owned(), (*v).to_owned())),
            _ => None,
        })
        .collect()
}
