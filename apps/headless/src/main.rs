//! The `lemon-gateway` binary.
fn main() {}
