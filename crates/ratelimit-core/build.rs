//! Test hooks without a published feature.
//!
//! The workspace's tests replay one timeline through `MemoryStore` and
//! `RedisStore`, so they need the Redis scripts on a manual clock
//! (`script_clock_for_tests`), and the cluster's refund script to send
//! again (`cross_slot_sources_for_tests`). That is no API: every Cargo feature is
//! published, so the hooks sit behind `cfg(ratelimit_test_hooks)` instead,
//! which only this workspace turns on (`.cargo/config.toml` sets
//! `RATELIMIT_TEST_HOOKS=1`). A build from crates.io never has them.
//! (`--cfg` in `RUSTFLAGS` would do the same, but rebuilds every dependency
//! and is dropped whenever a user sets `RUSTFLAGS` of their own.)

fn main() {
    println!("cargo::rustc-check-cfg=cfg(ratelimit_test_hooks)");
    println!("cargo::rerun-if-env-changed=RATELIMIT_TEST_HOOKS");
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var_os("RATELIMIT_TEST_HOOKS").is_some_and(|value| value == "1") {
        println!("cargo::rustc-cfg=ratelimit_test_hooks");
    }
}
