//! Write combining on a cluster master's direct connection.
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
//! Order: calls queued on one outbox reach Redis in the order they were
//! queued. A flush sends its pipelines one after the other, and a later
//! flush takes the queue only after an earlier one has started sending (the
//! connection's queue admits senders first come, first served). The
//! release of a permit that a check took is queued on the check's outbox
//! (the outbox follows the key's slot), so it never overtakes the check.
//!
//! A flush waits at most the store's call timeout for all its replies; the
//! caller waits no longer either. A call whose flush gave up, or was
//! dropped with its runtime, may have run: the caller treats it as timed
//! out, never as not sent.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{RedisError, Value};
use tokio::sync::oneshot;

/// What a queued call hears back: the node's reply, or (the sender dropped)
/// nothing, when the call may or may not have run.
pub(super) type Reply = oneshot::Receiver<Result<Value, RedisError>>;

/// The calls queued for one direct connection slot of a master.
pub(super) struct Outbox {
    queue: Mutex<Vec<Queued>>,
    /// The longest a flush waits for its replies.
    timeout: Duration,
}

/// A call waiting for the next flush.
struct Queued {
    cmd: redis::Cmd,
    /// The id of `connection` in its slot: consecutive calls of one id go
    /// out as one pipeline. `None`: a connection recorded earlier (a
    /// release sent after its check), sent alone.
    id: Option<u64>,
    connection: MultiplexedConnection,
    reply: oneshot::Sender<Result<Value, RedisError>>,
}

impl Outbox {
    /// An empty outbox whose flushes wait at most `timeout` for replies.
    pub(super) fn new(timeout: Duration) -> Self {
        Outbox {
            queue: Mutex::new(Vec::new()),
            timeout,
        }
    }

    /// Queues `cmd`, to be sent on `connection` (whose id is `id`, see
    /// [`Queued::id`]) by the next flush. Needs a tokio runtime.
    pub(super) fn send(
        self: &Arc<Self>,
        cmd: redis::Cmd,
        id: Option<u64>,
        connection: MultiplexedConnection,
    ) -> Reply {
        let (reply, receiver) = oneshot::channel();
        let first = {
            let mut queue = self.queue.lock();
            queue.push(Queued {
                cmd,
                id,
                connection,
                reply,
            });
            queue.len() == 1
        };
        if first {
            tokio::spawn(self.clone().flush());
        }
        receiver
    }

    /// Sends what is queued once the tasks already runnable have queued
    /// theirs: runs of one connection id as one pipeline each, in order.
    async fn flush(self: Arc<Self>) {
        tokio::task::yield_now().await;
        let deadline = tokio::time::Instant::now() + self.timeout;
        let queued = std::mem::take(&mut *self.queue.lock());
        let mut queued = queued.into_iter().peekable();
        while let Some(first) = queued.next() {
            let id = first.id;
            let mut run = vec![first];
            while let Some(next) = queued.next_if(|next| id.is_some() && next.id == id) {
                run.push(next);
            }
            // Past the timeout the replies are dropped: their callers
            // have given up by then, and treat the calls as timed out.
            let _ = tokio::time::timeout_at(deadline, send(run)).await;
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
