//! Adversarial tests of the store's own connections when they stall or
//! break: a connection whose requests are held on the way (a network that
//! delays one connection's bytes, then delivers them, as TCP
//! retransmissions do), openings the node closes, and a storm of closed
//! connections under concurrency permits.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratelimit_core::redis::RedisStore;
use ratelimit_core::{Policy, Store};
use ratelimit_tests::{RedisServer, build, small_store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::attack_moves::{KILL, PermitLoad, assert_no_errors};

/// A loopback proxy that can hold the requests of the connections open so
/// far (what their clients send is kept, in order, not lost) while new
/// connections flow, then deliver them: one connection's bytes delayed on
/// the network (retransmissions) and delivered late, as TCP does.
struct HoldingProxy {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    /// Connections numbered below this have their requests held.
    hold_below: Arc<AtomicU64>,
    /// How many of the next connections to close as soon as accepted.
    close_next: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

/// A Redis server, a [`HoldingProxy`] in front of it, and a store of
/// `connections` connections on the proxy (see `small_store`).
async fn behind_a_proxy(
    connections: u32,
    max_batch: usize,
    call_timeout: Duration,
) -> (RedisServer, HoldingProxy, RedisStore) {
    let server = RedisServer::start();
    let proxy = HoldingProxy::start(server.addr()).await;
    let store = small_store(proxy.url(), connections, max_batch, call_timeout).await;
    (server, proxy, store)
}

impl HoldingProxy {
    async fn start(upstream: SocketAddr) -> HoldingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicU64::new(0));
        let hold_below = Arc::new(AtomicU64::new(0));
        let close_next = Arc::new(AtomicU64::new(0));
        let (count, hold, close) = (accepted.clone(), hold_below.clone(), close_next.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let n = count.fetch_add(1, Ordering::SeqCst);
                if close
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1))
                    .is_ok()
                {
                    drop(client);
                    continue;
                }
                let Ok(Ok(server)) =
                    tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(upstream))
                        .await
                else {
                    continue;
                };
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                let hold = hold.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0; 64 * 1024];
                    while let Ok(read) = from_client.read(&mut buf).await {
                        if read == 0 {
                            break;
                        }
                        // Held, not dropped: delivered in order once let go
                        // (for 30 s at most).
                        let held = Instant::now();
                        while n < hold.load(Ordering::SeqCst)
                            && held.elapsed() < Duration::from_secs(30)
                        {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        if to_server.write_all(&buf[..read]).await.is_err() {
                            break;
                        }
                    }
                    let _ = to_server.shutdown().await;
                });
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                    let _ = to_client.shutdown().await;
                });
            }
        });
        HoldingProxy {
            addr,
            accepted,
            hold_below,
            close_next,
            accept,
        }
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Holds the requests of every connection accepted so far.
    fn hold_existing(&self) {
        let accepted = self.accepted.load(Ordering::SeqCst);
        self.hold_below.store(accepted, Ordering::SeqCst);
    }

    /// Closes the next `n` connections as soon as they are accepted.
    fn close_next(&self, n: u64) {
        self.close_next.store(n, Ordering::SeqCst);
    }

    /// Delivers what was held, and holds nothing more.
    fn let_go(&self) {
        self.hold_below.store(0, Ordering::SeqCst);
    }
}

impl Drop for HoldingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A concurrency check whose connection stalls (its request held on the
/// way) times out; the store drops the stalled connection, and its
/// unclaimed permit is released in the background. The release must run
/// after the check (the check may still run: a stalled connection is not
/// a broken one), so it must go on the connection the check went on
/// (`unclaimed.rs`). When the store also *tells* the calls on a stalled
/// connection that it broke (the `watch` signal of `Connections::discard`),
/// the release, sent on that connection, fails at once as "connection
/// broke", goes through the pool on a new connection, and runs before the
/// check: when the held request is delivered, the check takes the permit,
/// and nothing ever releases it. The key then has no permit to give for
/// the whole lease (an hour here), though nothing holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_connection_leaves_no_permit_held() {
    for max_batch in [1, 16] {
        let (_server, proxy, store) =
            behind_a_proxy(1, max_batch, Duration::from_millis(200)).await;
        let policy = Policy::concurrency(1, Duration::from_secs(3600))
            .unwrap()
            .with_name("held")
            .unwrap();
        // The connection open and the scripts loaded: a permit taken and given back.
        let d = store.check(b"k", &policy, 1).await.expect("warm-up");
        assert!(d.is_allowed(), "warm-up");
        store
            .release(b"k", &policy, d.permit().expect("a permit"))
            .await
            .expect("warm-up release");

        proxy.hold_existing();
        let stalled = store.check(b"k", &policy, 1).await;
        assert!(
            stalled.is_err(),
            "a check on a stalled connection: {stalled:?}"
        );
        // Time for the unclaimed permit's release (retried a call timeout
        // apart while the store is unreachable).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // The held check reaches Redis now, and so does whatever the store
        // queued behind it on that connection.
        proxy.let_go();
        tokio::time::sleep(Duration::from_millis(500)).await;

        let mut allowed = false;
        for _ in 0..3 {
            if let Ok(d) = store.check(b"k", &policy, 1).await {
                allowed = d.is_allowed();
                break;
            }
        }
        assert!(
            allowed,
            "max_batch {max_batch}: the permit of the check that timed out is left held \
             (its release ran before it, on another connection)"
        );
    }
}

/// Two concurrency checks on one connection that stalls: the first times
/// out, and the store drops the connection. The second, still waiting on
/// it, must not be sent again on a new connection (it is still on its way,
/// and may run later), or its copy is allowed, the caller uses and releases
/// the permit, and then the late original takes it again, for the whole
/// lease: with a limit of 2, both permits were left held, and the key
/// refused every request though nothing held a permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_a_stalled_connection_is_not_sent_again() {
    let (_server, proxy, store) = behind_a_proxy(1, 1, Duration::from_millis(300)).await;
    let max = 2;
    let policy = Policy::concurrency(max, Duration::from_secs(3600))
        .unwrap()
        .with_name("held")
        .unwrap();
    let d = store.check(b"k", &policy, 1).await.expect("warm-up");
    store
        .release(b"k", &policy, d.permit().expect("a permit"))
        .await
        .expect("warm-up release");

    proxy.hold_existing();
    let first = tokio::spawn({
        let (store, policy) = (store.clone(), policy.clone());
        async move { store.check(b"k", &policy, 1).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let second = store.check(b"k", &policy, 1).await;
    let first = first.await.unwrap();
    assert!(first.is_err(), "the first check stalled: {first:?}");
    if let Ok(d) = &second
        && let Some(permit) = d.permit()
    {
        // Sent again and allowed: the caller is done with it at once.
        store.release(b"k", &policy, permit).await.expect("release");
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.let_go();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut got = 0;
    for _ in 0..max {
        let d = store.check(b"k", &policy, 1).await.expect("after");
        got += u64::from(d.is_allowed());
    }
    assert_eq!(
        got, max,
        "permits left held after every check ended and every permit was released \
         (the second check: {second:?})"
    );
}

/// The node closes the store's connection, and then the next two it opens
/// (as a storm of `CLIENT KILL` does now and then: a release failed so,
/// "broken pipe", 1 call in about 25,000 under 48 tasks): with 2
/// connections a call has 3 attempts, yet the first, an opening closed
/// twice, failed the call, every node up (an opening the node closes was
/// tried only once more, and its error ended the call). It goes on with
/// its attempts left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openings_closed_twice_in_a_row_fail_no_call_with_attempts_left() {
    for max_batch in [1, 16] {
        let (server, proxy, store) = behind_a_proxy(2, max_batch, Duration::from_secs(2)).await;
        let policy =
            ratelimit_tests::fixtures::fixed_window("closed", 10, ratelimit_tests::NO_EDGE);
        store.check(b"k", &policy, 1).await.expect("warm-up");
        tokio::task::block_in_place(|| {
            server.cli(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        proxy.close_next(2);
        let d = store.check(b"k", &policy, 1).await;
        assert!(
            d.as_ref().is_ok_and(|d| d.is_allowed()),
            "max_batch {max_batch}: a call failed with attempts left, every node up: {d:?}"
        );
    }
}

/// The kills of a storm: every client connection of each node closed, 120
/// times about 5 ms apart, while `load` runs.
async fn kill_again_and_again(kill: &(dyn Fn() + Sync)) {
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..120 {
        tokio::task::block_in_place(kill);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// 48 tasks take concurrency permits (3 per key, a lease of an hour), a
/// third of the checks cancelled after a short while, and give them back,
/// through a storm: never more than 3 held at once per key, no error, and
/// once every unclaimed permit is released each key gives its 3 permits
/// again.
///
/// Every denied or cancelled check releases its permit id in the
/// background, first on the connection it went on. In a storm that
/// connection has mostly broken, and each such release waited a pause (a
/// second, from a call timeout of 2 s) before it went through the pool: the
/// store's quota of 1,024 releases under way filled (about 10,000 releases
/// skipped in a run), and the permits that cancelled checks had taken were
/// left to their lease. Every key ended with all 3 permits held, nothing
/// holding them, in 8 runs of 8.
async fn permits_storm(store: &RedisStore, kill: &(dyn Fn() + Sync)) {
    let max = 3;
    let policy = Policy::concurrency(max, Duration::from_secs(3600))
        .unwrap()
        .with_name("conc")
        .unwrap();
    let keys: Vec<String> = (0..8).map(|k| format!("c{k}")).collect();
    for key in &keys {
        store.check(key.as_bytes(), &policy, 0).await.expect("peek");
    }
    let load = PermitLoad::start(store, &policy, &keys, Duration::from_secs(20));
    kill_again_and_again(kill).await;
    // Unclaimed permits' releases run in tasks of their own.
    let load = load
        .stop("permits storm", Duration::from_millis(1500))
        .await;
    load.assert_none_held(store, &policy, &keys, max).await;
    assert_no_errors(&load.tally);
}

async fn one_node_permits(max_batch: Option<usize>) {
    let server = RedisServer::start();
    let mut builder = RedisStore::builder(server.url()).call_timeout(Duration::from_secs(2));
    if let Some(max_batch) = max_batch {
        builder = builder.max_batch(max_batch);
    }
    let store = build(builder).await;
    permits_storm(&store, &|| {
        server.cli(&KILL);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_on_one_node_coalesced_leaves_no_permit_held() {
    one_node_permits(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_on_one_node_uncoalesced_leaves_no_permit_held() {
    one_node_permits(Some(1)).await;
}
