//! `quiver`: the command line over the Quiver library.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
