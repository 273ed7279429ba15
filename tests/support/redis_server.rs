//! Real Redis servers for tests, on loopback only: a single [`RedisServer`]
//! (or a `redis-sentinel`, see [`sentinels`](crate::sentinels)) and a
//! three-master [`RedisCluster`].
//!
//! Every server runs `redis-server` from `PATH` on a free port of 127.0.0.1,
//! without persistence, in a fresh temporary directory that also holds its
//! log (`redis.log`). Servers are killed and reaped when dropped, so a test
//! never leaves a process behind, even when it panics.
//!
//! Nothing here skips: when `redis-server` or `redis-cli` is missing the
//! functions panic with [`MISSING_REDIS`], which tells how to install them.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// The panic message when `redis-server` (or `redis-cli`) cannot be run.
pub const MISSING_REDIS: &str = "redis-server not found on PATH: run scripts/test, which installs redis-server and redis-tools from Debian's packages";

/// The panic message when `redis-sentinel` cannot be run.
pub const MISSING_SENTINEL: &str = "redis-sentinel not found on PATH: run scripts/test, which installs redis-sentinel from Debian's packages";

/// The `redis-server` executable looked up on `PATH`.
pub const REDIS_SERVER: &str = "redis-server";

/// The `redis-sentinel` executable looked up on `PATH`.
pub const REDIS_SENTINEL: &str = "redis-sentinel";

/// The `redis-cli` executable looked up on `PATH`.
pub const REDIS_CLI: &str = "redis-cli";

/// How long a server may take to answer `PING` after it is spawned.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a cluster may take to report `cluster_state:ok` on every node.
pub const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one `redis-cli` invocation may run before it is killed.
const CLI_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `redis-cli --cluster create` may run before it is killed.
const CLUSTER_CREATE_TIMEOUT: Duration = Duration::from_secs(30);

/// How many fresh ports [`RedisServer::start`] tries when the chosen port was
/// taken between picking and binding it.
const PORT_ATTEMPTS: usize = 5;

/// Offset from a cluster node's port to its cluster bus port.
const CLUSTER_BUS_OFFSET: u16 = 10_000;

/// Number of hash slots of a Redis Cluster.
const CLUSTER_SLOTS: usize = 16_384;

/// The arguments that make a server a Redis Cluster node.
const CLUSTER_ARGS: [&str; 6] = [
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "5000",
];

/// A `redis-server` process on 127.0.0.1, killed and reaped when dropped.
///
/// Its data directory (also holding its log) is a fresh temporary directory,
/// kept across [`restart`](Self::restart) and removed on drop.
#[derive(Debug)]
pub struct RedisServer {
    /// The running process, `None` once stopped.
    child: Option<Child>,
    /// The `redis-server` executable.
    program: String,
    /// Extra arguments given at start (with `{port}` already substituted).
    extra_args: Vec<String>,
    port: u16,
    /// Data directory, holding `redis.log`; dropped after the process.
    dir: TempDir,
    /// A sentinel's configuration, written to `sentinel.conf` in `dir` at
    /// the first start (the sentinel rewrites it, and keeps it across a
    /// restart); `None` for a plain server.
    sentinel_config: Option<String>,
}

impl RedisServer {
    /// Starts a plain server on a free loopback port and waits until it
    /// answers `PING`.
    ///
    /// # Panics
    ///
    /// With [`MISSING_REDIS`] when `redis-server` is not on `PATH`, or when it
    /// does not become ready within [`READY_TIMEOUT`] (the message names the
    /// port and includes the server's log).
    pub fn start() -> RedisServer {
        Self::start_with_args(&[])
    }

    /// Starts a server with extra `redis-server` arguments appended after the
    /// defaults (`--save '' --appendonly no --bind 127.0.0.1 --port N --dir D`),
    /// so they may override them, for instance
    /// `&["--user", "alice", "on", ">secret", "~*", "+@all"]` or
    /// `&["--replicaof", "127.0.0.1", &primary.port().to_string()]`.
    ///
    /// Every occurrence of `{port}` in an argument is replaced with the chosen
    /// port, for a TLS-only server: `&["--port", "0", "--tls-port", "{port}",
    /// ...]`. The server is ready once it logs `Ready to accept connections`
    /// and replies to a plain-text `PING` (any reply, even `-NOAUTH`, except
    /// `-LOADING`); with `--port 0` the log line alone counts.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with_args(args: &[&str]) -> RedisServer {
        Self::start_program(REDIS_SERVER, args)
    }

    /// As [`start_with_args`](Self::start_with_args), running `program`
    /// (a name looked up on `PATH`, or a path) instead of `redis-server`.
    ///
    /// # Panics
    ///
    /// With [`MISSING_REDIS`] when `program` cannot be found, and as
    /// [`start`](Self::start).
    pub fn start_program(program: &str, args: &[&str]) -> RedisServer {
        Self::start_inner(program, args, false)
    }

    /// Starts `count` sentinels on free loopback ports, sentinel `i` with
    /// `config(ports, i)` as its configuration file (`sentinel monitor ...`
    /// lines), and waits until each has read it (`Sentinel ID is ...` in its
    /// log) and answers `PING`. The ports are chosen before any starts, so
    /// that each configuration can name the others (`known-sentinel`); all
    /// are chosen again when one was taken meanwhile.
    ///
    /// # Panics
    ///
    /// When `redis-sentinel` is missing (the message names scripts/test,
    /// which installs it), and as [`start`](Self::start).
    pub fn start_sentinels(
        count: usize,
        config: impl Fn(&[u16], usize) -> String,
    ) -> Vec<RedisServer> {
        let mut last_failure = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let mut ports: Vec<u16> = Vec::with_capacity(count);
            while ports.len() < count {
                let port = crate::free_port();
                if !ports.contains(&port) {
                    ports.push(port);
                }
            }
            let mut started = Vec::with_capacity(count);
            for (i, &port) in ports.iter().enumerate() {
                match Self::try_start(REDIS_SENTINEL, &[], port, Some(&config(&ports, i))) {
                    Ok(server) => started.push(server),
                    Err(Failure::AddrInUse(log)) => {
                        last_failure = log;
                        break;
                    }
                    Err(Failure::Fatal(message)) => panic!("{message}"),
                }
            }
            if started.len() == count {
                return started;
            }
        }
        panic!(
            "redis-sentinel could not bind free ports in {PORT_ATTEMPTS} attempts; last log:\n{last_failure}"
        );
    }

    /// Starts a server on a free port, retrying with other ports when the
    /// chosen one (or its cluster bus port) was taken meanwhile.
    fn start_inner(program: &str, args: &[&str], cluster_bus: bool) -> RedisServer {
        let mut last_failure = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = if cluster_bus {
                free_cluster_port()
            } else {
                crate::free_port()
            };
            match Self::try_start(program, args, port, None) {
                Ok(server) => return server,
                Err(Failure::AddrInUse(log)) => last_failure = log,
                Err(Failure::Fatal(message)) => panic!("{message}"),
            }
        }
        panic!(
            "redis-server could not bind a free port in {PORT_ATTEMPTS} attempts; last log:\n{last_failure}"
        );
    }

    /// Starts `program` on `port` once, and waits until it answers.
    fn try_start(
        program: &str,
        args: &[&str],
        port: u16,
        sentinel_config: Option<&str>,
    ) -> Result<RedisServer, Failure> {
        let dir = tempfile::Builder::new()
            .prefix("redis-test-")
            .tempdir()
            .unwrap_or_else(|e| panic!("creating a temporary directory for redis: {e}"));
        let mut server = RedisServer {
            child: None,
            program: program.to_owned(),
            extra_args: args
                .iter()
                .map(|a| a.replace("{port}", &port.to_string()))
                .collect(),
            port,
            dir,
            sentinel_config: sentinel_config.map(str::to_owned),
        };
        server.spawn_and_wait().map(|()| server)
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's socket address, `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The server's URL, `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's process id, `None` while stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is running (started and not exited).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The server's data directory (removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything the server has written to stdout and stderr so far, across
    /// restarts.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Runs `redis-cli -h 127.0.0.1 -p PORT ARGS...` and returns its stdout,
    /// trimmed. Options go before the command, e.g.
    /// `&["--user", "alice", "--pass", "secret", "PING"]`. Error replies
    /// (`ERR ...`) are returned like any other reply.
    ///
    /// # Panics
    ///
    /// When `redis-cli` is missing ([`MISSING_REDIS`]), exits unsuccessfully
    /// (for instance because the server is stopped) or runs for more than
    /// 10 s.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }

    /// Sends one command (`args`, its name first) on a connection of its own
    /// and returns the reply as `T`. Much cheaper than [`cli`](Self::cli),
    /// which starts a process: for the checks a test makes at every step of
    /// a long loop.
    ///
    /// # Panics
    ///
    /// When the server cannot be reached within 10 s, answers with an
    /// error, or its reply is not a `T`.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let (name, rest) = args.split_first().expect("a command");
        let mut command = redis::cmd(name);
        for arg in rest {
            command.arg(*arg);
        }
        let reply = redis::Client::open(self.url())
            .and_then(|client| client.get_connection_with_timeout(CLI_TIMEOUT))
            .and_then(|mut connection| {
                connection.set_read_timeout(Some(CLI_TIMEOUT))?;
                command.query(&mut connection)
            });
        reply.unwrap_or_else(|e| panic!("{args:?} on port {}: {e}", self.port))
    }

    /// Runs `redis-cli -h 127.0.0.1 -p PORT ARGS...` with `commands`, one a
    /// line, on its standard input, and returns its stdout, trimmed: one
    /// reply a line. The commands share one connection, as `WAIT` needs
    /// (it waits for its own connection's writes only).
    ///
    /// # Panics
    ///
    /// As [`cli`](Self::cli).
    pub fn cli_commands(&self, args: &[&str], commands: &str) -> String {
        let mut input = tempfile::tempfile().expect("creating a temporary file");
        input
            .write_all(commands.as_bytes())
            .and_then(|()| input.seek(SeekFrom::Start(0)).map(drop))
            .expect("writing redis-cli's input");
        let mut command = Command::new(REDIS_CLI);
        command
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args);
        let output = run_bounded_with_input(&mut command, CLI_TIMEOUT, Stdio::from(input));
        assert!(
            output.status.success(),
            "redis-cli -p {} {args:?} with {commands:?} failed ({}):\nstdout: {}\nstderr: {}",
            self.port,
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Runs `redis-cli -h 127.0.0.1 -p PORT ARGS...` (killed after 10 s) and
    /// returns its full output, whatever its exit status.
    ///
    /// # Panics
    ///
    /// When `redis-cli` is missing ([`MISSING_REDIS`]) or runs for too long.
    pub fn cli_output(&self, args: &[&str]) -> Output {
        cli_output(self.port, args)
    }

    /// The replication offset `field` of `INFO replication`
    /// (`master_repl_offset`, or `slave_repl_offset` on a replica).
    ///
    /// # Panics
    ///
    /// When the field is missing.
    pub fn replication_offset(&self, field: &str) -> u64 {
        let info = self.cli(&["INFO", "replication"]);
        info.lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix(field)?
                    .strip_prefix(':')?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no {field} in INFO replication:\n{info}"))
    }

    /// Waits until `replica` has applied everything written on this master
    /// so far; returns how long that took. (`WAIT` from `redis-cli` would
    /// not do: it waits for its own connection's writes, and answers at once
    /// on one that wrote nothing.)
    ///
    /// # Panics
    ///
    /// When the replica has not caught up within 10 s.
    pub fn wait_replicated(&self, replica: &RedisServer) -> Duration {
        let written = self.replication_offset("master_repl_offset");
        let start = Instant::now();
        loop {
            if replica.replication_offset("slave_repl_offset") >= written {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the replica did not reach offset {written} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Suspends the process (`SIGSTOP`): it keeps its sockets open and
    /// answers nothing, as a hung server does, until [`thaw`](Self::thaw).
    ///
    /// # Panics
    ///
    /// When the server is not running or `kill` fails.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Resumes a process [`freeze`](Self::freeze) suspended (`SIGCONT`).
    ///
    /// # Panics
    ///
    /// When the server is not running or `kill` fails.
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.pid().expect("a running server").to_string();
        let output = run_bounded(Command::new("kill").args([signal, &pid]), CLI_TIMEOUT);
        assert!(output.status.success(), "kill {signal} {pid}: {output:?}");
    }

    /// Kills the server (`SIGKILL`, no shutdown: whatever it held in memory
    /// is lost) and reaps it. Does nothing when already stopped.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it is running, then starts it again on the same
    /// port with the same arguments and data directory, and waits until it
    /// answers. Data is lost (no persistence), except a cluster node's
    /// `nodes.conf`, so a restarted cluster node rejoins its cluster.
    ///
    /// # Panics
    ///
    /// When the server does not become ready within [`READY_TIMEOUT`], for
    /// instance because something else took its port meanwhile.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.spawn_and_wait() {
                Ok(()) => return,
                // Something briefly held the port: wait for it to go away.
                Err(Failure::AddrInUse(log)) => {
                    assert!(
                        Instant::now() < deadline,
                        "restarting redis-server: port {} stayed in use for {READY_TIMEOUT:?}; log:\n{log}",
                        self.port
                    );
                    sleep(Duration::from_millis(100));
                }
                Err(Failure::Fatal(message)) => panic!("restarting: {message}"),
            }
        }
    }

    fn log_path(&self) -> std::path::PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Spawns the process (which must not be running) and waits until it
    /// answers. On failure the process is killed.
    fn spawn_and_wait(&mut self) -> Result<(), Failure> {
        debug_assert!(self.child.is_none());
        let log_path = self.log_path();
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap_or_else(|e| panic!("opening {}: {e}", log_path.display()));
        let log_start = log.seek(SeekFrom::End(0)).unwrap_or(0);
        let log_err = log
            .try_clone()
            .unwrap_or_else(|e| panic!("duplicating the handle of {}: {e}", log_path.display()));
        let port = self.port.to_string();
        let mut command = Command::new(&self.program);
        if let Some(config) = &self.sentinel_config {
            // A sentinel takes its configuration file first, and rewrites it.
            let path = self.dir.path().join("sentinel.conf");
            if !path.exists() {
                std::fs::write(&path, config)
                    .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            }
            command.arg(path);
        }
        command
            .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .args(["--port", &port])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra_args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        self.child = Some(match command.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == ErrorKind::NotFound && self.sentinel_config.is_some() => {
                panic!("{MISSING_SENTINEL}")
            }
            Err(e) if e.kind() == ErrorKind::NotFound => panic!("{MISSING_REDIS}"),
            Err(e) => panic!("spawning {}: {e}", self.program),
        });

        let result = self.wait_ready(log_start);
        if result.is_err() {
            self.stop();
        }
        result
    }

    /// Polls until the server answers `PING` (or logs that it is ready), it
    /// exits, or [`READY_TIMEOUT`] passes.
    fn wait_ready(&mut self, log_start: u64) -> Result<(), Failure> {
        let start = Instant::now();
        let addr = self.addr();
        let tls_only = self
            .extra_args
            .windows(2)
            .any(|w| w[0] == "--port" && w[1] == "0");
        loop {
            let exited = match self.child.as_mut().map(Child::try_wait) {
                Some(Ok(Some(status))) => Some(status),
                _ => None,
            };
            if let Some(status) = exited {
                sleep(Duration::from_millis(20)); // Let the last log lines land.
                let log = self.log_since(log_start);
                return Err(if log.contains("Address already in use") {
                    Failure::AddrInUse(log)
                } else {
                    Failure::Fatal(format!(
                        "{} on port {} exited during startup ({status}); log:\n{log}",
                        self.program, self.port
                    ))
                });
            }
            // The log line comes from this process, whereas a PING could be
            // answered by whatever else took the port meanwhile. A sentinel
            // logs its id once it has read its configuration.
            let ready_line = if self.sentinel_config.is_some() {
                "Sentinel ID is"
            } else {
                "Ready to accept connections"
            };
            if self.log_since(log_start).contains(ready_line) && (tls_only || answers_ping(addr)) {
                return Ok(());
            }
            if start.elapsed() > READY_TIMEOUT {
                return Err(Failure::Fatal(format!(
                    "{} on port {} did not answer PING within {READY_TIMEOUT:?}; log:\n{}",
                    self.program,
                    self.port,
                    self.log_since(log_start)
                )));
            }
            sleep(Duration::from_millis(20));
        }
    }

    fn log_since(&self, offset: u64) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(self.log_path()) {
            let _ = file.seek(SeekFrom::Start(offset));
            let mut bytes = Vec::new();
            let _ = file.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why a start attempt failed.
enum Failure {
    /// The port (or cluster bus port) was taken: try again. Holds the log.
    AddrInUse(String),
    /// Anything else, with the panic message.
    Fatal(String),
}

/// Whether something on `addr` replies to a plain-text `PING` with a RESP
/// reply other than `-LOADING`.
fn answers_ping(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let timeout = Some(Duration::from_millis(500));
    if stream.set_read_timeout(timeout).is_err()
        || stream.set_write_timeout(timeout).is_err()
        || stream.write_all(b"PING\r\n").is_err()
    {
        return false;
    }
    let mut reply = [0_u8; 64];
    match stream.read(&mut reply) {
        Ok(n) if n > 0 => {
            let reply = &reply[..n];
            (reply[0] == b'+' || reply[0] == b'-') && !reply.starts_with(b"-LOADING")
        }
        _ => false,
    }
}

/// A free loopback port whose cluster bus port (port + 10000) is free too.
fn free_cluster_port() -> u16 {
    for _ in 0..1_000 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local address").port();
        let Some(bus) = port.checked_add(CLUSTER_BUS_OFFSET) else {
            continue;
        };
        if TcpListener::bind((Ipv4Addr::LOCALHOST, bus)).is_ok() {
            return port;
        }
    }
    panic!("found no free loopback port with a free cluster bus port (port + 10000)");
}

/// Runs `redis-cli -h 127.0.0.1 -p port args...`; see [`RedisServer::cli`].
fn cli(port: u16, args: &[&str]) -> String {
    let output = cli_output(port, args);
    assert!(
        output.status.success(),
        "redis-cli -p {port} {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Runs `redis-cli -h 127.0.0.1 -p port args...`, killed after 10 s.
fn cli_output(port: u16, args: &[&str]) -> Output {
    let mut command = Command::new(REDIS_CLI);
    command
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args);
    run_bounded(&mut command, CLI_TIMEOUT)
}

/// Runs `command` with stdin closed, killing it after `limit`; its stdout
/// and stderr go to anonymous temporary files, so it can never block on a
/// full pipe.
fn run_bounded(command: &mut Command, limit: Duration) -> Output {
    run_bounded_with_input(command, limit, Stdio::null())
}

/// As [`run_bounded`], `stdin` as the command's standard input.
fn run_bounded_with_input(command: &mut Command, limit: Duration, stdin: Stdio) -> Output {
    let mut stdout = tempfile::tempfile().expect("creating a temporary file");
    let mut stderr = tempfile::tempfile().expect("creating a temporary file");
    command
        .stdin(stdin)
        .stdout(stdout.try_clone().expect("duplicating a file handle"))
        .stderr(stderr.try_clone().expect("duplicating a file handle"));
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == ErrorKind::NotFound => panic!("{MISSING_REDIS}"),
        Err(e) => panic!("spawning {command:?}: {e}"),
    };
    let start = Instant::now();
    let status: ExitStatus = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{command:?} did not finish within {limit:?}; stdout: {}",
                    read_all(&mut stdout)
                );
            }
            Ok(None) => sleep(Duration::from_millis(5)),
            Err(e) => panic!("waiting for {command:?}: {e}"),
        }
    };
    let mut output = Output {
        status,
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    for (file, buffer) in [
        (&mut stdout, &mut output.stdout),
        (&mut stderr, &mut output.stderr),
    ] {
        file.seek(SeekFrom::Start(0)).expect("rewinding output");
        file.read_to_end(buffer).expect("reading output");
    }
    output
}

fn read_all(file: &mut File) -> String {
    let mut bytes = Vec::new();
    let _ = file.seek(SeekFrom::Start(0));
    let _ = file.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Calls `ready` every 50 ms until it answers `Ok`; once `limit` has
/// passed since `start`, panics with what `failure` makes of its last
/// answer.
pub(crate) fn poll_until<T>(
    start: Instant,
    limit: Duration,
    mut ready: impl FnMut() -> Result<(), T>,
    failure: impl FnOnce(T) -> String,
) {
    loop {
        match ready() {
            Ok(()) => return,
            Err(last) if start.elapsed() > limit => panic!("{}", failure(last)),
            Err(_) => sleep(Duration::from_millis(50)),
        }
    }
}

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag (the
/// part between the first `{` and the next `}`, if not empty) or of the
/// whole key, modulo 16384, as Redis (`CLUSTER KEYSLOT`) and redis-rs
/// compute it.
pub fn cluster_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % 16_384
}

/// A real Redis Cluster of three masters on 127.0.0.1 (and, from
/// [`start_with_replica`](RedisCluster::start_with_replica), a replica of the
/// first), every node in its own temporary directory; all killed when
/// dropped.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// `redis-cli`'s TLS arguments (`--tls --cacert ...`) for a TLS cluster,
    /// else none.
    cli_tls: Vec<String>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers, joins them with
    /// `redis-cli --cluster create ... --cluster-replicas 0`, and waits until
    /// every node reports `cluster_state:ok` with all 16384 slots assigned
    /// and three known nodes.
    ///
    /// # Panics
    ///
    /// With [`MISSING_REDIS`] when `redis-server` or `redis-cli` is missing,
    /// or when the cluster is not ready within [`CLUSTER_READY_TIMEOUT`].
    pub fn start() -> RedisCluster {
        Self::start_with(&CLUSTER_ARGS, Vec::new())
    }

    /// As [`start`](Self::start), every node speaking TLS only (clients and
    /// the cluster bus, `--tls-cluster yes`) with the server certificate of
    /// `certs`; the nodes announce their TLS ports, so [`urls`](Self::urls)
    /// are `rediss://` URLs. [`cli`](Self::cli) speaks TLS to them too
    /// (`RedisServer::cli` on a node does not).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_tls(certs: &Certificates) -> RedisCluster {
        let mut args: Vec<String> = CLUSTER_ARGS.iter().map(|a| (*a).to_owned()).collect();
        args.extend(certs.server_args());
        args.extend(["--tls-cluster".to_owned(), "yes".to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::start_with(&args, certs.cli_args())
    }

    /// As [`start`](Self::start), with a fourth node, `nodes()[3]`, that
    /// replicates the first master (`nodes()[0]`) and is in sync with it,
    /// for failovers (`CLUSTER FAILOVER TAKEOVER` on it promotes it at once).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start), and when the replica does not join and
    /// sync within [`CLUSTER_READY_TIMEOUT`].
    pub fn start_with_replica() -> RedisCluster {
        let mut cluster = Self::start_with(&CLUSTER_ARGS, Vec::new());
        let replica = RedisServer::start_inner(REDIS_SERVER, &CLUSTER_ARGS, true);
        let master_port = cluster.nodes[0].port().to_string();
        let master_id = cluster.cli(0, &["CLUSTER", "MYID"]);
        cluster.nodes.push(replica);
        let meet = cluster.cli(3, &["CLUSTER", "MEET", "127.0.0.1", &master_port]);
        assert_eq!(meet, "OK", "CLUSTER MEET");
        let start = Instant::now();
        loop {
            // The replica must know its master before it may follow it.
            let reply = cluster.cli(3, &["CLUSTER", "REPLICATE", &master_id]);
            if reply == "OK" {
                break;
            }
            assert!(
                start.elapsed() < CLUSTER_READY_TIMEOUT,
                "CLUSTER REPLICATE: {reply}"
            );
            sleep(Duration::from_millis(50));
        }
        loop {
            let replication = cluster.cli(3, &["INFO", "replication"]);
            if replication.contains("master_link_status:up") {
                break;
            }
            assert!(
                start.elapsed() < CLUSTER_READY_TIMEOUT,
                "the replica did not sync:\n{replication}"
            );
            sleep(Duration::from_millis(50));
        }
        cluster.wait_ready();
        cluster
    }

    fn start_with(args: &[&str], cli_tls: Vec<String>) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_inner(REDIS_SERVER, args, true))
            .collect();
        let cluster = RedisCluster { nodes, cli_tls };
        cluster.create();
        cluster.wait_ready();
        cluster
    }

    fn create(&self) {
        let mut command = Command::new(REDIS_CLI);
        command.args(&self.cli_tls);
        command.args(["--cluster", "create"]);
        for node in &self.nodes {
            command.arg(format!("127.0.0.1:{}", node.port()));
        }
        command.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let output = run_bounded(&mut command, CLUSTER_CREATE_TIMEOUT);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("All 16384 slots covered"),
            "{command:?} failed ({}):\nstdout: {stdout}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr),
        );
    }

    fn wait_ready(&self) {
        let expected_slots = format!("cluster_slots_assigned:{CLUSTER_SLOTS}");
        let expected_nodes = format!("cluster_known_nodes:{}", self.nodes.len());
        let infos = || -> Result<(), Vec<String>> {
            let infos: Vec<String> = (0..self.nodes.len())
                .map(|i| self.cli(i, &["CLUSTER", "INFO"]))
                .collect();
            let ready = infos.iter().all(|info| {
                let lines: Vec<&str> = info.lines().map(str::trim).collect();
                lines.contains(&"cluster_state:ok")
                    && lines.contains(&expected_slots.as_str())
                    && lines.contains(&expected_nodes.as_str())
            });
            if ready { Ok(()) } else { Err(infos) }
        };
        poll_until(Instant::now(), CLUSTER_READY_TIMEOUT, infos, |infos| {
            let report: Vec<String> = self
                .nodes
                .iter()
                .zip(&infos)
                .map(|(node, info)| {
                    format!(
                        "--- node 127.0.0.1:{}\nCLUSTER INFO:\n{info}\nlog:\n{}",
                        node.port(),
                        node.log()
                    )
                })
                .collect();
            format!(
                "redis cluster not ready (cluster_state:ok, 16384 slots, {} nodes) within {CLUSTER_READY_TIMEOUT:?}\n{}",
                self.nodes.len(),
                report.join("\n")
            )
        });
    }

    /// The nodes' URLs, `redis://127.0.0.1:port` each (`rediss://` on a
    /// [TLS cluster](Self::start_tls)).
    pub fn urls(&self) -> Vec<String> {
        let scheme = if self.cli_tls.is_empty() {
            "redis"
        } else {
            "rediss"
        };
        self.nodes
            .iter()
            .map(|node| format!("{scheme}://{}", node.addr()))
            .collect()
    }

    /// The nodes: the three masters, then the replica of a cluster
    /// [started with one](Self::start_with_replica).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node `index` (see [`nodes`](Self::nodes)), mutably, to stop or
    /// restart it; a restarted node keeps its `nodes.conf` and rejoins the
    /// cluster.
    ///
    /// # Panics
    ///
    /// When there is no node `index`.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// The index of the node that serves `slot`, from each node's own line
    /// (`myself`) of `CLUSTER NODES`.
    ///
    /// # Panics
    ///
    /// When no node claims `slot`, and as [`RedisServer::cli`].
    pub fn master_of(&self, slot: u16) -> usize {
        (0..self.nodes.len())
            .find(|&i| {
                let nodes = self.cli(i, &["CLUSTER", "NODES"]);
                let myself = nodes.lines().find(|l| l.contains("myself")).unwrap_or("");
                myself.split_whitespace().skip(8).any(|range| {
                    let (a, b) = range.split_once('-').unwrap_or((range, range));
                    match (a.parse::<u16>(), b.parse::<u16>()) {
                        (Ok(a), Ok(b)) => (a..=b).contains(&slot),
                        _ => false,
                    }
                })
            })
            .unwrap_or_else(|| panic!("no node of the cluster serves slot {slot}"))
    }

    /// Runs `redis-cli` against node `index` (see [`RedisServer::cli`]).
    /// Pass `-c` first to follow `MOVED`/`ASK` redirections:
    /// `cluster.cli(0, &["-c", "SET", "k", "v"])`.
    ///
    /// # Panics
    ///
    /// When `index` is not below 3, and as [`RedisServer::cli`].
    pub fn cli(&self, index: usize, args: &[&str]) -> String {
        let tls: Vec<&str> = self.cli_tls.iter().map(String::as_str).collect();
        cli(self.nodes[index].port, &[&tls[..], args].concat())
    }
}

/// A private CA and a server certificate it signed for 127.0.0.1 (PEM
/// files in a temporary directory, made with the `openssl` command, which
/// scripts/test installs), for TLS servers.
#[derive(Debug)]
pub struct Certificates {
    dir: TempDir,
}

impl Certificates {
    /// Writes `ca.crt`, `server.crt` and `server.key`, valid for a day.
    ///
    /// # Panics
    ///
    /// When `openssl` cannot be run (the message names scripts/test) or
    /// fails.
    pub fn make() -> Certificates {
        let dir = tempfile::Builder::new()
            .prefix("redis-tls-")
            .tempdir()
            .unwrap_or_else(|e| panic!("creating a temporary directory for certificates: {e}"));
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .unwrap_or_else(|e| {
                    panic!("openssl not runnable ({e}): run scripts/test, which installs it")
                });
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        std::fs::write(dir.path().join("san.ext"), "subjectAltName=IP:127.0.0.1\n")
            .unwrap_or_else(|e| panic!("writing san.ext: {e}"));
        let day = ["-days", "1"];
        run(&[
            &["req", "-x509", "-newkey", "rsa:2048", "-nodes"][..],
            &["-keyout", "ca.key"],
            &["-out", "ca.crt", "-subj", "/CN=ratelimit-test-ca"],
            &day,
        ]
        .concat());
        run(&[
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
            ][..],
            &["-out", "server.csr", "-subj", "/CN=127.0.0.1"],
        ]
        .concat());
        run(&[
            &["x509", "-req", "-in", "server.csr", "-CA", "ca.crt"][..],
            &["-CAkey", "ca.key", "-CAcreateserial", "-out", "server.crt"],
            &day,
            &["-extfile", "san.ext"],
        ]
        .concat());
        Certificates { dir }
    }

    /// The path of `name` in the certificates' directory.
    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().into_owned()
    }

    /// The CA's certificate, PEM.
    ///
    /// # Panics
    ///
    /// When it cannot be read.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.path("ca.crt")).unwrap_or_else(|e| panic!("reading ca.crt: {e}"))
    }

    /// `redis-server` arguments for a TLS-only server on `{port}` with the
    /// server certificate, not asking clients for one.
    pub fn server_args(&self) -> Vec<String> {
        let (cert, key, ca) = (
            self.path("server.crt"),
            self.path("server.key"),
            self.path("ca.crt"),
        );
        [
            "--port",
            "0",
            "--tls-port",
            "{port}",
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect()
    }

    /// `redis-cli` arguments to talk TLS to such a server.
    pub fn cli_args(&self) -> Vec<String> {
        vec![
            "--tls".to_owned(),
            "--cacert".to_owned(),
            self.path("ca.crt"),
        ]
    }
}
