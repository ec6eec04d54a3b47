//! The `tender` command-line tool: one module per subcommand, `main.rs` only dispatches.

pub mod cluster;
pub mod crdgen;
pub mod status;
