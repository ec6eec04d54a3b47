use clap::Parser;

fn main() -> anyhow::Result<std::process::ExitCode> {
    tender_crdgen::run(&tender_crdgen::Args::parse())
}
