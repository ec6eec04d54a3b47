//! What the `tender-hub` binary adds to the hub library: the agent, for push mode.
//!
//! The hub library (`tender_hub`) does not depend on `tender-agent`
//! (decision 0084-hub-library-without-the-agent); it asks a [`tender_hub::push::PushRunner`] to
//! run each push cluster's agent. [`AgentRunner`] is that runner: it turns the hub's [`PushAgent`]
//! into an [`AgentConfig`] with the agent's own settings and runs `tender_agent::run`. The binary
//! (`main.rs`) and the end-to-end tests' in-process hubs use it, so both run push clusters the
//! same way.

use std::path::PathBuf;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::Client;
use tender_agent::{AgentConfig, AgentMetrics, ChartLimits};
use tender_hub::push::{PushAgent, PushRunner, Runner};
use tender_runtime::Health;

/// Runs push clusters' agents in the hub process with the agent's own settings.
#[derive(Clone)]
pub struct AgentRunner {
    /// The agent families, registered into the hub's registry (served on its `/metrics`).
    pub metrics: AgentMetrics,
    /// Bounds on chart sources (the agent's flags, decision 0076-bounded-chart-sources).
    pub chart_limits: ChartLimits,
    /// Where charts are cached by digest; `None`: the agent's default (a temp directory).
    pub chart_cache_dir: Option<PathBuf>,
    /// The Helm CLI push clusters' charts are rendered with (the agent's `--helm-path`).
    pub helm_path: PathBuf,
}

impl AgentRunner {
    /// A runner with the agent's default limits counting into `metrics`.
    pub fn new(metrics: AgentMetrics) -> Self {
        Self {
            metrics,
            chart_limits: ChartLimits::default(),
            chart_cache_dir: None,
            helm_path: PathBuf::from("helm"),
        }
    }

    /// The runner as the hub's [`tender_hub::push::PushConfig::runner`] holds it.
    pub fn shared(self) -> Runner {
        Runner(Arc::new(self))
    }

    /// The agent configuration for the hub's decision `agent`.
    pub fn agent_config(&self, agent: &PushAgent) -> AgentConfig {
        let mut config = AgentConfig::new(&agent.workspace, &agent.cluster);
        config.agent_namespace = agent.agent_namespace.clone();
        config.copy_resources_downstream = agent.copy_resources_downstream;
        config.heartbeat_interval = agent.heartbeat_interval;
        config.identity = agent.identity.clone();
        config.hub_signing_keys = agent.hub_signing_keys.clone();
        config.chart_limits = self.chart_limits.clone();
        if let Some(dir) = &self.chart_cache_dir {
            config.chart_cache_dir = dir.clone();
        }
        config.helm_path = self.helm_path.clone();
        config
    }
}

impl PushRunner for AgentRunner {
    fn run(
        &self,
        hub: Client,
        downstream: Client,
        agent: PushAgent,
    ) -> BoxFuture<'static, anyhow::Result<()>> {
        let config = self.agent_config(&agent);
        let metrics = self.metrics.clone();
        async move {
            let shutdown = futures::future::pending::<()>();
            tender_agent::run(hub, downstream, config, metrics, Health::new(), shutdown).await?;
            Ok(())
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_hubs_decision_and_the_agents_settings_make_the_agent_config() {
        let mut runner = AgentRunner::new(AgentMetrics::register(tender_runtime::Metrics::new()));
        runner.chart_limits.max_chart_bytes = 7;
        runner.chart_cache_dir = Some(PathBuf::from("/cache"));
        runner.helm_path = PathBuf::from("/usr/local/bin/helm");
        let agent = PushAgent {
            workspace: "ws".into(),
            cluster: "east".into(),
            agent_namespace: "tender-agent".into(),
            copy_resources_downstream: true,
            identity: "hub-0/push".into(),
            heartbeat_interval: Duration::from_secs(2),
            hub_signing_keys: "k".into(),
        };
        let c = runner.agent_config(&agent);
        assert_eq!(c.cluster_name, "east");
        assert_eq!(
            c.cluster_namespace,
            tender_types::names::cluster_namespace("ws", "east")
        );
        assert_eq!(c.agent_namespace, "tender-agent");
        assert!(c.copy_resources_downstream);
        assert_eq!(c.identity, "hub-0/push");
        assert_eq!(c.heartbeat_interval, Duration::from_secs(2));
        assert_eq!(c.chart_limits.max_chart_bytes, 7);
        assert_eq!(c.chart_cache_dir, PathBuf::from("/cache"));
        assert_eq!(c.helm_path, PathBuf::from("/usr/local/bin/helm"));
    }
}
