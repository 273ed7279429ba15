//! Write combining on a cluster master's direct connection when it is
//! redis-rs's multiplexed connection (a `rediss://` cluster; over plain TCP
//! the store's own [`Wire`](super::wire::Wire) combines its writes itself).
//!
//! On a cluster every script call holds the keys of one slot (DESIGN.md), so
//! with keys spread over 16,384 slots no two decisions share a call, and
//! each call was its own command on the master's multiplexed connection.
//! That connection's task writes whenever its queue is empty, and it is
//! woken (and run) right after each caller queues a command, so it wrote
//! about one command per system call: 0.78 `writev` per decision at 64 in
//! flight, and the nodes read 2.9 commands per `read` where the ceiling's
//! `redis-benchmark -P 16` gives them 16 (BENCHMARKS.md, session 13).
//!
//! An [`Outbox`] gathers the calls that tasks queue during one turn of the
//! runtime and writes them as one pipeline. The first call queued spawns a
//! flush task, which yields once, so that every task that is already
//! runnable queues its call first, then sends everything queued. A lone
//! call waits for that one yield and nothing else: no timer, no waiting for
//! an earlier reply. Each call keeps its own command (and slot) and its own
//! reply; a pipeline is transport only.
//!
//! Order: calls queued on one outbox reach their connections in the order
//! they were queued. A flush hands all its pipelines to their connections
//! in one poll (a multiplexed connection queues a command when it is first
//! polled, and its queue admits senders first come, first served), and it
//! takes the queue only in its outbox's turn, which it keeps until then: a
//! later flush cannot hand anything over first, even while an earlier one
//! waits for its replies. The release of a permit that a check took is
//! queued on the check's outbox (the outbox follows the key's slot) and on
//! the check's connection, so it never overtakes the check. The pipelines
//! of one flush wait for their replies together: one on a stalled
//! connection does not hold the others back.
//!
//! Each call carries its caller's deadline. A flush sends only the calls
//! whose deadline has not passed, and waits for their replies until the
//! earliest of their deadlines; the caller waits no longer either. A call
//! whose flush gave up, or was dropped with its runtime, may have run: the
//! caller treats it as timed out, never as not sent.
//!
//! A queue that is not empty has a flush on its way, spawned on the runtime
//! of the call that found it empty. That flush may never take it: its
//! runtime shuts down (the flush, dropped, empties the queue as it goes),
//! or is no longer driven (a current-thread runtime nobody blocks on). So a
//! call that finds the oldest queued call past its deadline spawns a flush
//! of its own: an outbox recovers within a call timeout, instead of every
//! call on it timing out for good.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use parking_lot::Mutex;
use redis::aio::ConnectionLike;
use redis::{RedisError, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::connections::Link;

/// What a queued call hears back: the node's reply, or (the sender dropped)
/// nothing, when the call may or may not have run.
pub(super) type Reply = oneshot::Receiver<Result<Value, RedisError>>;

/// The calls queued for one direct connection slot of a master.
#[derive(Default)]
pub(super) struct Outbox {
    queue: Mutex<Vec<Queued>>,
    /// Held by a flush from before it takes the queue until it has handed
    /// every call to its connection (see the module's "Order").
    turn: tokio::sync::Mutex<()>,
}

/// A call waiting for the next flush.
struct Queued {
    cmd: redis::Cmd,
    /// The id of `connection` in its slot: consecutive calls of one id go
    /// out as one pipeline. `None`: a connection recorded earlier (a
    /// release sent after its check), sent alone.
    id: Option<u64>,
    connection: Link,
    reply: oneshot::Sender<Result<Value, RedisError>>,
    /// When its caller gives up.
    deadline: Instant,
}

/// The runtime a flush needs is missing: nothing was queued or sent.
#[derive(Debug)]
pub(super) struct NoRuntime;

impl Outbox {
    /// Queues `cmd`, to be sent on `connection` (whose id is `id`, see
    /// [`Queued::id`]) by the next flush, and answered by `deadline` (else
    /// the reply is dropped: the caller waits no longer). Needs a tokio
    /// runtime.
    pub(super) fn send(
        self: &Arc<Self>,
        cmd: redis::Cmd,
        id: Option<u64>,
        connection: Link,
        deadline: Instant,
    ) -> Result<Reply, NoRuntime> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| NoRuntime)?;
        let (reply, receiver) = oneshot::channel();
        let flush = {
            let mut queue = self.queue.lock();
            // Empty: no flush on its way. Its oldest call expired: the
            // flush on its way may never come (see the module's docs).
            let flush = queue
                .first()
                .is_none_or(|oldest| oldest.deadline <= Instant::now());
            queue.push(Queued {
                cmd,
                id,
                connection,
                reply,
                deadline,
            });
            flush
        };
        if flush {
            runtime.spawn(
                Pending {
                    outbox: self.clone(),
                    taken: false,
                }
                .flush(),
            );
        }
        Ok(receiver)
    }
}

/// A flush that has not yet taken its outbox's queue. Dropped before it
/// does (its runtime shut down), it takes the queue then: the calls in it
/// hear that no flush will send them, and the next call starts a flush
/// (an outbox whose queue is not empty has one under way).
struct Pending {
    outbox: Arc<Outbox>,
    taken: bool,
}

impl Pending {
    fn take(&mut self) -> Vec<Queued> {
        self.taken = true;
        std::mem::take(&mut *self.outbox.queue.lock())
    }

    /// Sends what is queued once the tasks already runnable have queued
    /// theirs: runs of one connection id as one pipeline each, handed over
    /// in order, then awaited together until the earliest deadline of the
    /// calls taken.
    async fn flush(mut self) {
        tokio::task::yield_now().await;
        let outbox = self.outbox.clone();
        let turn = outbox.turn.lock().await;
        let mut queued = self.take();
        // Calls whose callers have given up are dropped unsent (they read
        // as timed out).
        let now = Instant::now();
        queued.retain(|q| q.deadline > now);
        let Some(deadline) = queued.iter().map(|q| q.deadline).min() else {
            return;
        };
        let mut sends: Vec<Option<Pin<Box<dyn Future<Output = ()> + Send>>>> = Vec::new();
        let mut queued = queued.into_iter().peekable();
        while let Some(first) = queued.next() {
            let id = first.id;
            let mut run = vec![first];
            while let Some(next) = queued.next_if(|next| id.is_some() && next.id == id) {
                run.push(next);
            }
            sends.push(Some(Box::pin(send(run))));
        }
        // The turn ends with the first poll, once every pipeline is handed
        // over. Past the deadline the replies still awaited are dropped:
        // their callers treat the calls as timed out.
        let mut turn = Some(turn);
        let all = std::future::poll_fn(|cx| {
            let mut pending = false;
            for slot in &mut sends {
                if let Some(send) = slot {
                    if send.as_mut().poll(cx).is_ready() {
                        *slot = None;
                    } else {
                        pending = true;
                    }
                }
            }
            turn = None;
            if pending {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        });
        let _ = tokio::time::timeout_at(deadline, all).await;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.taken {
            drop(self.take());
        }
    }
}

/// Sends `run`, calls on one connection, and hands each its reply.
async fn send(mut run: Vec<Queued>) {
    if let [only] = run.as_mut_slice() {
        let result = only
            .connection
            .req_packed_command(&only.cmd)
            .await
            .and_then(Value::extract_error);
        if let Some(only) = run.pop() {
            let _ = only.reply.send(result);
        }
        return;
    }
    let Some(mut connection) = run.first().map(|q| q.connection.clone()) else {
        return;
    };
    let mut pipe = redis::Pipeline::with_capacity(run.len());
    pipe.ignore_errors();
    let mut replies = Vec::with_capacity(run.len());
    for queued in run {
        pipe.add_command(queued.cmd);
        replies.push(queued.reply);
    }
    match pipe.query_async::<Vec<Value>>(&mut connection).await {
        Ok(values) if values.len() == replies.len() => {
            for (reply, value) in replies.into_iter().zip(values) {
                let _ = reply.send(value.extract_error());
            }
        }
        // A reply of another shape is a bug, not an outage: every call fails
        // with it.
        Ok(values) => {
            let error = RedisError::from((
                redis::ErrorKind::Client,
                "a pipeline's reply has the wrong number of entries",
                format!("{} replies to {} calls", values.len(), replies.len()),
            ));
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}
