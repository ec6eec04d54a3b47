//! Process plumbing that `tender-hub` and `tender-agent` would otherwise both write:
//! logging, the Prometheus registry, the `/metrics` `/healthz` `/readyz` server, Kubernetes
//! client construction (with every apiserver request counted), Lease-based leader election,
//! the watcher every cache uses and the shutdown signal.
//!
//! Nothing here knows about tender's own resources; controllers live in the hub and agent,
//! and hand what they decided to the one [`Executor`] as a list of [`Op`]s.
//!
//! A binary wires it up like this:
//!
//! ```no_run
//! use std::sync::Arc;
//! use tender_runtime::{Health, LeaderElection, LogFormat, Metrics};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! tender_runtime::telemetry::init(LogFormat::Json, "info")?;
//! let mut metrics = Metrics::new();
//! let copies = prometheus_client::metrics::counter::Counter::<u64>::default();
//! metrics.registry_mut().register("copies_written", "Copies written", copies.clone());
//! let metrics = Arc::new(metrics);
//! let health = Health::new();
//! let client = tender_runtime::client(None, Some(metrics.clone()), "tender-hub/0.1").await?;
//! let election = LeaderElection::start(client.clone(), "tender-system", "tender-hub", "pod-abc");
//! let mut is_leader = election.subscribe();
//! let server = tender_runtime::serve(([0, 0, 0, 0], 8080).into(), metrics.clone(), health.clone());
//! health.set_ready(true); // once caches have synced
//! tokio::select! {
//!     result = server => result?,
//!     () = async { while is_leader.wait_for(|l| *l).await.is_ok() { /* run controllers until !leader */ } } => {}
//!     () = tender_runtime::shutdown_signal() => {}
//! }
//! election.release().await;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod client;
pub mod executor;
#[cfg(feature = "fake")]
pub mod fake;
pub mod impersonate;
pub mod kubeconfig;
pub mod leader;
pub mod metrics;
pub mod reconcile;
pub mod retry;
pub mod server;
pub mod telemetry;
pub mod token;
pub mod watch;

mod error;
mod signal;

pub use client::client;
pub use error::Error;
pub use executor::{Executor, ObjectKey, Op};
pub use leader::LeaderElection;
pub use metrics::Metrics;
/// Re-exported so binaries register extra families against the exact version used here.
pub use prometheus_client;
pub use reconcile::ReconcileError;
pub use server::{Health, serve};
pub use signal::shutdown_signal;
pub use telemetry::LogFormat;

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
