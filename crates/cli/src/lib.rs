//! The `tender` command-line tool: one module per subcommand; [`app`] parses and dispatches,
//! `main.rs` only calls it.

pub mod agent_rbac;
pub mod app;
pub mod apply;
pub mod cluster;
pub mod completions;
pub mod hub;
pub mod rollout;
pub mod status;
