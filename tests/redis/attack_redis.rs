//! Attacks on `RedisStore`'s claims, each against real servers: a store
//! shared by several tokio runtimes, one of which shuts down while it runs
//! another runtime's calls, and the like. Over-admission is measured by
//! counting admissions per key against a limit whose window cannot roll over
//! during the test (a fixed window of an hour).

use std::time::Duration;

use ratelimit_core::redis::RedisStore;
use ratelimit_core::{Decision, Store, StoreError};
use ratelimit_tests::fault_proxy::FaultProxy;
use ratelimit_tests::fixtures::fixed_window;
use ratelimit_tests::{RedisServer, build};

const HOUR: Duration = Duration::from_secs(3600);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn runtime(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Two runtimes share a store on one connection, every reply 200 ms late.
/// A call of the doomed runtime goes out alone and fills the lane; a call
/// of the serving runtime queues behind it, and the doomed runtime's
/// caller, answered, starts the batch that carries it, in a task on the
/// doomed runtime. That runtime shuts down while the batch is in flight.
/// Redis is up all along: the serving runtime's call is decided (sent
/// again if need be: counted twice at worst), never an outage that a
/// failure policy would answer.
#[test]
fn a_call_carried_by_a_runtime_that_shuts_down_is_decided_not_failed() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let serving = runtime(1);
    let store = serving.block_on(async {
        build(
            RedisStore::builder(proxy.redis_url())
                .pool_size(1)
                .call_timeout(Duration::from_secs(3)),
        )
        .await
    });
    let limit = 10;
    let policy = fixed_window("carried", limit, HOUR);
    // Loads the functions, so the calls below are one round trip each.
    serving.block_on(async {
        let d = store.check(b"warm", &policy, 1).await.expect("warm-up");
        assert!(d.is_allowed());
    });
    proxy.set_latency(ms(200));
    let doomed = runtime(1);
    let lead = {
        let (store, policy) = (store.clone(), policy.clone());
        doomed.spawn(async move { store.check(b"lead", &policy, 1).await })
    };
    std::thread::sleep(ms(50));
    let carried = {
        let (store, policy) = (store.clone(), policy.clone());
        serving.spawn(async move { store.check(b"carried", &policy, 1).await })
    };
    // The lead is answered at about 200 ms, and the batch carrying the
    // serving runtime's call goes out then, on the doomed runtime, to be
    // answered at about 400 ms.
    std::thread::sleep(ms(300));
    assert!(lead.is_finished(), "the lead call is still in flight");
    drop(doomed);
    let decided: Result<Decision, StoreError> = serving
        .block_on(carried)
        .expect("the serving runtime's task");
    let decided = decided.unwrap_or_else(|e| {
        panic!("Redis is up, yet the call failed (a failure policy would answer it): {e}")
    });
    assert!(decided.is_allowed(), "{decided:?}");
    proxy.set_latency(Duration::ZERO);
    serving.block_on(async {
        let peek = store.check(b"carried", &policy, 0).await.unwrap();
        // Counted once, or twice when it ran before its task went away.
        assert!(
            (limit - 2..=limit - 1).contains(&peek.remaining()),
            "{peek:?}"
        );
    });
}
