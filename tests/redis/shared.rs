//! Stores several modules of this binary build alike.

use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::RedisStore;
use ratelimit_tests::{CALL_TIMEOUT, RedisCluster, build};

/// A store on `cluster` whose scripts take their time from `clock`, calls
/// timing out after [`CALL_TIMEOUT`] (as `redis_store_on_clock` on one
/// node).
pub(crate) async fn cluster_store_on_clock(
    cluster: &RedisCluster,
    clock: &ManualClock,
) -> RedisStore {
    build(
        RedisStore::cluster_builder(cluster.urls())
            .script_clock_for_tests(clock.clone())
            .call_timeout(CALL_TIMEOUT),
    )
    .await
}
