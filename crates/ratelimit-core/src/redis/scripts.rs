//! The Lua scripts, assembled from the `.lua` files next to this module.

use std::borrow::Cow;
use std::sync::OnceLock;

use redis::aio::ConnectionLike;
use redis::{RedisError, Script};

use super::errors::is_noscript;
use super::prune::prune;
use super::replies::Arg;

use crate::policy::{Algorithm, AlgorithmKind};

/// The shared numbers and prelude, then each file `$file` in order (a file
/// may use what an earlier one defines).
macro_rules! after_prelude {
    ($($file:literal),*) => {
        concat!(
            include_str!("lua/numbers.lua"),
            "\n",
            include_str!("lua/prelude.lua"),
            $("\n", include_str!(concat!("lua/", $file)),)*
        )
    };
}

/// The prelude, then each of the helper files `$helper` in order, then the
/// entry point `$entry` of a script (after `eval.lua`).
macro_rules! assemble {
    ($($helper:literal),* ; $entry:literal) => {
        after_prelude!($($helper,)* "eval.lua", $entry)
    };
}

/// One decision under the algorithm of `$file` (its entry `$name` in
/// `ALGORITHMS`), with the helpers `$helper` it uses besides the prelude.
macro_rules! single {
    ($file:literal, $name:literal; $($helper:literal),*) => {
        concat!(
            assemble!($($helper,)* "blocks.lua", $file; "single.lua"),
            "\nreturn run_single(ALGORITHMS['",
            $name,
            "'], KEYS, ARGV)\n"
        )
    };
}

const FIXED_WINDOW: &str = single!("fixed_window.lua", "fixed-window"; "state.lua");
const SLIDING_LOG: &str = single!("sliding_log.lua", "sliding-log"; "state.lua", "members.lua");
const SLIDING_WINDOW: &str = single!("sliding_window.lua", "sliding-window"; "state.lua");
const TOKEN_BUCKET: &str = single!("token_bucket.lua", "token-bucket"; "state.lua");
const GCRA: &str = single!("gcra.lua", "gcra"; "state.lua", "tat.lua");
const LEAKY_BUCKET: &str = single!("leaky_bucket.lua", "leaky-bucket"; "state.lua", "tat.lua");
const CONCURRENCY: &str = single!("concurrency.lua", "concurrency"; "state.lua", "members.lua");

/// Every helper and every algorithm, followed by the entry point `$entry`
/// (a script, or `library.lua` with `$how` = `library`).
macro_rules! every_algorithm {
    ($entry:literal) => {
        every_algorithm!(assemble; $entry)
    };
    ($how:ident; $entry:literal) => {
        $how!(
            "state.lua",
            "members.lua",
            "blocks.lua",
            "tat.lua",
            "fixed_window.lua",
            "sliding_log.lua",
            "sliding_window.lua",
            "token_bucket.lua",
            "gcra.lua",
            "leaky_bucket.lua",
            "concurrency.lua";
            $entry
        )
    };
}

/// As `assemble!`, with the single and batch entry points instead of
/// `eval.lua`: the body of the Functions library.
macro_rules! library {
    ($($helper:literal),* ; $entry:literal) => {
        after_prelude!($($helper,)* "single.lua", "batch.lua", $entry)
    };
}

/// The Functions library without its header (see [`Library`]).
const LIBRARY_BODY: &str = every_algorithm!(library; "library.lua");

const MULTI: &str = every_algorithm!("multi.lua");

/// Several requests in one call (`batch.lua`), as a script: the fallback of
/// the library's batch function.
const BATCH: &str = concat!(
    every_algorithm!("batch.lua"),
    "\nreturn run_batch(KEYS, ARGV, 1)\n"
);

const ADMIN: &str = every_algorithm!("admin.lua");

const BLOCK: &str = every_algorithm!("block.lua");

const REFUND: &str = assemble!("members.lua", "sliding_log.lua", "concurrency.lua"; "refund.lua");

const RELEASE: &str = assemble!("members.lua", "concurrency.lua"; "release.lua");

const RENEW: &str = assemble!("members.lua", "concurrency.lua"; "renew.lua");

/// The source of every script, each pruned of the helpers it never calls
/// ([`prune`]), built once per process.
struct Sources {
    single: [String; 7],
    multi: String,
    batch: String,
    release: String,
    renew: String,
    admin: String,
    block: String,
    refund: String,
}

impl Sources {
    fn get() -> &'static Sources {
        static SOURCES: OnceLock<Sources> = OnceLock::new();
        SOURCES.get_or_init(|| Sources {
            single: [
                FIXED_WINDOW,
                SLIDING_LOG,
                SLIDING_WINDOW,
                TOKEN_BUCKET,
                GCRA,
                LEAKY_BUCKET,
                CONCURRENCY,
            ]
            .map(prune),
            multi: prune(MULTI),
            batch: prune(BATCH),
            release: prune(RELEASE),
            renew: prune(RENEW),
            admin: prune(ADMIN),
            block: prune(BLOCK),
            refund: prune(REFUND),
        })
    }
}

/// Every script with its SHA-1, computed once.
pub(super) struct Scripts {
    single: [(Script, &'static str); 7],
    multi: (Script, &'static str),
    batch: (Script, &'static str),
    release: (Script, &'static str),
    renew: (Script, &'static str),
    admin: (Script, &'static str),
    block: (Script, &'static str),
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    refund: (Script, &'static str),
}

fn script(source: &'static str) -> (Script, &'static str) {
    (Script::new(source), source)
}

impl Scripts {
    pub(super) fn new() -> Self {
        let sources = Sources::get();
        Scripts {
            single: sources.single.each_ref().map(|source| script(source)),
            multi: script(&sources.multi),
            batch: script(&sources.batch),
            release: script(&sources.release),
            renew: script(&sources.renew),
            admin: script(&sources.admin),
            block: script(&sources.block),
            refund: script(&sources.refund),
        }
    }

    pub(super) fn single(&self, algorithm: &Algorithm) -> (&Script, &'static str) {
        let (script, source) = &self.single[single_index(algorithm)];
        (script, source)
    }

    pub(super) fn single_source(algorithm: &Algorithm) -> &'static str {
        &Sources::get().single[single_index(algorithm)]
    }

    pub(super) fn multi(&self) -> (&Script, &'static str) {
        (&self.multi.0, self.multi.1)
    }

    /// Several requests in one call (`batch.lua`).
    pub(super) fn batch(&self) -> (&Script, &'static str) {
        (&self.batch.0, self.batch.1)
    }

    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    pub(super) fn refund(&self) -> (&Script, &'static str) {
        (&self.refund.0, self.refund.1)
    }

    pub(super) fn release(&self) -> (&Script, &'static str) {
        (&self.release.0, self.release.1)
    }

    /// The renewal of a concurrency permit's lease (`renew.lua`).
    pub(super) fn renew(&self) -> (&Script, &'static str) {
        (&self.renew.0, self.renew.1)
    }

    /// Penalties and rewards (`admin.lua`).
    pub(super) fn admin(&self) -> (&Script, &'static str) {
        (&self.admin.0, self.admin.1)
    }

    /// Blocks (`block.lua`).
    pub(super) fn block(&self) -> (&Script, &'static str) {
        (&self.block.0, self.block.1)
    }
}

/// The Redis Functions library (`library.lua`): a single decision of each
/// algorithm as a function. Its name and its functions' names carry the
/// first 16 hex digits of its SHA-1, so that stores of different versions
/// sharing a Redis load side by side and never replace each other's.
pub(super) struct Library {
    source: String,
    names: [String; 7],
    batch: String,
    #[cfg(feature = "redis-cluster")]
    master_batch: String,
}

impl Library {
    /// The library, built once per process.
    pub(super) fn get() -> &'static Library {
        static LIBRARY: OnceLock<Library> = OnceLock::new();
        LIBRARY.get_or_init(|| {
            let sha = Script::new(LIBRARY_BODY).get_hash().to_owned();
            let version = sha.get(..16).unwrap_or(&sha);
            let prefix = format!("ratelimit_{version}_");
            Library {
                source: format!(
                    "#!lua name=ratelimit_{version}\nlocal FUNCTION_PREFIX = '{prefix}'\n{LIBRARY_BODY}"
                ),
                names: AlgorithmKind::ALL.map(|kind| format!("{prefix}{}", kind.name().replace('-', "_"))),
                batch: format!("{prefix}batch"),
                #[cfg(feature = "redis-cluster")]
                master_batch: format!("{prefix}master_batch"),
            }
        })
    }

    /// The source, for `FUNCTION LOAD`.
    pub(super) fn source(&'static self) -> &'static str {
        &self.source
    }

    /// The function that decides one request under `algorithm`.
    pub(super) fn function(&'static self, algorithm: &Algorithm) -> &'static str {
        &self.names[single_index(algorithm)]
    }

    /// The function that decides several requests in one call (`batch.lua`).
    pub(super) fn batch(&'static self) -> &'static str {
        &self.batch
    }

    /// The function that decides the requests of several slots of one
    /// cluster master in one call (see `library.lua`).
    #[cfg(feature = "redis-cluster")]
    pub(super) fn master_batch(&'static self) -> &'static str {
        &self.master_batch
    }
}

/// The index of `algorithm`'s script and function: its place in
/// [`AlgorithmKind::ALL`], the order of the arrays above.
fn single_index(algorithm: &Algorithm) -> usize {
    // `ALL` lists the kinds in their declaration order (a test in
    // policy.rs checks it), so the discriminant is the place.
    algorithm.algorithm_kind() as usize
}

const ACL_PROBE: &str = include_str!("lua/acl_probe.lua");

/// The check, once per connection, that the Redis user may run every write
/// command the scripts use on the store's keys (`acl_probe.lua`): the scripts
/// themselves no longer ask on every call.
pub(super) struct AclProbe {
    script: Script,
    key: String,
}

impl AclProbe {
    /// The probe for keys under `prefix`.
    pub(super) fn new(prefix: &str) -> Self {
        Self::on_key(format!("{prefix}:acl-probe"))
    }

    /// The probe on `key` (on a cluster, one of the node's own slots).
    pub(super) fn on_key(key: String) -> Self {
        AclProbe {
            script: Script::new(ACL_PROBE),
            key,
        }
    }

    /// Runs the probe on `connection` (`EVALSHA`, then `EVAL` after
    /// `NOSCRIPT`): `NOPERM the rate limiter needs <command> on <key>` when a
    /// write command is denied.
    ///
    /// Not `Script::invoke_async`: after `NOSCRIPT` it sends `SCRIPT LOAD`,
    /// which the least-privileged ACL does not grant (see `Inner::eval`),
    /// and the probe runs on every new connection, so after every restart.
    pub(super) async fn run(&self, connection: &mut impl ConnectionLike) -> Result<(), RedisError> {
        let keys = std::slice::from_ref(&self.key);
        let evalsha = invocation("EVALSHA", self.script.get_hash(), keys, &[]);
        match evalsha.query_async::<redis::Value>(connection).await {
            Err(e) if is_noscript(&e) => {
                let eval = invocation("EVAL", ACL_PROBE, keys, &[]);
                eval.query_async::<redis::Value>(connection)
                    .await
                    .map(|_| ())
            }
            other => other.map(|_| ()),
        }
    }
}

/// The keys of one call, written into its command as they are.
pub(super) trait CallKeys: Sync {
    /// How many keys.
    fn count(&self) -> usize;
    /// Their summed length in bytes.
    fn size(&self) -> usize;
    /// Writes each key as an argument of `cmd`.
    fn write_to(&self, cmd: &mut redis::Cmd);
    /// Writes each key as a bulk string of a packed command.
    #[cfg(feature = "redis-cluster")]
    fn pack(&self, out: &mut Vec<u8>);
    /// The hash slot of the first key.
    fn first_slot(&self) -> Option<u16>;
}

impl CallKeys for [String] {
    fn count(&self) -> usize {
        self.len()
    }

    fn size(&self) -> usize {
        self.iter().map(String::len).sum()
    }

    fn write_to(&self, cmd: &mut redis::Cmd) {
        for key in self {
            cmd.arg(key.as_str());
        }
    }

    #[cfg(feature = "redis-cluster")]
    fn pack(&self, out: &mut Vec<u8>) {
        for key in self {
            bulk(out, key.as_bytes());
        }
    }

    fn first_slot(&self) -> Option<u16> {
        self.first()
            .map(|key| crate::key::cluster_slot(key.as_bytes()))
    }
}

/// The state keys of a batch's requests, in order, written into its command
/// from the requests themselves (an admin block lives in its state key: no
/// other key is read).
pub(super) struct StateKeys<I>(pub(super) I);

impl<'a, I: Iterator<Item = &'a String> + Clone + Sync> CallKeys for StateKeys<I> {
    fn count(&self) -> usize {
        self.0.clone().count()
    }

    fn size(&self) -> usize {
        self.0.clone().map(String::len).sum()
    }

    fn write_to(&self, cmd: &mut redis::Cmd) {
        for state in self.0.clone() {
            cmd.arg(state.as_str());
        }
    }

    #[cfg(feature = "redis-cluster")]
    fn pack(&self, out: &mut Vec<u8>) {
        for state in self.0.clone() {
            bulk(out, state.as_bytes());
        }
    }

    fn first_slot(&self) -> Option<u16> {
        self.0
            .clone()
            .next()
            .map(|key| crate::key::cluster_slot(key.as_bytes()))
    }
}

/// A command as the store's paths need it: as redis-rs's `Cmd` where
/// redis-rs sends it, packed straight into the write buffer of a
/// connection of the store's own (`wire`), and its hash slot, for the
/// cluster's direct path.
pub(super) trait Command: Sync {
    /// The command as redis-rs's `Cmd`.
    fn cmd(&self) -> Cow<'_, redis::Cmd>;
    /// Appends the command to `out` as the protocol writes it.
    #[cfg(feature = "redis-cluster")]
    fn pack(&self, out: &mut Vec<u8>);
    /// The hash slot of a script call's first key: `FCALL`, `FCALL_RO`,
    /// `EVALSHA` or `EVAL` with at least one key (a call's keys share one
    /// slot, or the node refuses it with `CROSSSLOT`, as it would through
    /// the cluster client).
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    fn slot(&self) -> Option<u16>;
}

/// The verbs of a script call, whose first key gives its slot.
const SCRIPT_CALLS: [&str; 4] = ["FCALL", "FCALL_RO", "EVALSHA", "EVAL"];

impl Command for redis::Cmd {
    fn cmd(&self) -> Cow<'_, redis::Cmd> {
        Cow::Borrowed(self)
    }

    #[cfg(feature = "redis-cluster")]
    fn pack(&self, out: &mut Vec<u8>) {
        self.write_packed_command(out);
    }

    fn slot(&self) -> Option<u16> {
        let mut args = self.args_iter().map(|arg| match arg {
            redis::Arg::Simple(bytes) => Some(bytes),
            _ => None,
        });
        let verb = args.next()??;
        if !SCRIPT_CALLS
            .iter()
            .any(|n| verb.eq_ignore_ascii_case(n.as_bytes()))
        {
            return None;
        }
        let _name = args.next()??;
        let keys = std::str::from_utf8(args.next()??).ok()?;
        if keys.parse::<u32>().ok()? == 0 {
            return None;
        }
        Some(crate::key::cluster_slot(args.next()??))
    }
}

/// `<verb> <name> <number of keys> <keys...> <args...>`, not written until a
/// path needs it (see [`invocation`]): packed straight into a connection's
/// buffer, or built as a `Cmd` for redis-rs.
pub(super) struct Invocation<'a, K: ?Sized> {
    verb: &'static str,
    name: &'a str,
    keys: &'a K,
    args: &'a [Arg<'a>],
}

impl<'a, K: CallKeys + ?Sized> Invocation<'a, K> {
    pub(super) fn new(verb: &'static str, name: &'a str, keys: &'a K, args: &'a [Arg<'a>]) -> Self {
        Invocation {
            verb,
            name,
            keys,
            args,
        }
    }
}

impl<K: CallKeys + ?Sized> Command for Invocation<'_, K> {
    fn cmd(&self) -> Cow<'_, redis::Cmd> {
        Cow::Owned(invocation(self.verb, self.name, self.keys, self.args))
    }

    #[cfg(feature = "redis-cluster")]
    fn pack(&self, out: &mut Vec<u8>) {
        let keys = self.keys.count();
        let size = self.args.iter().fold(
            self.verb.len() + self.name.len() + self.keys.size() + 16 * (4 + keys),
            |size, arg| {
                size + 16
                    + match arg {
                        Arg::Int(_) => 20,
                        Arg::Str(s) => s.len(),
                        Arg::Owned(s) => s.len(),
                    }
            },
        );
        out.reserve(size);
        header(out, b'*', 3 + keys + self.args.len());
        bulk(out, self.verb.as_bytes());
        bulk(out, self.name.as_bytes());
        bulk_number(out, keys as u64);
        self.keys.pack(out);
        for arg in self.args {
            match arg {
                Arg::Int(n) => bulk_number(out, *n),
                Arg::Str(s) => bulk(out, s.as_bytes()),
                Arg::Owned(s) => bulk(out, s.as_bytes()),
            }
        }
    }

    fn slot(&self) -> Option<u16> {
        if !SCRIPT_CALLS.contains(&self.verb) {
            return None;
        }
        self.keys.first_slot()
    }
}

#[cfg(feature = "redis-cluster")]
/// Appends `<kind><n>\r\n`.
#[inline]
fn header(out: &mut Vec<u8>, kind: u8, n: usize) {
    // Below 100 (a command's argument counts, the lengths of most of its
    // arguments), in one small copy; `n / 10` and `n % 10` fit a byte.
    #[allow(clippy::cast_possible_truncation)]
    if n < 10 {
        out.extend_from_slice(&[kind, b'0' + n as u8, b'\r', b'\n']);
    } else if n < 100 {
        out.extend_from_slice(&[
            kind,
            b'0' + (n / 10) as u8,
            b'0' + (n % 10) as u8,
            b'\r',
            b'\n',
        ]);
    } else {
        let mut buffer = [0u8; 20];
        out.push(kind);
        out.extend_from_slice(decimal(&mut buffer, n as u64));
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(feature = "redis-cluster")]
/// Appends `bytes` as a bulk string.
#[inline]
fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    header(out, b'$', bytes.len());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

#[cfg(feature = "redis-cluster")]
/// Appends `n`, in decimal, as a bulk string (as redis-rs writes a number).
#[inline]
fn bulk_number(out: &mut Vec<u8>, n: u64) {
    let mut buffer = [0u8; 20];
    bulk(out, decimal(&mut buffer, n));
}

#[cfg(feature = "redis-cluster")]
/// `n` in decimal, written at the end of `buffer`, two digits at a time.
#[inline]
fn decimal(buffer: &mut [u8; 20], mut n: u64) -> &[u8] {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let mut at = buffer.len();
    while n >= 100 {
        // Below 100.
        #[allow(clippy::cast_possible_truncation)]
        let pair = usize::from((n % 100) as u8) * 2;
        n /= 100;
        at -= 2;
        buffer[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    // Below 100.
    #[allow(clippy::cast_possible_truncation)]
    let last = n as u8;
    if last < 10 {
        at -= 1;
        buffer[at] = b'0' + last;
    } else {
        let pair = usize::from(last) * 2;
        at -= 2;
        buffer[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    &buffer[at..]
}

/// The command `<verb> <name> <number of keys> <keys...> <args...>`: `EVALSHA`
/// of a script's SHA-1, `EVAL` of its source, or `FCALL` of a function.
pub(super) fn invocation<K: CallKeys + ?Sized>(
    verb: &str,
    name: &str,
    keys: &K,
    args: &[Arg<'_>],
) -> redis::Cmd {
    // Sized once: a batch's command grew by doubling, copied each time.
    let size = args.iter().fold(verb.len() + name.len() + 20, |size, arg| {
        size + match arg {
            Arg::Int(_) => 20,
            Arg::Str(s) => s.len(),
            Arg::Owned(s) => s.len(),
        }
    });
    let mut cmd = redis::Cmd::with_capacity(3 + keys.count() + args.len(), size + keys.size());
    cmd.arg(verb).arg(name).arg(keys.count());
    keys.write_to(&mut cmd);
    for arg in args {
        match arg {
            Arg::Int(n) => cmd.arg(*n),
            Arg::Str(s) => cmd.arg(*s),
            Arg::Owned(s) => cmd.arg(s.as_str()),
        };
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command packed straight into a buffer is the bytes redis-rs writes
    /// for the same `Cmd`, and has the slot redis-rs's `Cmd` gives.
    #[test]
    fn an_invocation_packs_as_redis_rs_writes_it() {
        let keys = [
            "rl:api:{user-1}".to_owned(),
            String::new(),
            "é\r\n".to_owned(),
        ];
        let owned = u64::MAX.to_string();
        let args = [
            Arg::Int(0),
            Arg::Int(9),
            Arg::Int(10),
            Arg::Int(99),
            Arg::Int(100),
            Arg::Int(1_234_567_890),
            Arg::Int(u64::MAX),
            Arg::Str(""),
            Arg::Str("gcra"),
            Arg::Owned(owned),
        ];
        for verb in ["FCALL", "EVALSHA", "EVAL", "GET"] {
            for (keys, args) in [
                (&keys[..], &args[..]),
                (&keys[..1], &args[..3]),
                (&keys[..0], &args[..0]),
            ] {
                let call = Invocation::new(verb, "ratelimit_gcra", keys, args);
                let cmd = invocation(verb, "ratelimit_gcra", keys, args);
                assert_eq!(call.cmd().get_packed_command(), cmd.get_packed_command());
                #[cfg(feature = "redis-cluster")]
                {
                    let mut packed = b"before".to_vec();
                    call.pack(&mut packed);
                    assert_eq!(&packed[..6], b"before");
                    assert_eq!(&packed[6..], &cmd.get_packed_command()[..]);
                }
                assert_eq!(call.slot(), Command::slot(&cmd), "{verb} {keys:?}");
            }
        }
        #[cfg(feature = "redis-cluster")]
        for n in (0..100_000).chain([u64::MAX, u64::MAX / 7, 10u64.pow(19), 10u64.pow(19) - 1]) {
            let mut buffer = [0u8; 20];
            assert_eq!(decimal(&mut buffer, n), n.to_string().as_bytes());
        }
        let call = Invocation::new("FCALL", "f", &keys[..1], &[]);
        assert_eq!(call.slot(), Some(crate::key::cluster_slot(b"user-1")));
    }
}
