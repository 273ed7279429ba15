//! Redis errors as [`StoreError`]s: what is an outage, what breaks a
//! connection, a missing script, a policy conflict.

use super::*;

/// A Redis error as a [`StoreError`]: [`StoreError::Unavailable`] for an
/// outage (see [`is_outage`]), [`StoreError::Backend`] for everything else.
pub(crate) fn backend_error(e: RedisError) -> StoreError {
    if is_outage(&e) {
        StoreError::Unavailable(Box::new(e))
    } else {
        StoreError::Backend(Box::new(e))
    }
}

/// A Redis error of the cluster client's path as a [`StoreError`]: as
/// [`backend_error`], and a `MOVED` or `ASK` still left when its retries ran
/// out (the slot's owner could not be reached, or the slot kept moving) is
/// an outage too. On a single node's connections the same reply means the
/// URL names a node of a Redis Cluster (a store built with `builder`, not
/// `cluster_builder`): a mistake to fix, which never lifts the limit.
#[cfg(feature = "redis-cluster")]
pub(super) fn cluster_error(e: RedisError) -> StoreError {
    if matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
    ) {
        StoreError::Unavailable(Box::new(e))
    } else {
        backend_error(e)
    }
}

/// Whether `e` means Redis could not be reached or could not serve the call
/// now (so a failure policy may apply): a broken, refused or unreachable
/// connection (see [`unreachable`]), no node for the slot, a cluster that is
/// down or resharding, a master that is down or was demoted during a
/// failover, a server loading its data or busy running another script.
/// Everything else (a script error, `NOPERM`, a failed authentication, a
/// TLS certificate or server name refused, a reply of the wrong type, a
/// redirection on a single node's connection, a new connection's probe
/// finding a read-only replica: `RATELIMIT_REPLICA`) is a mistake to fix,
/// never an outage.
pub(super) fn is_outage(e: &RedisError) -> bool {
    if certificate_refused(e) {
        return false;
    }
    unreachable(e)
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
        )
        || matches!(e.code(), Some("BUSY" | "MASTERDOWN" | "LOADING"))
}

/// Whether `e` says a TLS certificate did not verify where redis-rs kept
/// only the text of the error: its cluster client reports what failed its
/// first connections as a message of kind `Io` with the cause's text
/// (rustls's: `invalid peer certificate: UnknownIssuer`), which would
/// otherwise read as a dropped connection.
fn certificate_refused(e: &RedisError) -> bool {
    e.detail()
        .is_some_and(|detail| detail.contains("invalid peer certificate"))
}

/// Whether `e` says the node could not be reached, or the connection to it
/// failed or timed out: an I/O error, but not one of the kinds a mistake
/// gives whatever the network does (a TLS certificate refused is
/// `InvalidData`, a server name `rustls` cannot check is not an I/O error at
/// all).
fn unreachable(e: &RedisError) -> bool {
    if e.is_timeout() || e.is_connection_refusal() || e.is_connection_dropped() {
        return true;
    }
    e.is_io_error()
        && io_error_kind(e).is_some_and(|kind| {
            !matches!(
                kind,
                std::io::ErrorKind::InvalidData
                    | std::io::ErrorKind::InvalidInput
                    | std::io::ErrorKind::PermissionDenied
                    | std::io::ErrorKind::Unsupported
            )
        })
}

/// The kind of the I/O error `e` wraps, if it wraps one.
fn io_error_kind(e: &RedisError) -> Option<std::io::ErrorKind> {
    // redis-rs gives its source as the `Arc` it keeps it in.
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut source = std::error::Error::source(e);
    while let Some(error) = source {
        let inner: &(dyn std::error::Error + 'static) = match error.downcast_ref::<Shared>() {
            Some(shared) => &**shared,
            None => error,
        };
        if let Some(io) = inner.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        source = inner.source();
    }
    None
}

/// Whether the connection `e` came on is of no more use: it broke, timed
/// out, or leads to a node that is no longer a master (`READONLY`: after a
/// failover behind one name, a new connection may reach the new master; on
/// a replica, the new connection's probe says so, a mistake).
pub(super) fn breaks_connection(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

/// Whether a checkout failed because the node closed the connection it
/// opened (an I/O error, neither refused nor timed out).
pub(super) fn opening_closed(e: &StoreError) -> bool {
    let StoreError::Unavailable(source) = e else {
        return false;
    };
    source
        .downcast_ref::<RedisError>()
        .is_some_and(closed_by_node)
}

/// Whether an opening failed because the node closed the new connection
/// (not refused, not timed out).
pub(super) fn closed_by_node(e: &RedisError) -> bool {
    e.is_io_error() && !e.is_connection_refusal() && !e.is_timeout()
}

pub(super) fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// A script that met another algorithm's state under a policy's name fails
/// with `RATELIMIT_CONFLICT <state key>` (see the prelude), or with Redis's
/// `WRONGTYPE`, which names no key (so only a script over one state key says
/// whose it is): [`StoreError::PolicyConflict`], as `MemoryStore` answers.
/// `checks`: the script's state keys and their policies.
pub(super) fn policy_conflict<'a>(
    error: StoreError,
    checks: impl IntoIterator<Item = (&'a String, &'a Policy)>,
) -> StoreError {
    let StoreError::Backend(source) = &error else {
        return error;
    };
    let Some(e) = source.downcast_ref::<RedisError>() else {
        return error;
    };
    let named = match e.code() {
        Some("RATELIMIT_CONFLICT") => e.detail().and_then(|d| d.split_whitespace().next()),
        Some("WRONGTYPE") => None,
        _ => return error,
    };
    let mut candidates = checks
        .into_iter()
        .filter(|(key, _)| named.is_none_or(|named| named == key.as_str()));
    match (candidates.next(), candidates.next()) {
        (Some((_, policy)), None) => StoreError::PolicyConflict {
            policy: policy.name().to_owned(),
        },
        _ => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(reply: &str) -> RedisError {
        let value = redis::parse_redis_value(reply.as_bytes()).expect("a RESP error");
        value.extract_error().expect_err("an error reply")
    }

    /// A redirection is an outage only when the cluster client's retries
    /// left it; on a single node's connection it says the URL names a
    /// cluster's node, a mistake.
    #[test]
    fn a_redirection_is_an_outage_only_on_the_cluster_clients_path() {
        for reply in [
            "-MOVED 157 127.0.0.1:7000\r\n",
            "-ASK 157 127.0.0.1:7000\r\n",
        ] {
            let error = server_error(reply);
            assert!(!is_outage(&error), "{reply:?}: {error:?}");
            assert!(!backend_error(error.clone()).is_outage(), "{reply:?}");
            #[cfg(feature = "redis-cluster")]
            assert!(cluster_error(error).is_outage(), "{reply:?}");
        }
        for reply in ["-ERR unknown command\r\n", "-NOPERM no\r\n"] {
            assert!(!is_outage(&server_error(reply)), "{reply:?}");
        }
    }

    #[test]
    fn only_io_errors_a_network_gives_are_outages() {
        use std::io::{Error, ErrorKind as Io};
        for kind in [
            Io::ConnectionRefused,
            Io::ConnectionReset,
            Io::ConnectionAborted,
            Io::BrokenPipe,
            Io::UnexpectedEof,
            Io::TimedOut,
            Io::HostUnreachable,
            Io::NetworkUnreachable,
            Io::AddrNotAvailable,
        ] {
            let error = RedisError::from(Error::new(kind, "down"));
            assert!(is_outage(&error), "{kind:?}: {error:?}");
        }
        // What tokio-rustls makes of a certificate that does not verify.
        for kind in [Io::InvalidData, Io::InvalidInput, Io::PermissionDenied] {
            let error = RedisError::from(Error::new(kind, "invalid peer certificate"));
            assert!(!is_outage(&error), "{kind:?}: {error:?}");
        }
        // What the cluster client keeps of either when its first
        // connections fail: the text alone.
        let initial = |cause: &str| {
            RedisError::from((
                ErrorKind::Io,
                "Failed to create initial connections",
                cause.to_owned(),
            ))
        };
        let refused = initial("Io: invalid peer certificate: UnknownIssuer");
        assert!(!is_outage(&refused), "{refused:?}");
        let down = initial("Io: Connection refused (os error 111)");
        assert!(is_outage(&down), "{down:?}");
    }
}
