//! A missing peer address is logged once per layer at `error`, and counted
//! for every request. Alone in its test binary: `tracing` caches per call
//! site whether anyone listens, so a test that counts events must own the
//! process's subscriber (with other tests on other threads it saw none).

use std::time::Duration;

use http::{Request, StatusCode};
use ratelimit_axum::{MemoryStore, PeerIp, Policy, RateLimitLayer};
use ratelimit_tests::events::Events;
use ratelimit_tests::fixtures::ok_service;
use ratelimit_tests::named;
use tower::{Layer, ServiceExt};

#[test]
fn no_peer_address_is_logged_once_per_layer_and_counted_each_time() {
    let events = Events::default();
    tracing::subscriber::set_global_default(events.clone())
        .expect("the only subscriber of this test binary");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let policy = named(
        "per-client",
        Policy::fixed_window(100, Duration::from_secs(60)),
    );
    let layer = RateLimitLayer::new(MemoryStore::new(), policy, PeerIp);
    let ok = ok_service();
    runtime.block_on(async {
        for _ in 0..5 {
            let response = layer
                .clone()
                .layer(ok)
                .oneshot(Request::new(String::new()))
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        }
    });
    assert_eq!(layer.stats().no_peer_address(), 5);
    assert_eq!(
        events.at(tracing::Level::ERROR),
        1,
        "one error event per layer"
    );
}
