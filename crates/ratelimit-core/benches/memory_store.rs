//! Placeholder, replaced by the governor comparison.
fn main() {}
