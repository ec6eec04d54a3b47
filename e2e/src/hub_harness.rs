//! Harness for running tender-hub in-process in end-to-end tests.
//!
//! Each test starts its own hub scoped to its own workspace namespace, so tests run in
//! parallel against one hub apiserver. The hub's client counts its requests, so a test can
//! assert "no writes" from the hub's own metrics.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tender_hub::{HubConfig, HubMetrics, LeaderConfig};
use tender_runtime::{Health, Metrics};
use tender_types::names;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::{ADMIN_USER, HUB, TestEnv, eventually, kubeconfig_yaml};

/// Verbs that change state on the apiserver.
pub const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// A hub config for tests: serves only `workspace`, copies on, and competes for its own
/// Lease in the workspace (so parallel tests never share a leader).
pub fn hub_config(workspace: &str) -> HubConfig {
    HubConfig {
        copy_resources_downstream: true,
        workspace_namespaces: vec![workspace.to_string()],
        leader_election: Some(LeaderConfig {
            namespace: workspace.to_string(),
            lease_name: "tender-hub".to_string(),
            identity: crate::unique_name("hub"),
        }),
        instance: format!("tender-hub-e2e-{workspace}"),
        // The key Secret in the workspace: each test's hub has its own key.
        signing: tender_hub::signing::SigningConfig {
            namespace: workspace.to_string(),
            ..Default::default()
        },
        ..HubConfig::default()
    }
}

/// The public signing keys of the hub whose key Secret is in `namespace` (waits for the hub
/// to create it): what an agent is registered with.
pub async fn hub_signing_keys(hub: &kube::Client, namespace: &str) -> String {
    let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(hub.clone(), namespace);
    let name = tender_types::names::HUB_SIGNING_KEY_SECRET;
    for _ in 0..600 {
        if let Ok(Some(s)) = api.get_opt(name).await
            && let Some(k) = s
                .data
                .and_then(|d| d.get(tender_hub::signing::PUBLIC_KEYS_KEY).cloned())
        {
            return String::from_utf8_lossy(&k.0).into_owned();
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the hub's signing key Secret {namespace}/{name} never appeared");
}

/// A hub running in this process.
pub struct HubHandle {
    /// The hub's metrics registry (its client counts every request here).
    pub metrics: Arc<Metrics>,
    /// The hub's own metric families.
    pub hub_metrics: HubMetrics,
    /// The hub's readiness.
    pub health: Health,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), tender_hub::Error>>>,
}

/// One `kube_requests_total` series: verb, resource, subresource and count.
pub type RequestSeries = (String, String, String, u64);

fn label<'a>(labels: &'a str, key: &str) -> &'a str {
    let pat = format!("{key}=\"");
    labels
        .find(&pat)
        .map(|i| &labels[i + pat.len()..])
        .and_then(|rest| rest.split('"').next())
        .unwrap_or("")
}

/// Every `kube_requests_total` series in an OpenMetrics text.
pub fn request_series(text: &str) -> Vec<RequestSeries> {
    series_of(text, "kube_requests_total")
}

/// Every series of `family`, labelled by verb, resource and subresource like
/// `kube_requests_total` (e.g. `kube_requests_in_flight`), in an OpenMetrics text.
pub fn series_of(text: &str, family: &str) -> Vec<RequestSeries> {
    let prefix = format!("{family}{{");
    text.lines()
        .filter_map(|line| line.strip_prefix(prefix.as_str()))
        .filter_map(|rest| {
            let (labels, value) = rest.split_once("} ")?;
            Some((
                label(labels, "verb").to_string(),
                label(labels, "resource").to_string(),
                label(labels, "subresource").to_string(),
                value.trim().parse().ok()?,
            ))
        })
        .collect()
}

impl HubHandle {
    /// Write requests (create/update/patch/delete) the hub has sent, leader-election Lease
    /// renewals excluded.
    pub fn writes(&self) -> u64 {
        self.write_series().iter().map(|s| s.3).sum()
    }

    /// The non-zero write series, for failure messages.
    pub fn write_series(&self) -> Vec<RequestSeries> {
        request_series(&self.metrics.encode())
            .into_iter()
            .filter(|(verb, resource, _, n)| {
                *n > 0 && WRITE_VERBS.contains(&verb.as_str()) && resource != "leases"
            })
            .collect()
    }

    /// Reconciliations started by `controller` (`bundle`, `cluster`, `clustergroup`).
    pub fn reconciles(&self, controller: &str) -> u64 {
        let pat = format!("reconciles_total{{controller=\"{controller}\"}} ");
        self.metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(&pat).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0)
    }

    /// Failed reconciliations of `controller`, every reason summed.
    pub fn reconcile_errors(&self, controller: &str) -> u64 {
        let pat = format!("reconcile_errors_total{{controller=\"{controller}\",");
        self.metrics
            .encode()
            .lines()
            .filter_map(|l| l.strip_prefix(&pat))
            .filter_map(|rest| rest.rsplit_once(' ')?.1.trim().parse::<u64>().ok())
            .sum()
    }

    /// Waits until the hub reports ready (caches synced, controllers running).
    pub async fn wait_ready(&self, timeout: Duration) {
        let health = self.health.clone();
        eventually("the hub to become ready", timeout, || {
            let ready = health.is_ready();
            async move { Ok::<_, std::convert::Infallible>(ready.then_some(())) }
        })
        .await;
    }

    /// Stops the hub (releasing its Lease) and waits for it to finish.
    pub async fn stop(mut self) -> Result<()> {
        self.shutdown().await
    }

    async fn shutdown(&mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.context("hub task panicked")??;
        }
        Ok(())
    }
}

impl Drop for HubHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Starts a hub in-process against `env`'s hub cluster (as admin) and waits until it is
/// ready. With leader election configured, ready also means it leads.
pub async fn start_hub(env: &TestEnv, config: HubConfig) -> Result<HubHandle> {
    let leading = config.leader_election.is_some();
    let handle = spawn_hub(&env.kubeconfig_as(HUB, ADMIN_USER), config).await?;
    if leading {
        // A standby is ready too; wait for this instance to hold the Lease and sync.
        let m = handle.metrics.clone();
        eventually(
            "the hub to lead and start its controllers",
            Duration::from_secs(60),
            || {
                let started = m
                    .encode()
                    .contains("kube_requests_total{verb=\"watch\",resource=\"bundles\"");
                async move { Ok::<_, std::convert::Infallible>(started.then_some(())) }
            },
        )
        .await;
    }
    handle.wait_ready(Duration::from_secs(60)).await;
    Ok(handle)
}

/// Starts a hub in-process talking to the apiserver of `kubeconfig` (YAML; e.g. one rewritten
/// to go through a proxy) and returns at once, without waiting for it to be ready or to lead.
pub async fn spawn_hub(kubeconfig: &str, mut config: HubConfig) -> Result<HubHandle> {
    let mut metrics = Metrics::new();
    let hub_metrics = HubMetrics::register(&mut metrics);
    // Like the binary: push clusters' in-hub agents run by the binary's runner and count into
    // the hub's registry.
    let push_metrics = tender_agent::AgentMetrics::register(metrics);
    let metrics = push_metrics.shared();
    if config.push.runner.is_none() {
        config.push.runner = Some(tender_hub_bin::AgentRunner::new(push_metrics).shared());
    }
    let kubeconfig = Kubeconfig::from_yaml(kubeconfig)?;
    let kconfig =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = tender_runtime::client::client_from_config(
        kconfig,
        Some(metrics.clone()),
        "tender-hub-e2e",
    )?;
    let health = Health::new();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(tender_hub::run(
        client,
        config,
        metrics.clone(),
        hub_metrics.clone(),
        health.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    Ok(HubHandle {
        metrics,
        hub_metrics,
        health,
        stop: Some(stop_tx),
        task: Some(task),
    })
}

/// A kubeconfig for the hub cluster with the identity of `cluster`'s agent: a token of its
/// ServiceAccount from the TokenRequest API (waits until the hub has created the account),
/// valid for an hour, the test CA and the hub's address.
pub async fn agent_kubeconfig(
    env: &TestEnv,
    hub: &kube::Client,
    workspace: &str,
    cluster: &str,
) -> Result<String> {
    let ns = names::cluster_namespace(workspace, cluster);
    let token = agent_token(hub, &ns, Duration::from_secs(3600)).await?;
    let hub_cluster = env.cluster(HUB);
    Ok(kubeconfig_yaml(
        HUB,
        &hub_cluster.server,
        env.ca_pem(),
        &format!("tender-agent-{cluster}"),
        &token,
    ))
}

/// A token of the agent ServiceAccount in cluster namespace `ns` expiring after `lifetime`
/// (TokenRequest API, as `tender cluster add` asks for it), once the hub has created the
/// account.
pub async fn agent_token(hub: &kube::Client, ns: &str, lifetime: Duration) -> Result<String> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: Api<ServiceAccount> = Api::namespaced(hub.clone(), ns);
    eventually(
        &format!("the agent ServiceAccount in {ns}"),
        Duration::from_secs(60),
        || async {
            Ok::<_, kube::Error>(
                accounts
                    .get_opt(names::AGENT_SERVICE_ACCOUNT)
                    .await?
                    .map(|_| ()),
            )
        },
    )
    .await;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(i64::try_from(lifetime.as_secs())?),
            ..Default::default()
        }),
        ..Default::default()
    };
    let issued = accounts
        .create_token_request(names::AGENT_SERVICE_ACCOUNT, &Default::default(), &request)
        .await
        .with_context(|| format!("TokenRequest for the agent of {ns}"))?;
    let token = issued.status.and_then(|s| s.token).unwrap_or_default();
    if token.is_empty() {
        bail!("TokenRequest for the agent of {ns} returned no token");
    }
    Ok(token)
}

/// The public signing keys an agent of workspace `ws` is registered with: those of the
/// in-process hub serving it (its key Secret in the workspace), else of every hub key Secret
/// in the environment (a hub binary's, in its release namespace; test environments only).
pub(crate) async fn test_hub_signing_keys(hub: &kube::Client, ws: &str) -> String {
    use k8s_openapi::api::core::v1::Secret;
    let name = tender_types::names::HUB_SIGNING_KEY_SECRET;
    let field = format!("metadata.name={name}");
    for _ in 0..100 {
        let own = Api::<Secret>::namespaced(hub.clone(), ws)
            .get_opt(name)
            .await;
        let found: Vec<Secret> = match own {
            Ok(Some(s)) => vec![s],
            _ => Api::<Secret>::all(hub.clone())
                .list(&kube::api::ListParams::default().fields(&field))
                .await
                .map(|l| l.items)
                .unwrap_or_default(),
        };
        let keys: Vec<String> = found
            .into_iter()
            .filter_map(|s| s.data?.get(tender_hub::signing::PUBLIC_KEYS_KEY).cloned())
            .map(|k| String::from_utf8_lossy(&k.0).into_owned())
            .collect();
        if !keys.is_empty() {
            return keys.join(",");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    String::new()
}
