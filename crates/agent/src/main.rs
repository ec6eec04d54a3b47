//! `tender-agent`: parses flags and runs [`tender_agent::run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use tender_agent::{AgentConfig, AgentMetrics};
use tender_runtime::{Health, LogFormat, Metrics};

/// Copies Secrets/ConfigMaps and applies manifests from this cluster's namespace on the tender
/// hub to this cluster.
#[derive(Parser, Debug)]
#[command(name = "tender-agent", version)]
struct Args {
    /// Kubeconfig of the hub (the agent's narrow identity), usually mounted from a Secret.
    #[arg(long, env = "TENDER_HUB_KUBECONFIG")]
    hub_kubeconfig: PathBuf,
    /// Kubeconfig of this (downstream) cluster; default in-cluster, then $KUBECONFIG.
    #[arg(long, env = "TENDER_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Namespace of the Cluster object on the hub (the workspace).
    #[arg(
        long,
        env = "TENDER_WORKSPACE_NAMESPACE",
        default_value = "tender-default"
    )]
    workspace_namespace: String,
    /// Name of the Cluster object on the hub.
    #[arg(long, env = "TENDER_CLUSTER_NAME")]
    cluster_name: String,
    /// The cluster's namespace on the hub; computed from workspace and cluster name if unset.
    #[arg(long, env = "TENDER_CLUSTER_NAMESPACE")]
    cluster_namespace: Option<String>,
    /// Namespace the agent runs in downstream (holds its inventories).
    #[arg(long, env = "POD_NAMESPACE", default_value = "tender-system")]
    agent_namespace: String,
    /// Heartbeat Lease renewal interval in seconds.
    #[arg(long, env = "TENDER_HEARTBEAT_SECONDS", default_value_t = 30)]
    heartbeat_seconds: u64,
    /// Minimum seconds between writes of the Cluster's status.agent.
    #[arg(long, env = "TENDER_CLUSTER_STATUS_SECONDS", default_value_t = 300)]
    cluster_status_seconds: u64,
    /// Lease holder identity (the pod name).
    #[arg(long, env = "POD_NAME", default_value = "tender-agent")]
    identity: String,
    /// The helm binary that renders `spec.helm` charts (`helm template`).
    #[arg(long, env = "TENDER_HELM_PATH", default_value = "helm")]
    helm_path: std::path::PathBuf,
    /// Directory caching chart archives by digest (charts only; default: a temp directory).
    #[arg(long, env = "TENDER_CHART_CACHE_DIR")]
    chart_cache_dir: Option<std::path::PathBuf>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "TENDER_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Log format: text or json.
    #[arg(long, env = "TENDER_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    /// Log filter (RUST_LOG wins when set).
    #[arg(long, env = "TENDER_LOG_LEVEL", default_value = "info")]
    log_level: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tender_runtime::telemetry::init(args.log_format, &args.log_level)?;

    let copy = match tender_types::gate::copy_resources_enabled() {
        Ok(on) => on,
        Err(invalid) => {
            tracing::warn!(%invalid, "feature gate value ignored");
            false
        }
    };
    let mut config = AgentConfig::new(&args.workspace_namespace, &args.cluster_name);
    if let Some(ns) = args.cluster_namespace {
        config.cluster_namespace = ns;
    }
    config.agent_namespace = args.agent_namespace;
    config.copy_resources_downstream = copy;
    config.heartbeat_interval = Duration::from_secs(args.heartbeat_seconds.max(1));
    config.cluster_status_interval = Duration::from_secs(args.cluster_status_seconds);
    config.identity = args.identity;
    config.helm_path = args.helm_path;
    if let Some(dir) = args.chart_cache_dir {
        config.chart_cache_dir = dir;
    }

    let metrics = AgentMetrics::register(Metrics::new());
    let user_agent = format!("tender-agent/{}", tender_agent::VERSION);
    let hub = tender_runtime::client(
        Some(&args.hub_kubeconfig),
        Some(metrics.shared()),
        &user_agent,
    )
    .await
    .context("connecting to the hub")?;
    let downstream = tender_runtime::client(
        args.kubeconfig.as_deref(),
        Some(metrics.shared()),
        &user_agent,
    )
    .await
    .context("connecting to this cluster")?;
    let health = Health::new();
    tracing::info!(cluster = %config.cluster_name, cluster_namespace = %config.cluster_namespace, copy_resources_downstream = copy, "starting tender-agent");

    let server = tender_runtime::serve(args.metrics_addr, metrics.shared(), health.clone());
    tokio::select! {
        result = server => result.context("metrics server")?,
        result = tender_agent::run(hub, downstream, config, metrics, health, tender_runtime::shutdown_signal()) => result?,
    }
    Ok(())
}
