//! The in-process stores and their algorithms, no Redis: fixed tables per
//! algorithm (`algorithms`), `MemoryStore` under concurrency and at its
//! bound (`memory_store`), `LeasedStore` (`lease`), and every `StoreError`
//! through the layer and the wrappers (`store_errors`).
//!
//! The tests of a theme share one binary, so the suite links it once.

mod algorithms;
mod calendar_edges;
mod lease;
mod memory_store;
mod store_errors;
