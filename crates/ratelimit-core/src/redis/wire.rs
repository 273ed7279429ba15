//! A cluster master's direct connection of the store's own (plain TCP).
//!
//! redis-rs's multiplexed connection did the direct path's writing and
//! reading through a channel, a driver task, a streaming parser and a
//! pipeline that the [`Outbox`](super::outbox::Outbox) built for each batch:
//! about 15,000 instructions and 4.5–5 µs of client CPU per decision at 64 in
//! flight on a 3-master cluster, where `redis-benchmark` spends about 1
//! (BENCHMARKS.md, sessions 14 and 16). A [`Wire`] is one socket with two
//! tasks:
//!
//! - a caller packs its command straight into the connection's write buffer
//!   (a decision's script call is written there from its keys and arguments,
//!   never built as a `redis::Cmd`: see `scripts::Invocation`) and queues
//!   its reply's sender behind it, under one lock, and wakes the writer
//!   unless a wake-up is already on its way;
//! - the writer yields once (so the callers already runnable queue theirs
//!   too, as the outbox did: a lone call waits for that one yield and
//!   nothing else), then writes the whole buffer in one system call and
//!   moves the senders to the queue of calls awaiting replies;
//! - the reader parses each complete reply as it arrives and hands it to
//!   the oldest waiting sender (Redis answers in order).
//!
//! Order: commands are written in the order they were queued, so a release
//! queued after its check runs after it. A reply is a `redis::Value` as
//! redis-rs would have made it: bulk strings and integers (every decision's
//! reply) are read here, anything else by `redis::parse_redis_value`, so
//! error replies (`MOVED`, `NOSCRIPT`, ...) keep their kinds.
//!
//! When the socket fails (a reset, the end of the stream, a reply that is
//! not RESP) every call queued or awaiting a reply fails with an I/O error:
//! it broke the connection, and may have run (see `cluster`). Dropping the
//! last clone of a [`Wire`] closes it the same way and ends both tasks,
//! which also end, dropped, with the runtime that runs them; a call on a
//! closed wire fails at once. No timeout here: each caller waits until its
//! own deadline.
//!
//! Only plain TCP: a `rediss://` cluster keeps redis-rs's multiplexed
//! connections (see [`Link`](super::connections::Link)).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use parking_lot::Mutex;
use redis::{ConnectionAddr, ConnectionInfo, RedisError, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::scripts::Command;

/// What a call hears back: the node's reply (an error reply as an error),
/// or the error that closed the connection.
pub(super) type Reply = oneshot::Receiver<Result<Value, RedisError>>;

/// The deepest nesting of arrays read in a reply; deeper is not RESP that
/// any command of this crate is answered with.
const MAX_DEPTH: usize = 8;

/// An open connection; clones share it. Closed when the last is dropped.
#[derive(Clone)]
pub(super) struct Wire(Arc<Handle>);

/// The users' side of a connection: dropped, it closes it.
struct Handle(Arc<Shared>);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.close(&closed("the connection was dropped"));
    }
}

struct Shared {
    queue: Mutex<Queue>,
    /// Written, awaiting their replies, oldest first.
    waiting: Mutex<VecDeque<Waiter>>,
    /// Wakes the writer.
    write: Notify,
    /// Wakes the reader (and the writer) when the connection closes.
    closing: Notify,
    closed: AtomicBool,
}

/// What the next write sends.
#[derive(Default)]
struct Queue {
    bytes: Vec<u8>,
    /// Each caller's command ends at `end` in `bytes`; past `deadline` its
    /// caller no longer waits.
    waiters: Vec<Queued>,
    /// A wake-up of the writer is on its way.
    woken: bool,
    closed: bool,
}

/// A command not yet written.
struct Queued {
    end: usize,
    deadline: Option<Instant>,
    waiter: Waiter,
}

impl Queued {
    /// Its caller has given up (dropped its reply, or its deadline passed):
    /// it is not written at all.
    fn abandoned(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|deadline| deadline <= now)
            || match &self.waiter {
                Waiter::One(sender) => sender.is_closed(),
                Waiter::Many { sender, .. } => sender.is_closed(),
            }
    }
}

/// A caller awaiting its replies.
enum Waiter {
    /// One command, one reply.
    One(oneshot::Sender<Result<Value, RedisError>>),
    /// A pipeline: `skip` replies left out (a transaction's `OK`s and
    /// `QUEUED`s), then `count` kept.
    Many {
        skip: usize,
        count: usize,
        values: Vec<Value>,
        sender: oneshot::Sender<Result<Vec<Value>, RedisError>>,
    },
}

impl Waiter {
    fn fail(self, error: &RedisError) {
        match self {
            Waiter::One(sender) => {
                let _ = sender.send(Err(error.clone()));
            }
            Waiter::Many { sender, .. } => {
                let _ = sender.send(Err(error.clone()));
            }
        }
    }
}

/// The error of every call on a closed connection: an I/O error, so the call
/// reads as one that broke its connection.
fn closed(why: &'static str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        why,
    ))
}

impl Wire {
    /// Connects to the address of `info` (plain TCP only), starts its tasks
    /// on the current runtime, and logs in with `info`'s credentials. The
    /// caller bounds the time it takes.
    pub(super) async fn open(info: &ConnectionInfo) -> Result<Wire, RedisError> {
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            return Err(RedisError::from((
                redis::ErrorKind::Client,
                "the store's own connections are plain TCP",
            )));
        };
        let stream = TcpStream::connect((host.as_str(), *port)).await?;
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            waiting: Mutex::new(VecDeque::new()),
            write: Notify::new(),
            closing: Notify::new(),
            closed: AtomicBool::new(false),
        });
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            RedisError::from((redis::ErrorKind::Client, "RedisStore needs a tokio runtime"))
        })?;
        runtime.spawn(Tasks(shared.clone()).write(write));
        runtime.spawn(Tasks(shared.clone()).read(read));
        let wire = Wire(Arc::new(Handle(shared)));
        let settings = info.redis_settings();
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(username) = settings.username() {
                auth.arg(username);
            }
            auth.arg(password);
            wire.call(&auth).await?;
        }
        if settings.db() != 0 {
            wire.call(redis::cmd("SELECT").arg(settings.db())).await?;
        }
        Ok(wire)
    }

    /// Queues `cmd`, to be written with the others queued meanwhile unless
    /// its caller has given up by then (`deadline` passed, or the reply
    /// dropped): a call whose caller is gone is never sent.
    pub(super) fn send(&self, cmd: &dyn Command, deadline: Option<Instant>) -> Reply {
        let (sender, reply) = oneshot::channel();
        self.queue(|bytes| cmd.pack(bytes), deadline, Waiter::One(sender));
        reply
    }

    /// `cmd`'s reply, an error reply as an error.
    async fn call(&self, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        self.send(cmd, None)
            .await
            .unwrap_or_else(|_| Err(closed("the connection closed")))
            .and_then(Value::extract_error)
    }

    fn queue(&self, write: impl FnOnce(&mut Vec<u8>), deadline: Option<Instant>, waiter: Waiter) {
        let shared = &self.0.0;
        let wake = {
            let mut queue = shared.queue.lock();
            if queue.closed {
                drop(queue);
                waiter.fail(&closed("the connection is closed"));
                return;
            }
            write(&mut queue.bytes);
            let end = queue.bytes.len();
            queue.waiters.push(Queued {
                end,
                deadline,
                waiter,
            });
            !std::mem::replace(&mut queue.woken, true)
        };
        if wake {
            shared.write.notify_one();
        }
    }
}

impl redis::aio::ConnectionLike for Wire {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        let reply = self.send(cmd, None);
        Box::pin(async move {
            reply
                .await
                .unwrap_or_else(|_| Err(closed("the connection closed")))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        let (sender, reply) = oneshot::channel();
        let waiter = Waiter::Many {
            skip: offset,
            count,
            values: Vec::with_capacity(count),
            sender,
        };
        if offset + count == 0 {
            waiter.fail(&RedisError::from((
                redis::ErrorKind::Client,
                "an empty pipeline",
            )));
        } else {
            self.queue(
                |bytes| bytes.extend_from_slice(&pipeline.get_packed_pipeline()),
                None,
                waiter,
            );
        }
        Box::pin(async move {
            reply
                .await
                .unwrap_or_else(|_| Err(closed("the connection closed")))
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

impl Shared {
    /// Closes the connection: every call queued or awaiting a reply fails
    /// with `error`, and so does every later one.
    fn close(&self, error: &RedisError) {
        let queued = {
            let mut queue = self.queue.lock();
            if queue.closed {
                return;
            }
            queue.closed = true;
            std::mem::take(&mut queue.waiters)
        };
        // Set before `waiting` is emptied: the writer moves its batch there
        // only while this is unset, holding the lock (see `Tasks::write`).
        self.closed.store(true, Ordering::Release);
        let waiting = std::mem::take(&mut *self.waiting.lock());
        self.closing.notify_waiters();
        self.write.notify_one();
        for waiter in queued.into_iter().map(|q| q.waiter).chain(waiting) {
            waiter.fail(error);
        }
    }

    /// Hands `value` to the oldest waiting caller; `false`: none waits (a
    /// reply nobody asked for, the stream is out of step).
    fn deliver(&self, value: Value) -> bool {
        let mut waiting = self.waiting.lock();
        let Some(front) = waiting.front_mut() else {
            return false;
        };
        match front {
            Waiter::One(_) => {
                if let Some(Waiter::One(sender)) = waiting.pop_front() {
                    drop(waiting);
                    let _ = sender.send(value.extract_error());
                }
            }
            Waiter::Many {
                skip,
                count,
                values,
                ..
            } => {
                if *skip > 0 {
                    *skip -= 1;
                } else {
                    values.push(value);
                }
                if values.len() == *count
                    && let Some(Waiter::Many { values, sender, .. }) = waiting.pop_front()
                {
                    drop(waiting);
                    let _ = sender.send(Ok(values));
                }
            }
        }
        true
    }
}

/// The connection's two tasks; each closes it when it ends, however it ends
/// (its runtime shut down included).
struct Tasks(Arc<Shared>);

impl Drop for Tasks {
    fn drop(&mut self) {
        self.0.close(&closed("the connection's task ended"));
    }
}

impl Tasks {
    async fn write(self, mut half: OwnedWriteHalf) {
        let shared = &self.0;
        let mut bytes = Vec::with_capacity(16 * 1024);
        let mut kept = Vec::new();
        loop {
            bytes.clear();
            shared.write.notified().await;
            // The callers already runnable queue theirs first.
            tokio::task::yield_now().await;
            let waiters = {
                let mut queue = shared.queue.lock();
                if queue.closed {
                    return;
                }
                queue.woken = false;
                std::mem::swap(&mut queue.bytes, &mut bytes);
                std::mem::take(&mut queue.waiters)
            };
            // Without the calls whose callers are gone (rare: their bytes
            // are cut out). Each is judged once, so bytes and waiters agree.
            let now = Instant::now();
            let mut cut = false;
            let mut start = 0;
            let mut live = Vec::with_capacity(waiters.len());
            for q in waiters {
                if q.abandoned(now) {
                    if !cut {
                        kept.clear();
                        kept.extend_from_slice(&bytes[..start]);
                        cut = true;
                    }
                } else {
                    if cut {
                        kept.extend_from_slice(&bytes[start..q.end]);
                    }
                    live.push(q.waiter);
                }
                start = q.end;
            }
            if cut {
                std::mem::swap(&mut bytes, &mut kept);
            }
            {
                let mut waiting = shared.waiting.lock();
                if shared.closed.load(Ordering::Acquire) {
                    drop(waiting);
                    let error = closed("the connection is closed");
                    for waiter in live {
                        waiter.fail(&error);
                    }
                    return;
                }
                waiting.extend(live);
            }
            if bytes.is_empty() {
                continue;
            }
            if let Err(e) = half.write_all(&bytes).await {
                shared.close(&RedisError::from(e));
                return;
            }
        }
    }

    async fn read(self, mut half: OwnedReadHalf) {
        let shared = &self.0;
        let mut closing = pin!(shared.closing.notified());
        closing.as_mut().enable();
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        let mut buffer: Vec<u8> = Vec::with_capacity(16 * 1024);
        loop {
            if buffer.capacity() - buffer.len() < 4096 {
                buffer.reserve(buffer.capacity().max(4096));
            }
            let read = {
                let mut reading = pin!(half.read_buf(&mut buffer));
                poll_fn(|cx| {
                    if closing.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(None);
                    }
                    reading.as_mut().poll(cx).map(Some)
                })
                .await
            };
            let error = match read {
                None => return,
                Some(Ok(0)) => closed("the node closed the connection"),
                Some(Err(e)) => RedisError::from(e),
                Some(Ok(_)) => {
                    let mut at = 0;
                    let broken = loop {
                        match frame(&buffer[at..], 0) {
                            Ok(Some(len)) => {
                                let value = value(&buffer[at..at + len]);
                                at += len;
                                let delivered = match value {
                                    Ok(value) => shared.deliver(value),
                                    Err(_) => false,
                                };
                                if !delivered {
                                    break true;
                                }
                            }
                            Ok(None) => break false,
                            Err(()) => break true,
                        }
                    };
                    buffer.drain(..at);
                    if !broken {
                        continue;
                    }
                    RedisError::from((
                        redis::ErrorKind::Parse,
                        "the node's reply could not be read",
                    ))
                }
            };
            shared.close(&error);
            return;
        }
    }
}

/// The length of the RESP value that `bytes` starts with: `None` when it is
/// not all there yet, `Err` when it is not RESP (or nested deeper than
/// [`MAX_DEPTH`]).
fn frame(bytes: &[u8], depth: usize) -> Result<Option<usize>, ()> {
    let Some(&kind) = bytes.first() else {
        return Ok(None);
    };
    let Some(line) = bytes.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let header = line + 2;
    match kind {
        b'+' | b'-' | b':' => Ok(Some(header)),
        b'$' => {
            let len = number(&bytes[1..line])?;
            if len < 0 {
                return Ok(Some(header));
            }
            let end = usize::try_from(len)
                .ok()
                .and_then(|len| header.checked_add(len)?.checked_add(2))
                .ok_or(())?;
            Ok((bytes.len() >= end).then_some(end))
        }
        b'*' if depth < MAX_DEPTH => {
            let count = number(&bytes[1..line])?;
            let mut at = header;
            for _ in 0..count.max(0) {
                match frame(&bytes[at..], depth + 1)? {
                    Some(len) => at += len,
                    None => return Ok(None),
                }
            }
            Ok(Some(at))
        }
        _ => Err(()),
    }
}

/// A RESP integer's digits.
fn number(digits: &[u8]) -> Result<i64, ()> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(())
}

/// The value of one complete RESP frame: a bulk string, an integer, or an
/// array of them (every decision's reply, and a batch's) read here,
/// anything else as redis-rs reads it.
///
/// (A batch's reply, an array, went through `redis::parse_redis_value`,
/// whose decoder zeroes and copies a buffer of its own on every call: about
/// 16,000 client instructions per batch, a sixth of a batched decision's,
/// callgrind on `bench --cluster`.)
fn value(bytes: &[u8]) -> Result<Value, RedisError> {
    match plain(bytes, 0) {
        Some(value) => Ok(value),
        None => redis::parse_redis_value(bytes),
    }
}

/// The value of the complete frame `bytes` if it is a bulk string, an
/// integer, or an array of such values (nested at most [`MAX_DEPTH`]
/// deep); `None` for anything else (an error, a simple string, a nil), or
/// for what does not read as RESP, which redis-rs then reads or refuses.
fn plain(bytes: &[u8], depth: usize) -> Option<Value> {
    let line = bytes.windows(2).position(|w| w == b"\r\n")?;
    match bytes.first()? {
        b'$' if bytes.get(1) != Some(&b'-') => {
            let start = line + 2;
            let data = bytes.get(start..bytes.len().checked_sub(2)?)?;
            Some(Value::BulkString(data.to_vec()))
        }
        b':' => number(&bytes[1..line]).ok().map(Value::Int),
        b'*' if depth < MAX_DEPTH && bytes.get(1) != Some(&b'-') => {
            let count = usize::try_from(number(&bytes[1..line]).ok()?).ok()?;
            let mut at = line + 2;
            // At most one value per 3 bytes left (":0\r\n" is 4): a count
            // sent wrong reserves no more than the frame could hold.
            let mut items = Vec::with_capacity(count.min(bytes.len() / 3));
            for _ in 0..count {
                let rest = bytes.get(at..)?;
                let len = frame(rest, depth + 1).ok()??;
                items.push(plain(&rest[..len], depth + 1)?);
                at += len;
            }
            (at == bytes.len()).then_some(Value::Array(items))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_measured_whole_or_not_at_all() {
        assert_eq!(frame(b"+OK\r\n", 0), Ok(Some(5)));
        assert_eq!(frame(b"+OK\r", 0), Ok(None));
        assert_eq!(frame(b":42\r\n:1", 0), Ok(Some(5)));
        assert_eq!(frame(b"$3\r\nabc\r\n", 0), Ok(Some(9)));
        assert_eq!(frame(b"$3\r\nabc\r", 0), Ok(None));
        assert_eq!(frame(b"$-1\r\n", 0), Ok(Some(5)));
        assert_eq!(frame(b"*2\r\n:1\r\n$1\r\nx\r\n", 0), Ok(Some(15)));
        assert_eq!(frame(b"*2\r\n:1\r\n$1\r\nx", 0), Ok(None));
        assert_eq!(frame(b"*-1\r\n", 0), Ok(Some(5)));
        assert_eq!(frame(b"-MOVED 1 127.0.0.1:7000\r\n", 0), Ok(Some(25)));
    }

    #[test]
    fn what_is_not_resp_is_refused() {
        assert_eq!(frame(b"?what\r\n", 0), Err(()));
        assert_eq!(frame(b"$x\r\n", 0), Err(()));
        assert_eq!(frame(b"$99999999999999999999\r\n", 0), Err(()));
        let deep = b"*1\r\n".repeat(MAX_DEPTH + 1);
        assert_eq!(frame(&deep, 0), Err(()));
    }

    #[test]
    fn values_are_read_as_redis_rs_reads_them() {
        for frame in [
            &b"$3\r\nabc\r\n"[..],
            b"$0\r\n\r\n",
            b"$-1\r\n",
            b":-7\r\n",
            b"+OK\r\n",
            b"*2\r\n:1\r\n$1\r\nx\r\n",
            b"*0\r\n",
            b"*-1\r\n",
            b"*2\r\n$25\r\n\x01abcdefghijklmnopqrstuvwx\r\n$7\r\nERR no!\r\n",
            b"*2\r\n*1\r\n:3\r\n$-1\r\n",
            b"*2\r\n+OK\r\n:1\r\n",
            b"*1\r\n-ERR inside\r\n",
            b"*3\r\n*2\r\n:1\r\n:2\r\n$0\r\n\r\n:-1\r\n",
            b"-NOSCRIPT No matching script\r\n",
            b"-MOVED 1 127.0.0.1:7000\r\n",
        ] {
            let ours = value(frame).map_err(|e| e.to_string());
            let theirs = redis::parse_redis_value(frame).map_err(|e| e.to_string());
            assert_eq!(ours, theirs, "{}", String::from_utf8_lossy(frame));
        }
        // A batch's reply is read here, not by redis-rs; an error is not.
        assert!(plain(b"*2\r\n$3\r\nabc\r\n$2\r\nno\r\n", 0).is_some());
        assert!(plain(b"*1\r\n-ERR inside\r\n", 0).is_none());
        assert!(plain(b"-ERR\r\n", 0).is_none());
    }

    /// A RESP frame of `depth` levels at most: bulk strings, integers,
    /// nils, simple strings, errors and arrays of them.
    fn resp() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(|b| [
                format!("${}\r\n", b.len()).into_bytes(),
                b,
                b"\r\n".to_vec()
            ]
            .concat()),
            any::<i64>().prop_map(|n| format!(":{n}\r\n").into_bytes()),
            Just(b"$-1\r\n".to_vec()),
            Just(b"*-1\r\n".to_vec()),
            "[a-zA-Z ]{0,12}".prop_map(|t| format!("+{t}\r\n").into_bytes()),
            "[A-Z]{1,8} [a-z ]{0,12}".prop_map(|t| format!("-{t}\r\n").into_bytes()),
        ];
        leaf.prop_recursive(3, 32, 6, |inner| {
            proptest::collection::vec(inner, 0..6).prop_map(|items| {
                let mut out = format!("*{}\r\n", items.len()).into_bytes();
                for item in items {
                    out.extend(item);
                }
                out
            })
        })
    }

    proptest::proptest! {
        /// Whatever a reply holds, it reads as redis-rs reads it (or fails
        /// as it fails), and is measured whole.
        #[test]
        fn any_reply_reads_as_redis_rs_reads_it(bytes in resp()) {
            proptest::prop_assert_eq!(frame(&bytes, 0), Ok(Some(bytes.len())));
            let ours = value(&bytes).map_err(|e| e.to_string());
            let theirs = redis::parse_redis_value(&bytes).map_err(|e| e.to_string());
            proptest::prop_assert_eq!(ours, theirs);
        }
    }
}
