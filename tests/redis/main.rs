//! `RedisStore` and the stores built on it, against real Redis servers,
//! clusters and ACL users started by `ratelimit_tests`: decisions against
//! `MemoryStore` (`redis_store`, `semaphore`, `sliding_log`,
//! `parameter_changes`, `bounded_work`), clusters (`redis_cluster`),
//! coalescing (`coalesce`), bb8 pools (`bb8_pool`), ACLs (`redis_acl`),
//! permits (`permits`), the admin API (`admin`), several regions
//! (`multi_region`), settlements (`settle`), calendar periods (`calendar`)
//! and the test kit itself (`testkit`).
//!
//! Every test starts servers of its own on free ports, so the tests of these
//! modules run side by side in one binary, which the suite links once.

mod admin;
mod attack_moves;
mod attack_redis;
mod attack_storm;
mod bb8_pool;
mod bounded_work;
mod calendar;
mod calendar_admin;
mod coalesce;
mod multi_region;
mod multi_region_snapshot;
mod parameter_changes;
mod permits;
mod redis_acl;
mod redis_cluster;
mod redis_store;
mod semaphore;
mod settle;
mod shared;
mod sliding_log;
mod testkit;
