//! `tender-agent`: parses flags and runs [`tender_agent::run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use tender_agent::{AgentConfig, AgentMetrics, credentials};
use tender_runtime::token::BearerToken;
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
    /// Lifetime in seconds the agent asks for each renewed hub token (at least 600).
    #[arg(
        long,
        env = "TENDER_HUB_TOKEN_LIFETIME_SECONDS",
        default_value_t = 3600
    )]
    hub_token_lifetime_seconds: u64,
    /// Renew the hub token when fewer than this many seconds of it are left.
    #[arg(
        long,
        env = "TENDER_HUB_TOKEN_REFRESH_MARGIN_SECONDS",
        default_value_t = 1200
    )]
    hub_token_refresh_margin_seconds: u64,
    /// Downstream Secret (in the agent namespace, key `kubeconfig`) where the agent stores its
    /// renewed hub kubeconfig, so a restart starts from a live token; unset: not stored.
    #[arg(long, env = "TENDER_HUB_KUBECONFIG_SECRET")]
    hub_kubeconfig_secret: Option<String>,
    /// Namespaces the agent may write to, comma-separated (`team-*` matches a prefix); unset:
    /// all but kube-system, kube-public, kube-node-lease and the agent's own, which are written
    /// only when named exactly. Objects elsewhere are refused (`RefusedByPolicy`).
    #[arg(long, env = "TENDER_ALLOWED_NAMESPACES", value_delimiter = ',')]
    allowed_namespaces: Vec<String>,
    /// Namespaces a Bundle may make the agent read from (reverse sync, valuesFrom,
    /// helmSecretName), comma-separated (`team-*` matches a prefix); unset: the same as
    /// --allowed-namespaces; `--readable-namespaces=` all. Never the agent's own namespace,
    /// never a service-account token (`ReadRefusedByPolicy`).
    #[arg(long, env = "TENDER_READABLE_NAMESPACES", value_delimiter = ',')]
    readable_namespaces: Option<Vec<String>>,
    /// Kinds the agent refuses, comma-separated `Kind.group` (`Kind` for the core group,
    /// `*.group` for a group); `--refused-kinds=` refuses none.
    #[arg(
        long,
        env = "TENDER_REFUSED_KINDS",
        value_delimiter = ',',
        default_values_t = tender_agent::policy::DEFAULT_REFUSED_KINDS.iter().map(ToString::to_string)
    )]
    refused_kinds: Vec<String>,
    /// Bounds on chart sources (docs/helm.md, "Limits").
    #[command(flatten)]
    chart_limits: tender_agent::ChartLimitFlags,
    /// Downstream ServiceAccount (`<namespace>/<name>`) the agent impersonates to apply Bundles,
    /// so RBAC bounds what a Bundle can do here; unset: Bundles are applied as the agent itself.
    #[arg(long, env = "TENDER_BUNDLE_SERVICE_ACCOUNT", value_parser = tender_types::service_account::ServiceAccountRef::parse)]
    bundle_service_account: Option<tender_types::service_account::ServiceAccountRef>,
    /// ServiceAccounts a Bundle may name in `spec.serviceAccount`, comma-separated
    /// `<namespace>/<name>`, or `*` for any; default none (others are refused,
    /// `ServiceAccountNotAllowed`).
    #[arg(
        long,
        env = "TENDER_ALLOW_BUNDLE_SERVICE_ACCOUNTS",
        value_delimiter = ','
    )]
    allow_bundle_service_accounts: Vec<String>,
    /// The hub's public signing keys (base64, comma-separated; `public-keys` of the hub's key
    /// Secret, put here by `tender cluster add`): a copy is deployed only if one of them, or a
    /// key the hub's key chain endorses from them, signed it (else HubKeyUnknown).
    #[arg(long, env = "TENDER_HUB_SIGNING_KEYS", default_value = "")]
    hub_signing_keys: String,
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
    config.chart_limits = args.chart_limits.into();
    if let Some(dir) = args.chart_cache_dir {
        config.chart_cache_dir = dir;
    }
    let non_empty = |v: Vec<String>| -> Vec<String> {
        v.into_iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    };
    config.policy = tender_agent::policy::Policy {
        allowed_namespaces: non_empty(args.allowed_namespaces),
        refused_kinds: non_empty(args.refused_kinds),
        readable_namespaces: args.readable_namespaces.map(non_empty),
    };

    config.bundle_service_account = args.bundle_service_account;
    config.allowed_bundle_service_accounts = non_empty(args.allow_bundle_service_accounts);
    config.hub_signing_keys = args.hub_signing_keys;
    for entry in &config.allowed_bundle_service_accounts {
        if entry != tender_types::service_account::ANY {
            tender_types::service_account::ServiceAccountRef::parse(entry)
                .map_err(|e| anyhow::anyhow!("--allow-bundle-service-accounts: {e}"))?;
        }
    }

    let metrics = AgentMetrics::register(Metrics::new());
    let user_agent = format!("tender-agent/{}", tender_agent::VERSION);
    let downstream = tender_runtime::client(
        args.kubeconfig.as_deref(),
        Some(metrics.shared()),
        &user_agent,
    )
    .await
    .context("connecting to this cluster")?;
    let hub_kubeconfig = kube::config::Kubeconfig::read_from(&args.hub_kubeconfig)
        .with_context(|| format!("reading {}", args.hub_kubeconfig.display()))?;
    let hub_config =
        kube::Config::from_custom_kubeconfig(hub_kubeconfig.clone(), &Default::default())
            .await
            .context("loading the hub kubeconfig")?;
    // A token credential is renewed by the agent itself (tender_agent::credentials); any
    // other kind of credential is used as it is.
    let mut renewal = None;
    let hub = match tender_runtime::token::token_of(&hub_config) {
        Some(mounted) => {
            let persist = args
                .hub_kubeconfig_secret
                .filter(|s| !s.is_empty())
                .map(|name| credentials::Persist {
                    downstream: downstream.clone(),
                    namespace: config.agent_namespace.clone(),
                    name,
                    kubeconfig: hub_kubeconfig,
                });
            let stored = match &persist {
                Some(p) => credentials::stored_token(p).await,
                None => None,
            };
            let token = BearerToken::new(credentials::fresher(mounted, stored));
            let hub = tender_runtime::token::client_with_token(
                hub_config,
                Some(metrics.shared()),
                &user_agent,
                token.clone(),
            )?;
            renewal = Some(credentials::keep_fresh(
                hub.clone(),
                token,
                config.cluster_namespace.clone(),
                credentials::Renewal {
                    lifetime: Duration::from_secs(args.hub_token_lifetime_seconds),
                    margin: Duration::from_secs(args.hub_token_refresh_margin_seconds),
                },
                persist,
                tender_runtime::shutdown_signal(),
            ));
            hub
        }
        None => tender_runtime::client::client_from_config(
            hub_config,
            Some(metrics.shared()),
            &user_agent,
        )?,
    };
    if let Some(renewal) = renewal {
        tokio::spawn(renewal);
    }
    let health = Health::new();
    tracing::info!(cluster = %config.cluster_name, cluster_namespace = %config.cluster_namespace, copy_resources_downstream = copy, "starting tender-agent");

    let server = tender_runtime::serve(args.metrics_addr, metrics.shared(), health.clone());
    tokio::select! {
        result = server => result.context("metrics server")?,
        result = tender_agent::run(hub, downstream, config, metrics, health, tender_runtime::shutdown_signal()) => result?,
    }
    Ok(())
}
