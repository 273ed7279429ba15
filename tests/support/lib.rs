//! Test support for the workspace's integration tests.
