//! The `lemon-gateway` binary.

fn main() -> std::process::ExitCode {
    lemon_gateway::cli::main()
}
