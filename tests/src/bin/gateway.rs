//! The `lemon-gateway` command line, built inside this package so end-to-end tests
//! can start the real server and client as users do.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    lemon_gateway::cli::main()
}
