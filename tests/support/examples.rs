//! The example binaries of `ratelimit-examples`: built once, spawned with
//! their output read, killed when the test drops them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::{ChildGuard, free_port};

/// How `clap` ends every error about the examples' flags (after the message
/// naming the flag, and sometimes the usage line); they exit with status 2.
pub const CLAP_FOOTER: &str = "For more information, try '--help'.";

/// Where `scripts/test` says the examples are, built by the same `cargo
/// test --workspace` run as the tests: a second build of them here (for the
/// host target, in a directory of its own) would build every dependency
/// again.
const EXAMPLES_DIR: &str = "RATELIMIT_EXAMPLES_DIR";

/// The executable of the example `name` of the `ratelimit-examples`
/// package: in `RATELIMIT_EXAMPLES_DIR` when that is set, else built here,
/// once per test binary and example (cargo is asked again only for an
/// example not built yet), so that a test run on its own runs the example
/// as it is now.
pub fn example_binary(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os(EXAMPLES_DIR) {
        let path = PathBuf::from(dir).join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
        assert!(
            path.is_file(),
            "{EXAMPLES_DIR} is set but has no example {name}: {}",
            path.display()
        );
        return path;
    }
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(path) = built.get(name) {
        return path.clone();
    }
    let run = escargot::CargoBuild::new()
        .package("ratelimit-examples")
        .example(name)
        .current_target()
        .run()
        .unwrap_or_else(|e| panic!("building example {name}: {e}"));
    let path = run.path().to_path_buf();
    built.insert(name.to_owned(), path.clone());
    path
}

/// The example `name` with `args`, no stdin, stderr shown with the test's.
fn command(name: &str, args: &[&str], stdout: Stdio) -> Command {
    let mut command = Command::new(example_binary(name));
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::inherit());
    command
}

/// Spawns the example `name` with `args` and extra environment.
pub fn spawn_example(name: &str, args: &[&str], env: &[(&str, &str)]) -> ChildGuard {
    let mut command = command(name, args, Stdio::null());
    command.envs(env.iter().copied());
    ChildGuard::spawn(&mut command).unwrap_or_else(|e| panic!("spawning example {name}: {e}"))
}

/// How long an example may take to refuse its flags.
const REFUSAL_LIMIT: Duration = Duration::from_secs(30);

/// Runs the example `name` with `args`, which its flags refuse, and asserts
/// how: status 2, nothing on stdout, and on stderr `expected` (what names
/// the flag at fault) and clap's [`CLAP_FOOTER`]. An example still running
/// after 30 s accepted the flags: killed, and the assertion fails.
pub fn assert_refuses_flags(name: &str, args: &[&str], expected: &str) {
    use std::io::Read;
    let mut command = command(name, args, Stdio::piped());
    command.stderr(Stdio::piped());
    let mut child =
        ChildGuard::spawn(&mut command).unwrap_or_else(|e| panic!("running example {name}: {e}"));
    let deadline = Instant::now() + REFUSAL_LIMIT;
    let status = loop {
        if let Some(status) = child.child().try_wait().expect("the example's status") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "{name} {args:?} still runs after {REFUSAL_LIMIT:?}: it accepted the flags"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let process = child.child();
    if let Some(mut pipe) = process.stdout.take() {
        pipe.read_to_string(&mut stdout)
            .expect("the example's stdout");
    }
    if let Some(mut pipe) = process.stderr.take() {
        pipe.read_to_string(&mut stderr)
            .expect("the example's stderr");
    }
    assert_eq!(status.code(), Some(2), "{name} {args:?}: {stderr}");
    assert!(
        stderr.contains(expected),
        "{name} {args:?}: {expected:?} in {stderr}"
    );
    assert!(stderr.contains(CLAP_FOOTER), "{name} {args:?}: {stderr}");
    assert!(
        stdout.is_empty(),
        "{name} {args:?}: nothing on stdout: {stdout}"
    );
}

/// Spawns the example `name` with `args` and stdout piped, and returns it
/// with the first `lines` lines it printed there, waiting at most `limit`
/// for them (the example is killed when the guard drops).
pub fn spawn_example_lines(
    name: &str,
    args: &[&str],
    lines: usize,
    limit: Duration,
) -> (ChildGuard, Vec<String>) {
    spawn_lines(
        command(name, args, Stdio::piped()),
        name,
        args,
        lines,
        limit,
    )
}

/// [`spawn_example_lines`] of a command already made.
fn spawn_lines(
    mut command: Command,
    name: &str,
    args: &[&str],
    lines: usize,
    limit: Duration,
) -> (ChildGuard, Vec<String>) {
    use std::io::{BufRead, BufReader};
    let mut child =
        ChildGuard::spawn(&mut command).unwrap_or_else(|e| panic!("spawning example {name}: {e}"));
    let stdout = child.child().stdout.take().expect("piped stdout");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        for _ in 0..lines {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if sender.send(line.trim_end().to_owned()).is_err() {
                        break;
                    }
                }
            }
        }
        // Keep reading, so the example never writes into a closed pipe.
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    let deadline = Instant::now() + limit;
    let mut printed = Vec::with_capacity(lines);
    while printed.len() < lines {
        let left = deadline.saturating_duration_since(Instant::now());
        match receiver.recv_timeout(left) {
            Ok(line) => printed.push(line),
            Err(_) => panic!(
                "example {name} {args:?} printed {printed:?}, not {lines} lines, within {limit:?}"
            ),
        }
    }
    (child, printed)
}

/// An example serving HTTP on a free loopback port, killed when dropped.
#[derive(Debug)]
pub struct Listening {
    _process: ChildGuard,
    /// `http://127.0.0.1:PORT`, where it serves.
    pub base: String,
}

/// Spawns the example `name` with `--listen 127.0.0.1:PORT` (a free port)
/// and then `args`, and waits at most `limit` for the line it prints once
/// bound, `listening on http://127.0.0.1:PORT`.
pub fn spawn_listening(name: &str, args: &[&str], limit: Duration) -> Listening {
    spawn_listening_with_env(name, args, &[], limit)
}

/// [`spawn_listening`] with `env` added to the example's environment.
pub fn spawn_listening_with_env(
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> Listening {
    let listen = format!("127.0.0.1:{}", free_port());
    let all: Vec<&str> = ["--listen", listen.as_str()]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let mut command = command(name, &all, Stdio::piped());
    command.envs(env.iter().copied());
    let (process, lines) = spawn_lines(command, name, &all, 1, limit);
    assert_eq!(
        lines[0],
        format!("listening on http://{listen}"),
        "the first line of {name} {args:?}"
    );
    Listening {
        _process: process,
        base: format!("http://{listen}"),
    }
}

/// Spawns the example `name`, which takes no flags, with `PORT` set to a
/// free port, and waits at most `limit` for the line it prints once bound,
/// `listening on http://127.0.0.1:PORT`.
pub fn spawn_on_env_port(name: &str, limit: Duration) -> Listening {
    let port = free_port().to_string();
    let mut command = command(name, &[], Stdio::piped());
    command.env("PORT", &port);
    let (process, lines) = spawn_lines(command, name, &[], 1, limit);
    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(
        lines[0],
        format!("listening on {base}"),
        "the first line of {name}"
    );
    Listening {
        _process: process,
        base,
    }
}

/// The flags of a command line written as one string, split at white space:
/// `flags("--limit 20 --window 1d")`.
pub fn flags(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}
