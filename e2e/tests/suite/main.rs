//! tender's end-to-end tests: one test binary, one module per area (issue 38 item 2).
//!
//! One binary links once and shares one environment per downstream-cluster count
//! ([`tender_e2e::shared_env`]) across every module, so the suite starts a handful of control
//! planes instead of one per file, and its tests run side by side (`RUST_TEST_THREADS` in
//! `.cargo/config.toml`): they keep out of each other's way by namespace and workspace. Tests
//! that stop or restart apiservers start their own ([`tender_e2e::running::OwnEnv`]).
//!
//! One area: `cargo test -p tender-e2e --test suite -- agent::`; one test: its full path.

mod agent;
mod agent_return;
mod anykind;
mod apiserver_defaults;
mod bad_inputs;
mod chart_crds;
mod chart_tls;
mod charts;
mod cli;
mod cluster_deletion;
mod cluster_status;
mod compare_patches;
mod crds;
mod credentials;
mod demo;
mod depends_on;
mod fanout;
mod faults;
mod flags;
mod fleet_apply;
mod fleet_conformance;
mod fleet_targets;
mod helm;
mod helm_hooks;
mod helm_polling;
mod helmop;
mod hostile_bundle_writer;
mod hostile_chart_server;
mod hostile_hub_tenants;
mod hub;
mod hub_rbac;
mod image_layout;
mod least_privilege;
mod options;
mod policy;
mod push;
mod quickstart;
mod real_charts;
mod resilience;
mod rollout;
mod shards;
mod signed_copies;
mod smoke;
mod split_brain;
mod template_budget;
mod testenv;
mod upstream;
