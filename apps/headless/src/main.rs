//! The `lemon-gateway` binary.

// A faster allocator than glibc's under many small, short-lived allocations
// across threads (events, requests); measured by `lemon-bench`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    lemon_gateway::cli::main()
}
