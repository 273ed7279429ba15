//! The examples as real processes on free loopback ports, asked by real
//! clients: `quickstart`, the axum examples (`axum_examples`), `tonic_grpc`,
//! `bench` (`bench_example`) and `distributed` on a shared Redis.
//!
//! One binary, so the suite links it once. Environment variables are given
//! to the child processes only, never set in this process.

mod axum_examples;
mod bench_example;
mod distributed;
mod hostile_clients;
mod quickstart;
mod tonic_grpc;
