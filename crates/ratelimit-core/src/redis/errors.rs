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

/// Whether `e` means Redis could not be reached or could not serve the call
/// now (so a failure policy may apply): a broken or refused connection, no
/// node for the slot, a cluster that is down or resharding, a `MOVED` or
/// `ASK` still left when the cluster client's retries ran out (the slot's
/// owner could not be reached, or the slot kept moving), a master that is
/// down or was demoted during a failover, a server loading its data or busy
/// running another script. Everything else (a script error, `NOPERM`, a
/// failed authentication, a reply of the wrong type) is a mistake to fix,
/// never an outage.
pub(super) fn is_outage(e: &RedisError) -> bool {
    breaks_connection(e)
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::Moved
                        | ServerErrorKind::Ask
                )
        )
        || matches!(e.code(), Some("BUSY" | "MASTERDOWN" | "LOADING"))
}

pub(super) fn breaks_connection(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
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

    #[test]
    fn a_redirection_left_after_the_cluster_clients_retries_is_an_outage() {
        for reply in [
            "-MOVED 157 127.0.0.1:7000\r\n",
            "-ASK 157 127.0.0.1:7000\r\n",
        ] {
            let error = server_error(reply);
            assert!(is_outage(&error), "{reply:?}: {error:?}");
            assert!(backend_error(error).is_outage(), "{reply:?}");
        }
        for reply in ["-ERR unknown command\r\n", "-NOPERM no\r\n"] {
            assert!(!is_outage(&server_error(reply)), "{reply:?}");
        }
    }
}
