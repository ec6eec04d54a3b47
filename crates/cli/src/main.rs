//! `tender` (also usable as the kubectl plugin `kubectl-tender`): see [`tender_cli::app`].

fn main() -> std::process::ExitCode {
    tender_cli::app::main()
}
