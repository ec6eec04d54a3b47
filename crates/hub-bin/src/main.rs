//! `tender-hub`: parses flags and runs [`tender_hub::run`], with [`AgentRunner`] running the
//! push clusters' agents.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use tender_hub::{HubConfig, HubMetrics, LeaderConfig};
use tender_hub_bin::AgentRunner;
use tender_runtime::{Health, LogFormat, Metrics};

/// tender's hub: resolves Bundle targets, writes BundleDeployments into cluster namespaces and
/// copies referenced Secrets/ConfigMaps next to them.
#[derive(Debug, Parser)]
#[command(name = "tender-hub", version)]
struct Args {
    /// Kubeconfig of the hub cluster; default: in-cluster service account, then $KUBECONFIG.
    #[arg(long, env = "TENDER_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Address of the /metrics, /healthz and /readyz server.
    #[arg(long, env = "TENDER_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Log format.
    #[arg(long, env = "TENDER_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Log filter (RUST_LOG wins when set).
    #[arg(long, env = "TENDER_LOG_LEVEL", default_value = "info")]
    log_level: String,
    /// Workspace namespace to serve (repeatable, or comma-separated); none means all namespaces.
    #[arg(
        long = "workspace-namespace",
        env = "TENDER_WORKSPACE_NAMESPACES",
        value_delimiter = ','
    )]
    workspace_namespaces: Vec<String>,
    /// Run controllers only while holding the leader Lease.
    #[arg(long, env = "TENDER_LEADER_ELECTION", default_value_t = false)]
    leader_election: bool,
    /// Namespace of the leader Lease (defaults to the pod's namespace, else tender-system).
    #[arg(long, env = "POD_NAMESPACE", default_value = "tender-system")]
    lease_namespace: String,
    /// Name of the leader Lease [default: tender-hub, or tender-hub-<shard id> with --shard-id].
    #[arg(long, env = "TENDER_LEASE_NAME")]
    lease_name: Option<String>,
    /// Secret in the hub's namespace (--lease-namespace) holding the key that signs every
    /// copy; created by the leader if absent. Its `public-keys` are what agents are registered
    /// with (tender cluster add --hub-signing-keys).
    #[arg(long, env = "TENDER_SIGNING_KEY_SECRET", default_value = tender_types::names::HUB_SIGNING_KEY_SECRET)]
    signing_key_secret: String,
    /// Serve only Clusters labelled tender.dev/shard=<id> (a lowercase DNS label, at most 48
    /// characters); without it, the Clusters without that label, and fold every shard's counts
    /// into Bundle status. Run exactly one replica set without a shard id.
    #[arg(long, env = "TENDER_SHARD_ID", value_parser = parse_shard_id)]
    shard_id: Option<String>,
    /// This replica's identity in the Lease and on Events.
    #[arg(long, env = "POD_NAME", default_value = "tender-hub")]
    pod_name: String,
    /// Seconds without an agent heartbeat before a Cluster is reported offline.
    #[arg(long, env = "TENDER_AGENT_OFFLINE_AFTER_SECONDS", default_value_t = 90)]
    agent_offline_after_seconds: u64,
    /// Seconds a Cluster status change that only moves its BundleDeployment summary waits
    /// before it is written (changes within the window coalesce into one write; 0 = at once).
    #[arg(
        long,
        env = "TENDER_CLUSTER_SUMMARY_DELAY_SECONDS",
        default_value_t = 5
    )]
    cluster_summary_delay_seconds: u64,
    /// Seconds a Cluster keeps showing its ready BundleDeployments while a new version of them
    /// rolls out (WaitApplied): a rollout that completes within it writes no Cluster status; one
    /// still waiting after it is written (0 = at once).
    #[arg(
        long,
        env = "TENDER_CLUSTER_ROLLOUT_SUMMARY_DELAY_SECONDS",
        default_value_t = 30
    )]
    cluster_rollout_summary_delay_seconds: u64,
    /// Accept push-mode kubeconfigs with an exec plugin or auth-provider. Such a kubeconfig
    /// runs a command inside the hub pod, with the hub's credentials, chosen by whoever can
    /// write the Secret; see docs/push-mode.md.
    #[arg(long, env = "TENDER_ALLOW_KUBECONFIG_EXEC", default_value_t = false)]
    allow_kubeconfig_exec: bool,
    /// Seconds between two probes of each push cluster.
    #[arg(long, env = "TENDER_PUSH_PROBE_SECONDS", default_value_t = 30)]
    push_probe_seconds: u64,
    /// Largest placeholder content (bytes of keys and values) published by reverse sync.
    #[arg(long, env = "TENDER_UPSTREAM_MAX_BYTES", default_value_t = tender_types::upstream::DEFAULT_MAX_BYTES)]
    upstream_max_bytes: usize,
    /// Most bytes of content one Bundle's copies may hold on the hub, every cluster's copy
    /// counted; over it nothing new is written for the Bundle (`CopyLimitExceeded`).
    #[arg(long, env = "TENDER_MAX_COPIED_BYTES_PER_BUNDLE", default_value_t = tender_hub::DEFAULT_MAX_COPIED_BYTES_PER_BUNDLE)]
    max_copied_bytes_per_bundle: usize,
    /// Kinds Bundles may copy downstream, comma-separated `<apiVersion>/<Kind>` (e.g.
    /// `v1/Secret,v1/ConfigMap,kyverno.io/v1/ClusterPolicy`). Kinds other than Secret and
    /// ConfigMap travel inside carrier Secrets and are never instantiated on the hub.
    #[arg(long, env = "TENDER_COPYABLE_KINDS", default_value = tender_types::copy::DEFAULT_COPYABLE_KINDS)]
    copyable_kinds: String,
    /// Bounds on the chart sources of push clusters' in-hub agents (the agent's flags).
    #[command(flatten)]
    chart_limits: tender_agent::ChartLimitFlags,
    /// Directory where push clusters' charts (`spec.helm`) are cached by digest (charts only;
    /// default: a temp directory). The chart mounts a writable volume there.
    #[arg(long, env = "TENDER_CHART_CACHE_DIR")]
    chart_cache_dir: Option<PathBuf>,
    /// The Helm CLI push clusters' charts are rendered with (the image sets it; the agent's
    /// flag of the same name).
    #[arg(long, env = "TENDER_HELM_PATH", default_value = "helm")]
    helm_path: PathBuf,
}

fn parse_shard_id(id: &str) -> Result<String, String> {
    tender_types::labels::validate_shard_id(id).map(|()| id.to_string())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tender_runtime::telemetry::init(args.log_format, &args.log_level)?;

    // The gate is read in exactly one place (tender_types::gate); an invalid value is reported once.
    let copy = tender_types::gate::copy_resources_enabled().unwrap_or_else(|error| {
        tracing::warn!(%error, "feature gate");
        false
    });
    tracing::info!(
        copy_resources_downstream = copy,
        workspaces = ?args.workspace_namespaces,
        leader_election = args.leader_election,
        shard = ?args.shard_id,
        allow_kubeconfig_exec = args.allow_kubeconfig_exec,
        "starting tender-hub"
    );

    let mut metrics = Metrics::new();
    let hub_metrics = HubMetrics::register(&mut metrics);
    // The push clusters' in-hub agents count into the same registry, served on /metrics.
    let push_metrics = tender_agent::AgentMetrics::register(metrics);
    let metrics = push_metrics.shared();
    let runner = AgentRunner {
        metrics: push_metrics,
        chart_limits: args.chart_limits.into(),
        chart_cache_dir: args.chart_cache_dir,
        helm_path: args.helm_path,
    };
    let health = Health::new();
    let user_agent = format!("tender-hub/{}", env!("CARGO_PKG_VERSION"));
    let client = tender_runtime::client(
        args.kubeconfig.as_deref(),
        Some(metrics.clone()),
        &user_agent,
    )
    .await
    .context("building the hub's Kubernetes client")?;

    let config = HubConfig {
        copy_resources_downstream: copy,
        workspace_namespaces: args.workspace_namespaces,
        signing: tender_hub::signing::SigningConfig {
            namespace: args.lease_namespace.clone(),
            secret_name: args.signing_key_secret,
        },
        signing_key_poll: std::time::Duration::from_secs(10),
        leader_election: args.leader_election.then(|| LeaderConfig {
            namespace: args.lease_namespace,
            lease_name: args
                .lease_name
                .clone()
                .unwrap_or_else(|| tender_types::labels::hub_lease_name(args.shard_id.as_deref())),
            identity: args.pod_name.clone(),
        }),
        agent_offline_after: std::time::Duration::from_secs(args.agent_offline_after_seconds),
        cluster_summary_delay: std::time::Duration::from_secs(args.cluster_summary_delay_seconds),
        cluster_rollout_summary_delay: std::time::Duration::from_secs(
            args.cluster_rollout_summary_delay_seconds,
        ),
        instance: args.pod_name,
        push: tender_hub::push::PushConfig {
            allow_kubeconfig_exec: args.allow_kubeconfig_exec,
            probe_interval: std::time::Duration::from_secs(args.push_probe_seconds.max(1)),
            runner: Some(runner.shared()),
            ..Default::default()
        },
        upstream_max_bytes: args.upstream_max_bytes,
        max_copied_bytes_per_bundle: args.max_copied_bytes_per_bundle,
        shard_id: args.shard_id,
        copyable_kinds: tender_types::copy::CopyableKind::parse_list(&args.copyable_kinds)
            .map_err(anyhow::Error::msg)
            .context("--copyable-kinds")?,
    };
    let server = tender_runtime::serve(args.metrics_addr, metrics.clone(), health.clone());
    tokio::select! {
        result = server => result.context("metrics and health server")?,
        result = tender_hub::run(client, config, metrics, hub_metrics, health, tender_runtime::shutdown_signal()) => {
            result.context("hub controllers")?
        }
    }
    Ok(())
}
