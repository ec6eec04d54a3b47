//! Harness for running tender-agent in-process in end-to-end tests.
//!
//! Each agent runs as its own task on the test's runtime, with its own metrics and clients, so
//! a test can run several agents at once (also two agents of different Cluster registrations
//! against the same downstream cluster), stop one gracefully, or kill it mid-work.

use std::time::Duration;

use anyhow::{Context, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tender_agent::{AgentConfig, AgentMetrics};
use tender_runtime::{Health, Metrics};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::{ADMIN_USER, TestEnv};

pub use tender_agent::AgentConfig as Config;

/// A running in-process agent.
pub struct AgentHandle {
    task: JoinHandle<tender_agent::Result<()>>,
    stop: Option<oneshot::Sender<()>>,
    /// The agent's metrics (its `kube_requests_total` counts hub and downstream requests).
    pub metrics: AgentMetrics,
    /// The agent's readiness flag.
    pub health: Health,
    /// The configuration it runs with.
    pub config: AgentConfig,
}

impl AgentHandle {
    /// Graceful stop: finishes in-flight reconciles, then returns the agent's result.
    pub async fn stop(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .context("agent did not stop within 30s")??
            .context("agent returned an error")
    }

    /// Hard stop, like a crashed process: aborts the task wherever it is.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    /// Whether the agent task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Hub and downstream write requests so far (create, update, patch, delete).
    pub fn write_requests(&self) -> u64 {
        let m = self.metrics.shared();
        let text = m.encode();
        text.lines()
            .filter(|l| l.starts_with("kube_requests_total{"))
            .filter(|l| {
                ["create", "update", "patch", "delete", "deletecollection"]
                    .iter()
                    .any(|v| l.contains(&format!("verb=\"{v}\"")))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Write requests (create, update, patch, delete) on Secrets, ConfigMaps and Namespaces:
    /// the agent writes those only downstream (on the hub it writes Leases, Cluster and
    /// BundleDeployment status and Events), so this counts its downstream writes as they leave
    /// its client.
    pub fn downstream_write_requests(&self) -> u64 {
        let m = self.metrics.shared();
        ["secrets", "configmaps", "namespaces"]
            .iter()
            .flat_map(|r| {
                ["create", "update", "patch", "delete", "deletecollection"]
                    .map(|verb| m.kube_requests(verb, r, ""))
            })
            .sum()
    }

    /// Write requests excluding the heartbeat (Lease renewals and Cluster status).
    pub fn non_heartbeat_writes(&self) -> u64 {
        let m = self.metrics.shared();
        let hb =
            m.kube_requests("patch", "leases", "") + m.kube_requests("patch", "clusters", "status");
        self.write_requests() - hb
    }
}

/// A kube client from kubeconfig YAML whose requests are counted in `metrics`.
pub async fn counted_client(yaml: &str, metrics: &AgentMetrics) -> Result<kube::Client> {
    let kc = Kubeconfig::from_yaml(yaml).context("parsing kubeconfig")?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(tender_runtime::client::client_from_config(
        config,
        Some(metrics.shared()),
        "tender-agent-e2e",
    )?)
}

/// Starts an agent for `config`'s Cluster: hub access through `hub_kubeconfig` (the agent's
/// own narrow identity, e.g. from the hub harness), downstream as admin of `downstream`
/// (a cluster name of `env`, which may be the hub itself).
pub async fn start_agent(
    env: &TestEnv,
    hub_kubeconfig: &str,
    downstream: &str,
    config: AgentConfig,
) -> Result<AgentHandle> {
    let down = env.kubeconfig_as(downstream, ADMIN_USER);
    start_agent_with(hub_kubeconfig, &down, config).await
}

/// Like [`start_agent`], with the downstream reached through `downstream_kubeconfig` (YAML; e.g.
/// an admin kubeconfig rewritten to go through a [`crate::proxy::WriteGate`]).
pub async fn start_agent_with(
    hub_kubeconfig: &str,
    downstream_kubeconfig: &str,
    config: AgentConfig,
) -> Result<AgentHandle> {
    let metrics = AgentMetrics::register(Metrics::new());
    let hub = counted_client(hub_kubeconfig, &metrics).await?;
    let down = counted_client(downstream_kubeconfig, &metrics).await?;
    let health = Health::new();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(tender_agent::run(
        hub,
        down,
        config.clone(),
        metrics.clone(),
        health.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    Ok(AgentHandle {
        task,
        stop: Some(stop),
        metrics,
        health,
        config,
    })
}
