//! [`FaultProxy`]: a loopback TCP proxy that injects faults between a client
//! and a server (a [`RedisServer`]).
//!
//! The proxy listens on a free port of 127.0.0.1 and forwards every
//! connection to its upstream, until told otherwise:
//!
//! - [`set_latency`](FaultProxy::set_latency) holds every chunk the upstream
//!   sends back for that long before it reaches the client (so a round trip
//!   takes that much longer; requests are not delayed, and order is kept);
//! - [`set_mode`](FaultProxy::set_mode) with [`Mode::Stall`] keeps connections
//!   open and reads what clients send, but forwards nothing either way (a
//!   server that hangs, or a network that drops packets without resetting
//!   connections). A connection that lost bytes that way no longer carries a
//!   consistent byte stream, so it is closed when the mode changes again
//!   (as a partition that heals with a reset); connections that lost nothing
//!   carry on;
//! - [`Mode::Drop`] closes every connection, existing ones included, and
//!   closes new ones as soon as they are accepted (a server that is gone but
//!   whose port still answers);
//! - [`Mode::Forward`] forwards again;
//! - [`cut_replies`](FaultProxy::cut_replies) swallows the next replies and
//!   closes their connections: the server ran the command, the client never
//!   hears of it (a reply lost with its connection).
//!
//! It runs on a thread of its own (its own tokio runtime), so it keeps
//! working while a test blocks, and it is stopped, every connection closed,
//! when dropped. Bounded: at most [`MAX_CONNECTIONS`] connections at once
//! (others are closed on accept), [`QUEUE_CHUNKS`] delayed chunks per
//! connection (then the upstream is read no further until they go out), and
//! the upstream must be a loopback address.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::RedisServer;

/// The most connections the proxy holds at once.
pub const MAX_CONNECTIONS: usize = 256;

/// The most chunks per connection waiting for their latency to pass.
pub const QUEUE_CHUNKS: usize = 1024;

/// How long the proxy waits for the upstream to accept a connection.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long dropping the proxy waits for its runtime to stop.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward both ways, replies held for the latency (the default).
    Forward,
    /// Accept connections and read from clients, but forward nothing either
    /// way. Connections that lost bytes are closed when the mode changes.
    Stall,
    /// Close every connection, existing and new.
    Drop,
}

/// The proxy's settings, shared with every connection.
#[derive(Debug, Clone, Copy)]
struct Settings {
    mode: Mode,
    latency: Duration,
}

/// A fault-injecting TCP proxy on 127.0.0.1 in front of one upstream;
/// stopped, every connection closed, when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    settings: watch::Sender<Settings>,
    accepted: Arc<AtomicU64>,
    cuts: Arc<AtomicU64>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let settings = *self.settings.borrow();
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("mode", &settings.mode)
            .field("latency", &settings.latency)
            .field("accepted", &self.accepted())
            .finish()
    }
}

impl FaultProxy {
    /// Starts a new Redis server and a proxy in front of it.
    pub fn with_new_server() -> (RedisServer, FaultProxy) {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.addr());
        (server, proxy)
    }

    /// Starts a proxy on a free port of 127.0.0.1 forwarding to `upstream`.
    /// Callable from synchronous code and from within a tokio runtime alike.
    ///
    /// # Panics
    ///
    /// When `upstream` is not a loopback address, or the proxy cannot bind
    /// its port or start its thread.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        assert!(
            upstream.ip().is_loopback(),
            "FaultProxy forwards to loopback addresses only, not {upstream}"
        );
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .expect("FaultProxy: bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("FaultProxy: non-blocking listener");
        let addr = listener.local_addr().expect("FaultProxy: local address");
        let (settings, settings_rx) = watch::channel(Settings {
            mode: Mode::Forward,
            latency: Duration::ZERO,
        });
        let accepted = Arc::new(AtomicU64::new(0));
        let cuts = Arc::new(AtomicU64::new(0));
        let (shutdown, shutdown_rx) = oneshot::channel();
        let counter = Arc::clone(&accepted);
        let cutting = Arc::clone(&cuts);
        let thread = std::thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("FaultProxy: a tokio runtime");
                runtime.block_on(accept_loop(
                    listener,
                    upstream,
                    settings_rx,
                    counter,
                    cutting,
                    shutdown_rx,
                ));
                // Every connection task is dropped here, closing its sockets.
                runtime.shutdown_timeout(SHUTDOWN_TIMEOUT);
            })
            .expect("FaultProxy: spawning its thread");
        FaultProxy {
            addr,
            upstream,
            settings,
            accepted,
            cuts,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// The address clients connect to, `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:port`, the proxy as a Redis URL.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The address the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Holds every chunk the upstream sends for `latency` before it reaches
    /// the client (zero, the default, for none). Applies at once, to existing
    /// connections too; chunks already waiting keep their time.
    pub fn set_latency(&self, latency: Duration) {
        self.settings.send_modify(|s| s.latency = latency);
    }

    /// Forward, stall or drop (see [`Mode`]). Applies at once, to existing
    /// connections too.
    pub fn set_mode(&self, mode: Mode) {
        self.settings.send_modify(|s| s.mode = mode);
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.settings.borrow().mode
    }

    /// The current latency.
    pub fn latency(&self) -> Duration {
        self.settings.borrow().latency
    }

    /// Swallows the next `n` chunks the upstream sends (in forward mode),
    /// each closing its connection at once: the server ran what the client
    /// sent, and the client sees its connection drop before the reply.
    pub fn cut_replies(&self, n: u64) {
        self.cuts.store(n, Ordering::SeqCst);
    }

    /// How many replies [`cut_replies`](FaultProxy::cut_replies) has yet to cut.
    pub fn cuts_left(&self) -> u64 {
        self.cuts.load(Ordering::SeqCst)
    }

    /// How many connections the proxy has accepted so far (including those
    /// it closed at once).
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: std::net::TcpListener,
    upstream: SocketAddr,
    settings: watch::Receiver<Settings>,
    accepted: Arc<AtomicU64>,
    cuts: Arc<AtomicU64>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let listener = TcpListener::from_std(listener).expect("FaultProxy: a tokio listener");
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let client = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                // Out of file descriptors and the like: try again shortly.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        accepted.fetch_add(1, Ordering::Relaxed);
        if settings.borrow().mode == Mode::Drop {
            drop(client);
            continue;
        }
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            drop(client);
            continue;
        };
        let settings = settings.clone();
        let cuts = Arc::clone(&cuts);
        tokio::spawn(async move {
            connection(client, upstream, settings, cuts).await;
            drop(slot);
        });
    }
}

/// Proxies one connection until either side closes it, the mode becomes
/// [`Mode::Drop`], it lost bytes to a stall and the stall ended, or a reply
/// of it was cut.
async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    mut settings: watch::Receiver<Settings>,
    cuts: Arc<AtomicU64>,
) {
    let server =
        match tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(upstream)).await {
            Ok(Ok(server)) => server,
            _ => return,
        };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let poisoned = Arc::new(AtomicBool::new(false));
    let (queue, queued) = mpsc::channel(QUEUE_CHUNKS);

    let mut tasks = JoinSet::new();
    tasks.spawn(requests(
        client_read,
        server_write,
        settings.clone(),
        Arc::clone(&poisoned),
    ));
    tasks.spawn(replies(
        server_read,
        queue,
        settings.clone(),
        Arc::clone(&poisoned),
        cuts,
    ));
    tasks.spawn(deliver(
        queued,
        client_write,
        settings.clone(),
        Arc::clone(&poisoned),
    ));

    loop {
        tokio::select! {
            // One direction ended (EOF, error, or a Drop seen mid-copy).
            _ = tasks.join_next() => break,
            changed = settings.changed() => {
                if changed.is_err() {
                    break;
                }
                let mode = settings.borrow_and_update().mode;
                if mode == Mode::Drop || (mode != Mode::Stall && poisoned.load(Ordering::Acquire)) {
                    break;
                }
            }
        }
    }
    // Dropping `tasks` aborts the copies, and their halves close both sockets.
}

/// Client to upstream: forwarded at once, or swallowed while stalled.
async fn requests(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    settings: watch::Receiver<Settings>,
    poisoned: Arc<AtomicBool>,
) {
    let mut buffer = vec![0_u8; 16 * 1024];
    while let Some((n, _latency)) = next_chunk(&mut from, &mut buffer, &settings, &poisoned).await {
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// Upstream to the delay queue, each chunk stamped with when it may go out;
/// a chunk to cut ends the connection instead.
async fn replies(
    mut from: OwnedReadHalf,
    queue: mpsc::Sender<(Instant, Vec<u8>)>,
    settings: watch::Receiver<Settings>,
    poisoned: Arc<AtomicBool>,
    cuts: Arc<AtomicU64>,
) {
    let mut buffer = vec![0_u8; 16 * 1024];
    while let Some((n, latency)) = next_chunk(&mut from, &mut buffer, &settings, &poisoned).await {
        if cuts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok()
        {
            return;
        }
        let due = Instant::now() + latency;
        if queue.send((due, buffer[..n].to_vec())).await.is_err() {
            return;
        }
    }
}

/// The length of the next chunk read from `from` into `buffer` to forward,
/// with the latency in force: chunks read while the proxy stalls are
/// swallowed (the connection is poisoned); `None` once `from` closes or the
/// proxy drops connections.
async fn next_chunk(
    from: &mut OwnedReadHalf,
    buffer: &mut [u8],
    settings: &watch::Receiver<Settings>,
    poisoned: &AtomicBool,
) -> Option<(usize, Duration)> {
    loop {
        let n = match from.read(buffer).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => n,
        };
        let Settings { mode, latency } = *settings.borrow();
        match mode {
            Mode::Forward => return Some((n, latency)),
            Mode::Stall => poisoned.store(true, Ordering::Release),
            Mode::Drop => return None,
        }
    }
}

/// The delay queue to the client, each chunk when its time comes (unless
/// the proxy stalled meanwhile).
async fn deliver(
    mut queued: mpsc::Receiver<(Instant, Vec<u8>)>,
    mut to: OwnedWriteHalf,
    settings: watch::Receiver<Settings>,
    poisoned: Arc<AtomicBool>,
) {
    while let Some((due, chunk)) = queued.recv().await {
        tokio::time::sleep_until(due).await;
        let mode = settings.borrow().mode;
        match mode {
            Mode::Forward => {
                if to.write_all(&chunk).await.is_err() {
                    return;
                }
            }
            Mode::Stall => poisoned.store(true, Ordering::Release),
            Mode::Drop => return,
        }
    }
}
