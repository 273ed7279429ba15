//! The layer as a service sees it: `RateLimitLayer` with `tower-test`
//! (`tower_layer`), every rate-limit header over loopback (`headers`), the
//! client IP behind proxies (`client_ip`), hostile input (`hostile_input`),
//! missing keys (`missing_key`), metrics (`metrics`), shadow policies
//! (`shadow`), the wait mode for outbound calls (`outbound_client`),
//! policies and rules from configuration (`config`), and costs settled after
//! the response (`settle_layer`).
//!
//! Metrics are read through local recorders and `tracing` through scoped
//! subscribers, so the tests of these modules run side by side in one
//! binary, which the suite links once.

mod bodies_and_rules;
mod client_bodies;
mod client_ip;
mod config;
mod headers;
mod hostile_input;
mod metrics;
mod missing_key;
mod outbound_client;
mod settle_layer;
mod shadow;
mod tower_layer;
