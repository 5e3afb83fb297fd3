//! Fake vendor CLI.
fn main() {}
