//! The Lua scripts, assembled from the `.lua` files next to this module.

use std::borrow::Cow;
use std::sync::OnceLock;

use redis::aio::ConnectionLike;
#[cfg(feature = "redis-cluster")]
use redis::cluster_routing::Slot;
use redis::{RedisError, Script};

use super::errors::is_noscript;
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

const FIXED_WINDOW: &str = single!("fixed_window.lua", "fixed-window"; "state.lua", "calendar.lua");
const SLIDING_LOG: &str = single!("sliding_log.lua", "sliding-log"; "state.lua", "members.lua");
const SLIDING_WINDOW: &str = single!("sliding_window.lua", "sliding-window"; "state.lua");
const TOKEN_BUCKET: &str = single!("token_bucket.lua", "token-bucket"; "state.lua");
const GCRA: &str = single!("gcra.lua", "gcra"; "state.lua", "tat.lua");
const LEAKY_BUCKET: &str = single!("leaky_bucket.lua", "leaky-bucket"; "state.lua", "tat.lua");
const CONCURRENCY: &str = single!("concurrency.lua", "concurrency"; "state.lua", "members.lua");

/// Every helper and every algorithm, then the helpers `$extra` (before
/// `=>`), followed by the entry point `$entry` (a script, or `library.lua`
/// with `$how` = `library`).
macro_rules! every_algorithm {
    ($entry:literal) => {
        every_algorithm!(assemble; => $entry)
    };
    ($($extra:literal),+ => $entry:literal) => {
        every_algorithm!(assemble; $($extra),+ => $entry)
    };
    ($how:ident; $entry:literal) => {
        every_algorithm!($how; => $entry)
    };
    ($how:ident; $($extra:literal),* => $entry:literal) => {
        $how!(
            "state.lua",
            "members.lua",
            "blocks.lua",
            "tat.lua",
            "calendar.lua",
            "fixed_window.lua",
            "sliding_log.lua",
            "sliding_window.lua",
            "token_bucket.lua",
            "gcra.lua",
            "leaky_bucket.lua",
            "concurrency.lua"
            $(, $extra)*;
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
    "\nreturn run_batch(KEYS, ARGV)\n"
);

/// The calendar arithmetic alone (`calendar.lua` after `numbers.lua`), for
/// tests that compare it with Rust's.
#[cfg(ratelimit_test_hooks)]
pub(super) const CALENDAR: &str = concat!(
    include_str!("lua/numbers.lua"),
    "\n",
    include_str!("lua/calendar.lua"),
);

const ADMIN: &str = every_algorithm!("adjust.lua" => "admin.lua");

const SETTLE: &str = every_algorithm!("adjust.lua" => "settle.lua");

const BLOCK: &str = every_algorithm!("block.lua");

const REFUND: &str = assemble!("members.lua", "sliding_log.lua", "concurrency.lua"; "refund.lua");

const RELEASE: &str = assemble!("members.lua", "concurrency.lua"; "release.lua");

const RENEW: &str = assemble!("members.lua", "concurrency.lua"; "renew.lua");

/// Every source the store sends, by name: the Functions library as it is
/// loaded, each script, and the ACL probe.
#[cfg(test)]
pub(super) fn every_source() -> Vec<(&'static str, String)> {
    let names = AlgorithmKind::ALL.map(AlgorithmKind::name);
    let mut sources: Vec<(&'static str, String)> = names
        .into_iter()
        .zip(SINGLE)
        .map(|(name, source)| (name, source.to_owned()))
        .collect();
    sources.push(("library.lua", Library::get().source().to_owned()));
    for (name, source) in [
        ("multi.lua", MULTI),
        ("batch.lua", BATCH),
        ("admin.lua", ADMIN),
        ("settle.lua", SETTLE),
        ("block.lua", BLOCK),
        ("refund.lua", REFUND),
        ("release.lua", RELEASE),
        ("renew.lua", RENEW),
        ("acl_probe.lua", ACL_PROBE),
    ] {
        sources.push((name, source.to_owned()));
    }
    sources
}

/// Every script with its SHA-1, computed once per store.
pub(super) struct Scripts {
    single: [(Script, &'static str); 7],
    other: [(Script, &'static str); 8],
}

/// A script besides the single decisions, by what it does.
#[derive(Clone, Copy, Debug)]
pub(super) enum Named {
    /// Every limit of a request in one call (`multi.lua`).
    Multi,
    /// Several requests in one call (`batch.lua`).
    Batch,
    /// The return of a concurrency permit (`release.lua`).
    Release,
    /// The renewal of a concurrency permit's lease (`renew.lua`).
    Renew,
    /// Penalties and rewards (`admin.lua`).
    Admin,
    /// Settlements of every limit of a request (`settle.lua`).
    Settle,
    /// Blocks (`block.lua`).
    Block,
    /// A refund of what a decision consumed (`refund.lua`).
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    Refund,
}

/// The source of each [`Named`] script, in the order of its variants.
const OTHER: [&str; 8] = [MULTI, BATCH, RELEASE, RENEW, ADMIN, SETTLE, BLOCK, REFUND];

/// The source of each algorithm's single decision, in the order of
/// [`AlgorithmKind::ALL`].
const SINGLE: [&str; 7] = [
    FIXED_WINDOW,
    SLIDING_LOG,
    SLIDING_WINDOW,
    TOKEN_BUCKET,
    GCRA,
    LEAKY_BUCKET,
    CONCURRENCY,
];

fn script(source: &'static str) -> (Script, &'static str) {
    (Script::new(source), source)
}

impl Scripts {
    pub(super) fn new() -> Self {
        Scripts {
            single: SINGLE.map(script),
            other: OTHER.map(script),
        }
    }

    pub(super) fn single(&self, algorithm: &Algorithm) -> (&Script, &'static str) {
        let (script, source) = &self.single[single_index(algorithm)];
        (script, source)
    }

    pub(super) fn single_source(algorithm: &Algorithm) -> &'static str {
        SINGLE[single_index(algorithm)]
    }

    /// The script that does `what`, with its source.
    pub(super) fn get(&self, what: Named) -> (&Script, &'static str) {
        let (script, source) = &self.other[what as usize];
        (script, source)
    }
}

/// The Redis Functions library (`library.lua`): a single decision of each
/// algorithm as a function. Its name and its functions' names carry the
/// first 16 hex digits of its SHA-1, so that stores of different versions
/// sharing a Redis load side by side and never replace each other's.
pub(super) struct Library {
    source: String,
    names: [String; 7],
    /// Read by a cluster's pipelines only.
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    text: [String; 7],
    batch: String,
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
                text: AlgorithmKind::ALL
                    .map(|kind| format!("{prefix}text_{}", kind.name().replace('-', "_"))),
                batch: format!("{prefix}batch"),
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

    /// The function that decides one request under `algorithm` as
    /// [`function`](Self::function) does, its reply one line of text (see
    /// `single.lua`, and [`text_fields`](super::replies::text_fields)).
    #[cfg(feature = "redis-cluster")]
    pub(super) fn text(&'static self, algorithm: &Algorithm) -> &'static str {
        &self.text[single_index(algorithm)]
    }

    /// The function that decides several requests in one call (`batch.lua`).
    pub(super) fn batch(&'static self) -> &'static str {
        &self.batch
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
        AclProbe {
            script: Script::new(ACL_PROBE),
            key: format!("{prefix}:acl-probe"),
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
    /// On a Redis Cluster, where the call goes: the master of its first
    /// key's hash slot (every key of a call is in that slot).
    #[cfg(feature = "redis-cluster")]
    fn slot(&self) -> Option<Slot>;
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
    fn slot(&self) -> Option<Slot> {
        <[String]>::first(self).map(Slot::for_key)
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
    fn slot(&self) -> Option<Slot> {
        self.0.clone().next().map(Slot::for_key)
    }
}

/// A command as the store sends it: redis-rs's `Cmd`, and, for a script
/// call on keys, where it goes on a cluster.
pub(super) trait Command: Sync {
    /// The command as redis-rs's `Cmd`.
    fn cmd(&self) -> Cow<'_, redis::Cmd>;
    /// A script call's (`FCALL`, `EVALSHA`, `EVAL`) hash slot on a cluster,
    /// whose master runs it. `None` for any other command, which redis-rs
    /// routes itself.
    #[cfg(feature = "redis-cluster")]
    fn slot(&self) -> Option<Slot> {
        None
    }
}

impl Command for redis::Cmd {
    fn cmd(&self) -> Cow<'_, redis::Cmd> {
        Cow::Borrowed(self)
    }
}

/// `<verb> <name> <number of keys> <keys...> <args...>`, built as a `Cmd`
/// when it is sent (once, or once more when a cluster redirects it).
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
    fn slot(&self) -> Option<Slot> {
        self.keys.slot()
    }
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
