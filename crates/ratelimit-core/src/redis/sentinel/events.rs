//! The sentinels' events: one task per sentinel, subscribed to what it
//! publishes about failovers (`+try-failover`, `-failover-abort-*`,
//! `+switch-master`), so that the store stops deciding on a master being
//! failed over, and follows the new one, without waiting for an error.
//!
//! A failover ordered with `SENTINEL FAILOVER`, or one after a partition
//! that the store's side of the network did not see, leaves the old master
//! up: it takes writes, and answers `ROLE` as a master, until the sentinels
//! demote it, seconds after its replica's promotion. What it admits
//! meanwhile is lost when it copies the promoted replica's data, and would
//! be admitted again. No call fails to tell the store; the events do.
//!
//! Each task connects again (after 100 ms, doubling up to 2 s) when its
//! sentinel's connection ends, and reads the sentinel's view of the master
//! (`SENTINEL MASTER`: a failover in progress, its `failover-timeout`) each
//! time it subscribes, so an event missed while it was away is caught up
//! on. The tasks end with the store; ended with the runtime that ran them
//! (a store built on a runtime since shut down), they start again on the
//! runtime of the next call.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::RedisError;

use super::Master;

/// The first wait before connecting to a sentinel again, doubled after each
/// failure up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// A sentinel's `failover-timeout` when it does not say (Redis's default).
const DEFAULT_FAILOVER_TIMEOUT: Duration = Duration::from_secs(180);

/// Starts watching the events of each of `sentinels` (in the order the
/// store was given them) for `master`, on the current tokio runtime (none:
/// the first call on one starts it, see [`keep_watching`]).
pub(in crate::redis) fn watch(master: &Arc<Master>, sentinels: Vec<redis::Client>) {
    master.watchers.lock().sentinels = sentinels;
    master.unwatched.store(true, Ordering::Release);
    start(master, false);
}

/// Starts the watch again on the current runtime when it ended with the
/// runtime that ran it (a store built on a runtime since shut down): else
/// nothing would tell the store of a failover that leaves the old master up
/// (see the module's documentation). The failovers it missed meanwhile are
/// caught up on as it subscribes, and the master is asked for again.
pub(in crate::redis) fn keep_watching(master: &Arc<Master>) {
    if master.unwatched.load(Ordering::Acquire) {
        start(master, true);
    }
}

/// Starts the watch on the current runtime, unless it runs already;
/// `again`: it ran before, and may have missed a switch.
fn start(master: &Arc<Master>, again: bool) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let mut watchers = master.watchers.lock();
    // One caller starts it; the others find it started.
    if !master.unwatched.swap(false, Ordering::AcqRel) {
        return;
    }
    let generation = master.watch_generation.fetch_add(1, Ordering::AcqRel) + 1;
    let clients = watchers.sentinels.clone();
    for task in watchers.tasks.drain(..) {
        task.abort();
    }
    for (index, client) in clients.into_iter().enumerate() {
        let watching = Watching {
            master: Arc::downgrade(master),
            generation,
        };
        let task = runtime.spawn(async move {
            let watching = watching;
            watch_one(watching.master.clone(), index, client).await;
        });
        watchers.tasks.push(task.abort_handle());
    }
    drop(watchers);
    if again {
        master.suspect();
    }
}

/// Held by a watching task: dropped with its runtime while the master
/// lives, it marks the watch ended, for the next call to start again,
/// unless a later start replaced it (an earlier task, aborted, ending then
/// must not have the next call abort the tasks that run now).
struct Watching {
    master: Weak<Master>,
    generation: u64,
}

impl Drop for Watching {
    fn drop(&mut self) {
        if let Some(master) = self.master.upgrade()
            && master.watch_generation.load(Ordering::Acquire) == self.generation
        {
            master.unwatched.store(true, Ordering::Release);
        }
    }
}

/// Watches sentinel `index` (at `client`) for as long as `master` lives.
async fn watch_one(master: Weak<Master>, index: usize, client: redis::Client) {
    let mut wait = RETRY_MIN;
    let mut first = true;
    loop {
        let Some((name, timeout)) = master.upgrade().map(|m| (m.name().to_owned(), m.timeout()))
        else {
            return;
        };
        if let Ok((pubsub, mut connection, limit)) =
            subscribe(&master, index, &client, &name, timeout).await
        {
            wait = RETRY_MIN;
            if !first && let Some(master) = master.upgrade() {
                // Away from this sentinel, the store may have missed a switch.
                master.suspect();
            }
            first = false;
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                let Some(master) = master.upgrade() else {
                    return;
                };
                let payload: String = message.get_payload().unwrap_or_default();
                if on_event(&master, index, message.get_channel_name(), &payload, limit) {
                    // Asked before the next event is handled: an end of
                    // this failover published meanwhile still ends it.
                    let in_progress = failover_in_progress(&mut connection, &name, timeout)
                        .await
                        .unwrap_or(true);
                    if in_progress {
                        master.failover_reported(index, true, limit);
                    }
                }
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RETRY_MAX);
    }
}

/// Subscribes to sentinel `index`'s failover events, then reads its view of
/// the master named `name` (so that nothing published between is missed):
/// the subscription, a connection to the sentinel, and how long a failover
/// it reports lasts at most.
async fn subscribe(
    master: &Weak<Master>,
    index: usize,
    client: &redis::Client,
    name: &str,
    timeout: Duration,
) -> Result<
    (
        redis::aio::PubSub,
        redis::aio::MultiplexedConnection,
        Duration,
    ),
    RedisError,
> {
    let bounded = async {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub
            .subscribe(&["+try-failover", "+switch-master"])
            .await?;
        pubsub.psubscribe("-failover-abort-*").await?;
        let mut connection = client.get_multiplexed_async_connection().await?;
        let view: HashMap<String, String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(name)
            .query_async(&mut connection)
            .await?;
        Ok::<_, RedisError>((pubsub, connection, view))
    };
    let (pubsub, connection, view) = tokio::time::timeout(timeout, bounded)
        .await
        .map_err(|_| RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
    let limit = failover_limit(&view);
    let in_progress = view
        .get("flags")
        .is_some_and(|flags| flags.split(',').any(|f| f == "failover_in_progress"));
    if let Some(master) = master.upgrade() {
        master.failover_reported(index, in_progress, limit);
    }
    Ok((pubsub, connection, limit))
}

/// Whether the sentinel at `connection` has a failover of the master named
/// `name` under way now (`SENTINEL MASTER`'s flags), asked within `timeout`.
async fn failover_in_progress(
    connection: &mut redis::aio::MultiplexedConnection,
    name: &str,
    timeout: Duration,
) -> Result<bool, RedisError> {
    let mut command = redis::cmd("SENTINEL");
    command.arg("MASTER").arg(name);
    let asked = command.query_async::<HashMap<String, String>>(connection);
    let view = tokio::time::timeout(timeout, asked)
        .await
        .map_err(|_| RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
    Ok(view
        .get("flags")
        .is_some_and(|flags| flags.split(',').any(|f| f == "failover_in_progress")))
}

/// How long a failover may stay under way before the store stops waiting
/// for its end: twice the sentinel's `failover-timeout` (its promotion may
/// take that long, and so may the replicas' reconfiguration after it).
fn failover_limit(view: &HashMap<String, String>) -> Duration {
    let timeout = view
        .get("failover-timeout")
        .and_then(|ms| ms.parse().ok())
        .map_or(DEFAULT_FAILOVER_TIMEOUT, Duration::from_millis);
    timeout.saturating_mul(2)
}

/// One event of sentinel `index`: `payload` names the master first
/// (`master <name> <ip> <port>`), or for `+switch-master` is
/// `<name> <old ip> <old port> <new ip> <new port>`. Returns whether the
/// event is a try that only the sentinel can tell from the one it just
/// aborted (whether it has a failover under way now).
fn on_event(
    master: &Arc<Master>,
    index: usize,
    channel: &str,
    payload: &str,
    limit: Duration,
) -> bool {
    let fields: Vec<&str> = payload.split_whitespace().collect();
    let ours = |fields: &[&str]| matches!(fields, ["master", name, ..] if *name == master.name());
    match channel {
        "+try-failover" if ours(&fields) => {
            // `master <name> <ip> <port>`: a try on the master the sentinels
            // already replaced is moot, and waiting for its abort would stop
            // decisions on the new master for seconds. One that comes
            // within its failover timeout of this sentinel's abort of the
            // same master may be that aborted try, handed over after its
            // abort (redis-rs may deliver a pattern's message before a
            // channel's sent first), or a new one (`SENTINEL FAILOVER`
            // starts at once): the sentinel tells which.
            let Some((host, port)) = (match fields[..] {
                [_, _, host, port, ..] => port.parse().ok().map(|port| (host, port)),
                _ => None,
            }) else {
                master.failover_reported(index, true, limit);
                return false;
            };
            if master.was_demoted(host, port) {
                return false;
            }
            if master.was_aborted(index, host, port) {
                return true;
            }
            master.failover_reported(index, true, limit);
        }
        "+switch-master" => {
            if let [name, old_host, old_port, new_host, new_port] = fields[..]
                && name == master.name()
                && let Ok(old_port) = old_port.parse()
                && let Ok(new_port) = new_port.parse()
                && master.switched(
                    (old_host.to_owned(), old_port),
                    (new_host.to_owned(), new_port),
                )
            {
                // Looked up now, not by the next call: light traffic's next
                // call then finds the new master named, and only connects.
                let master = Arc::clone(master);
                tokio::spawn(async move {
                    // A lookup that fails leaves the master suspect: the next
                    // call asks again, and reports the error.
                    let _ = master.look_up().await;
                });
            }
        }
        channel if channel.starts_with("-failover-abort") && ours(&fields) => {
            master.failover_reported(index, false, limit);
            if let [_, _, host, port, ..] = fields[..]
                && let Ok(port) = port.parse()
            {
                master.aborted(index, (host.to_owned(), port), limit / 2);
            }
            // Only a failover aborted after a replica was told to become
            // master may have changed the master; one not elected, or with
            // no replica to promote, left it as it was. (Asking then would
            // find no master for a moment: the sentinels that tried still
            // flag it down.)
            if channel == "-failover-abort-slave-timeout" {
                master.suspect();
            }
        }
        _ => {}
    }
    false
}
