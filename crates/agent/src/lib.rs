//! tender's agent: runs on a downstream cluster, reads ITS cluster namespace on the hub and
//! makes the downstream cluster match its BundleDeployments.
//!
//! For each BundleDeployment: copy the referenced Secrets/ConfigMaps into the deployment
//! namespace, only then apply the manifests (server-side apply, field manager `tender-agent`),
//! prune what the previous deployment had and this one does not, and report status. It
//! corrects drift by watching the objects it manages, cleans up on deletion (or leaves the
//! objects without tender's metadata with `keepResources`), sweeps leftovers of vanished
//! BundleDeployments at start-up, and heartbeats to the hub.
//!
//! Every reconciler has one shape: observe (caches and reads) → plan (pure functions returning
//! `tender_runtime::Op`s) → execute (one `tender_runtime::Executor` per apiserver: downstream
//! for managed objects, namespaces and inventories; the hub for status, events and heartbeat).
//!
//! Modules, each one job, none importing a module that imports it back:
//! - `run` — start-up (agent namespace, hub list, sweep; retried with kube's `DefaultBackoff`)
//!   and wiring of the watches, the heartbeat and the controller.
//! - `config` — `AgentConfig` and its defaults.
//! - `context` — the one shared `Context`, built once: clients, caches, both executors, metrics.
//! - `copies` — the hub-side reflectors of the copies and the look-up of a verified copy.
//! - `drift` — downstream caches of managed objects; their events wake the owning
//!   BundleDeployment and retire the downstream executor's memo entries.
//! - `reconcile` — the finalizer wrapper and the error policy.
//! - `deploy` — observe → plan → execute for one BundleDeployment, in the required order.
//! - `sync` — one object: read it, [`plan::object_plan`], execute, report its state.
//! - `cleanup` — finalizer cleanup, pruning, and the start-up sweep.
//! - `inventory` — the per-BundleDeployment object list downstream.
//! - `report` — status and events on the hub, as operations.
//! - `heartbeat` — the Lease and the Cluster's `status.agent`.
//! - `downstream` — discovery of downstream kinds.
//! - [`identity`] — who a deployment's content is written as (an impersonated ServiceAccount).
//! - [`plan`] and [`status`] — pure decisions and status computation; [`metrics`].
//!
//! How an event becomes a write: a watch event (a BundleDeployment, a hub copy through
//! `copies`, or a managed downstream object through `drift`) queues the BundleDeployment in the
//! controller; `reconcile` runs `deploy`, which plans each object from the hub caches and
//! discovery, records the inventory, and for each object `sync` reads the object from the
//! downstream cache (the apiserver on a miss) and asks
//! `plan::object_plan` for operations — none when nothing changed — which the downstream
//! executor carries out; `report` turns the outcome into a status write and events (none when
//! the status is unchanged) for the hub executor.

use std::future::Future;

use futures::future::FutureExt;
use kube::Client;
use tender_runtime::Health;

mod cleanup;
mod config;
mod context;
mod copies;
pub mod credentials;
mod deploy;
mod downstream;
mod drift;
mod execute;
pub mod files;
mod heartbeat;
pub mod helm;
pub mod hooks;
pub mod identity;
mod inventory;
pub mod metrics;
mod namespaces;
mod observe;
pub mod plan;
pub mod policy;
mod prune;
mod reconcile;
mod rendering;
mod report;
mod run;
pub mod status;
mod sync;
#[cfg(test)]
mod testing;
mod upstream;

pub use config::{
    AgentConfig, ChartLimitFlags, ChartLimits, DEFAULT_CLUSTER_STATUS_INTERVAL,
    DEFAULT_HEARTBEAT_INTERVAL, VERSION,
};
pub use metrics::AgentMetrics;

use config::ShutdownSignal;

/// Errors of the agent: the shared reconcile error and its `reason()` vocabulary.
pub use tender_runtime::ReconcileError as Error;

/// Result with the agent's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs the agent until `shutdown` resolves: `hub` is a client with the agent's narrow hub
/// identity, `downstream` an admin-ish client of the downstream cluster.
///
/// Start-up: ensure the agent namespace downstream, start the heartbeat, list the
/// BundleDeployments on the hub (retrying with backoff until it succeeds) and sweep
/// downstream leftovers of BundleDeployments that no longer exist, then run the controller.
/// `health` becomes ready once the controller's caches are filled.
pub async fn run(
    hub: Client,
    downstream: Client,
    config: AgentConfig,
    metrics: AgentMetrics,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    if config.cluster_namespace.is_empty() || config.cluster_name.is_empty() {
        return Err(Error::Config(
            "cluster name and cluster namespace must be set".into(),
        ));
    }
    let shutdown: ShutdownSignal = shutdown.boxed().shared();
    run::run(hub, downstream, config, metrics, health, shutdown).await
}
