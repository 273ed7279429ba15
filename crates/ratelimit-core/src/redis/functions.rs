//! Single decisions by Redis Functions (`FCALL`, Redis 7 and later), with
//! scripts (`EVALSHA`) where functions cannot be used.
//!
//! A script defines every helper it uses again on every call; a function
//! library defines them once per load. The store loads the library
//! ([`Library`]) the first time a function is missing, which also covers a
//! restart, a failover, `FUNCTION FLUSH` and a new cluster node: the call
//! that meets `Function not found` loads it (`FUNCTION LOAD`, on every master
//! of a cluster) and is retried once. Where Redis has no functions (before
//! 7) or the Redis user may not run `FCALL` or `FUNCTION LOAD`, the store
//! switches to scripts for the rest of its life, after one try.

use std::sync::atomic::{AtomicU8, Ordering};

use redis::{RedisError, Script, Value};
use tokio::time::Instant as Deadline;

use super::scripts::{CallKeys, Invocation, Library, Named};
use super::unclaimed::Via;
use super::{Arg, Inner};
use crate::StoreError;
use crate::policy::Algorithm;

/// Whether a store decides by functions: not known yet (try), or never.
#[derive(Default)]
pub(super) struct Mode(AtomicU8);

const TRY: u8 = 0;
const NEVER: u8 = 1;

impl Inner {
    /// One decision under `algorithm`: `FCALL` of its function, or its
    /// script where functions cannot be used, on the connection `via` says.
    pub(super) async fn decide<K: CallKeys + ?Sized>(
        &self,
        algorithm: &Algorithm,
        keys: &K,
        args: &[Arg<'_>],
        via: Via<'_>,
    ) -> Result<Value, StoreError> {
        let library = Library::get();
        let script = Some(self.scripts.single(algorithm));
        let function = library.function(algorithm);
        scripted(self.call(function, script, keys, args, via).await)
    }

    /// Several requests in one call (`batch.lua`): `FCALL` of the library's
    /// batch function, or its script where functions cannot be used. (A
    /// cluster's batches go in pipelines: see `masters`.)
    pub(super) async fn decide_batch<K: CallKeys + ?Sized>(
        &self,
        keys: &K,
        args: &[Arg<'_>],
        via: Via<'_>,
    ) -> Result<Value, StoreError> {
        let library = Library::get();
        let script = Some(self.scripts.get(Named::Batch));
        let function = library.batch();
        scripted(self.call(function, script, keys, args, via).await)
    }

    /// `FCALL` of `function`, loading the library once when it is missing,
    /// or `script` where functions cannot be used: `None` then when there is
    /// no `script` (see [`scripted`] for calls that have one). One async fn
    /// for both: with the `FCALL` part in an async fn of its own, awaited
    /// here, every decision's future would hold the call's keys and
    /// arguments twice (`future_size` in mod.rs bounds its size).
    async fn call<K: CallKeys + ?Sized>(
        &self,
        function: &str,
        script: Option<(&Script, &str)>,
        keys: &K,
        args: &[Arg<'_>],
        via: Via<'_>,
    ) -> Option<Result<Value, StoreError>> {
        // One deadline over every attempt (a load included).
        let deadline = self.deadline();
        if self.functions.0.load(Ordering::Relaxed) == TRY {
            let library = Library::get();
            let fcall = Invocation::new("FCALL", function, keys, args);
            // One await of the call, in a loop, so the future holds one
            // call's state, not two.
            let mut loaded = false;
            loop {
                match self.run_until(&fcall, via, deadline).await {
                    // Boxed, as the script path below: rare, and its state
                    // would make every call's future larger.
                    Err(e) if is_missing(&e) && !loaded => {
                        match Box::pin(self.load(library, deadline)).await {
                            Ok(()) => loaded = true,
                            Err(e) if is_unavailable(&e) => {
                                self.never_functions();
                                break;
                            }
                            Err(e) => return Some(Err(e)),
                        }
                    }
                    // Loaded elsewhere only (a topology change meanwhile):
                    // this call by script, the next one loads again.
                    Err(e) if is_missing(&e) => break,
                    Err(e) if is_unavailable(&e) && !loaded => {
                        self.never_functions();
                        break;
                    }
                    other => return Some(other),
                }
            }
        }
        let (script, source) = script?;
        let eval = self.eval(script, source, keys, args, via, deadline);
        Some(Box::pin(eval).await)
    }

    /// Whether calls go by functions (`FCALL`) rather than scripts.
    #[cfg(feature = "redis-cluster")]
    pub(super) fn uses_functions(&self) -> bool {
        self.functions.0.load(Ordering::Relaxed) == TRY
    }

    fn never_functions(&self) {
        self.functions.0.store(NEVER, Ordering::Relaxed);
    }

    /// `FUNCTION LOAD` of the library (every master of a cluster) before
    /// `deadline`. A library loaded meanwhile by another store is loaded.
    pub(super) async fn load(
        &self,
        library: &'static Library,
        deadline: Deadline,
    ) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg(library.source());
        match self.run_until(&cmd, Via::Pool, deadline).await {
            Err(e) if redis_error(&e).is_some_and(|e| text(e).contains("already exists")) => Ok(()),
            other => other.map(|_| ()),
        }
    }
}

/// The answer of a [`call`](Inner::call) given a script, which always has
/// one.
fn scripted(answer: Option<Result<Value, StoreError>>) -> Result<Value, StoreError> {
    answer.unwrap_or_else(|| {
        Err(StoreError::Backend(
            "a call with a script went unanswered".into(),
        ))
    })
}

fn redis_error(e: &StoreError) -> Option<&RedisError> {
    match e {
        StoreError::Backend(source) => source.downcast_ref::<RedisError>(),
        _ => None,
    }
}

fn text(e: &RedisError) -> String {
    e.to_string()
}

/// `Function not found`: the library is not loaded on that node.
fn is_missing(e: &StoreError) -> bool {
    redis_error(e).is_some_and(names_no_function)
}

/// Whether `e` is Redis's `Function not found`.
pub(super) fn names_no_function(e: &RedisError) -> bool {
    text(e).contains("Function not found")
}

/// Functions cannot be used: a Redis without them (`unknown command`), or a
/// user who may not run `FCALL` or `FUNCTION LOAD` (`NOPERM` naming the
/// command; a `NOPERM` for a key is the key's, and fails as with a script).
fn is_unavailable(e: &StoreError) -> bool {
    redis_error(e).is_some_and(|e| {
        let text = text(e).to_ascii_lowercase();
        text.contains("unknown command")
            || (text.contains("noperm")
                && (text.contains("'fcall'") || text.contains("'function|load'")))
    })
}
