//! `tender cluster add`: register a downstream cluster on the hub and produce what its agent
//! needs — a hub kubeconfig scoped to the cluster's namespace and the install manifests;
//! `tender cluster list` ([`list`]) and `tender cluster remove` ([`remove`]).

pub mod list;
pub mod remove;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tender_types::{Cluster, ClusterSpec, labels, names, namespaces};

use crate::agent_rbac::{BundleAccess, agent_rbac, bundle_service_account};

/// Name of the downstream Secret holding the agent's hub kubeconfig (key `kubeconfig`).
pub const HUB_KUBECONFIG_SECRET: &str = "tender-agent-hub";
/// Default agent image. No public image exists yet: build and push your own from
/// `deploy/Dockerfile` and pass `--image` (see the README's quick start).
pub const DEFAULT_AGENT_IMAGE: &str = concat!(
    "ghcr.io/tender-dev/tender-agent:v",
    env!("CARGO_PKG_VERSION")
);

/// Arguments of `tender cluster`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

/// `tender cluster` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Register a downstream cluster on the hub and print (or apply) its agent's install manifests.
    Add(Box<AddArgs>),
    /// List the Clusters of a workspace: state, mode, agent connected, last heartbeat, Bundles ready.
    List(list::ListArgs),
    /// Delete a Cluster on the hub (revoking its agent), then remove its agent downstream or print how.
    Remove(Box<remove::RemoveArgs>),
}

/// Arguments of `tender cluster add`.
#[derive(Debug, clap::Args)]
pub struct AddArgs {
    /// Name of the Cluster object (a DNS label).
    pub name: String,
    /// The hub and the workspace the Cluster is registered in.
    #[command(flatten)]
    pub hub: crate::hub::HubArgs,
    /// Labels for the Cluster (what Bundle targets select), `key=value`; repeatable.
    #[arg(long = "label", short = 'l', value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Hub apiserver URL as the agent reaches it (default: the server of the hub kubeconfig).
    #[arg(long)]
    pub hub_server: Option<String>,
    /// Namespace the agent runs in downstream.
    #[arg(long, default_value = namespaces::DEFAULT_AGENT_NAMESPACE)]
    pub agent_namespace: String,
    /// Agent container image. No public image exists yet: build `--target agent` of
    /// deploy/Dockerfile, push it to your registry and name it here.
    #[arg(long, default_value = DEFAULT_AGENT_IMAGE)]
    pub image: String,
    /// Write only the agent's hub kubeconfig to this file instead of printing manifests.
    #[arg(long, conflicts_with = "local")]
    pub kubeconfig_out: Option<PathBuf>,
    /// The hub is its own downstream ("namespace to namespace"): apply the agent's manifests
    /// to the hub itself instead of printing them. The agent then reaches the hub in-cluster
    /// (`https://kubernetes.default.svc`) unless `--hub-server` says otherwise.
    #[arg(long)]
    pub local: bool,
    /// How long to wait for the hub to prepare the cluster namespace and agent identity.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Lifetime of the registration token in the printed kubeconfig (at least 10m). The agent
    /// renews its own token once running; an unused registration token simply expires.
    #[arg(long, default_value = "2h", value_parser = parse_duration)]
    pub token_expiration: Duration,
    /// Namespaces Bundles may write to on this cluster: the Bundle ServiceAccount the agent
    /// applies them as gets edit-like rights there (comma-separated or repeated; the printed
    /// manifests create them).
    #[arg(
        long = "bundle-namespace",
        env = "TENDER_BUNDLE_NAMESPACES",
        value_delimiter = ',',
        default_value = "default"
    )]
    pub bundle_namespaces: Vec<String>,
    /// Make the Bundle ServiceAccount cluster-admin: every Bundle targeting this cluster may then
    /// do anything on it. Off by default.
    #[arg(long, env = "TENDER_BUNDLE_CLUSTER_ADMIN")]
    pub bundle_cluster_admin: bool,
    /// The hub's public signing keys the agent verifies copies with (base64, comma-separated);
    /// default: read from the hub's key Secret (`--hub-signing-key-secret` in `--hub-namespace`).
    #[arg(long, env = "TENDER_HUB_SIGNING_KEYS")]
    pub hub_signing_keys: Option<String>,
    /// Namespace of the hub (where its signing key Secret is).
    #[arg(long, env = "TENDER_HUB_NAMESPACE", default_value = "tender-system")]
    pub hub_namespace: String,
    /// Name of the hub's signing key Secret (the hub's `--signing-key-secret`).
    #[arg(long, env = "TENDER_SIGNING_KEY_SECRET", default_value = tender_types::names::HUB_SIGNING_KEY_SECRET)]
    pub hub_signing_key_secret: String,
}

/// A `key=value` label argument, its value checked as a label value.
pub(crate) fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("label {s:?} is not key=value"))?;
    if !labels::is_label_value(v) {
        return Err(format!("label value {v:?} is not a valid label value"));
    }
    Ok((k.to_string(), v.to_string()))
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().map_err(|_| format!("bad duration {s:?}"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("bad duration {s:?}: use e.g. 90s, 2m or 2h")),
    }
}

/// What registering a cluster yields.
#[derive(Debug, Clone)]
pub struct Registration {
    /// The cluster's namespace on the hub.
    pub cluster_namespace: String,
    /// Kubeconfig for the agent: the hub server, its CA and the agent's token.
    pub hub_kubeconfig: String,
}

/// Kept below what the apiserver accepts as a TokenRequest `expirationSeconds` is refused.
pub const MIN_TOKEN_EXPIRATION: Duration = Duration::from_secs(600);

/// Creates (or updates) the Cluster on the hub, waits for the hub to prepare its namespace and
/// the agent's ServiceAccount, and returns a hub kubeconfig holding a token of that
/// ServiceAccount which expires after `token_expiration` (TokenRequest API): no long-lived
/// credential exists anywhere.
#[allow(clippy::too_many_arguments)]
pub async fn register(
    hub: &kube::Client,
    hub_server: &str,
    workspace: &str,
    name: &str,
    cluster_labels: &BTreeMap<String, String>,
    agent_namespace: &str,
    timeout: Duration,
    token_expiration: Duration,
) -> Result<Registration> {
    if token_expiration < MIN_TOKEN_EXPIRATION {
        bail!("--token-expiration must be at least 10m (the apiserver's minimum)");
    }
    if !names::is_dns_label(name) {
        bail!(
            "cluster name {name:?} must be a DNS label (lowercase letters, digits, '-', at most 63)"
        );
    }
    let clusters: Api<Cluster> = Api::namespaced(hub.clone(), workspace);
    let mut cluster = Cluster::new(
        name,
        ClusterSpec {
            agent_namespace: Some(agent_namespace.to_string()),
            ..ClusterSpec::default()
        },
    );
    cluster.metadata.labels = Some(cluster_labels.clone());
    clusters
        .patch(
            name,
            &PatchParams::apply("tender-cli"),
            &Patch::Apply(&cluster),
        )
        .await
        .with_context(|| format!("creating Cluster {workspace}/{name} on the hub"))?;

    let cluster_namespace = names::cluster_namespace(workspace, name);
    let accounts: Api<ServiceAccount> = Api::namespaced(hub.clone(), &cluster_namespace);
    let config_maps: Api<ConfigMap> = Api::namespaced(hub.clone(), &cluster_namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(i64::try_from(token_expiration.as_secs()).unwrap_or(i64::MAX)),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sa = names::AGENT_SERVICE_ACCOUNT;
    let deadline = Instant::now() + timeout;
    // The hub creates the ServiceAccount; the root-CA publisher fills `kube-root-ca.crt` in
    // every namespace with the CA clients of this apiserver trust.
    let (token, ca) = loop {
        let ca = config_maps
            .get_opt("kube-root-ca.crt")
            .await
            .ok()
            .flatten()
            .and_then(|cm| cm.data?.remove("ca.crt"));
        if let Some(ca) = ca
            && accounts.get_opt(sa).await.ok().flatten().is_some()
        {
            let issued = accounts
                .create_token_request(sa, &PostParams::default(), &request)
                .await
                .with_context(|| {
                    format!("requesting a token of {cluster_namespace}/{sa} (TokenRequest API)")
                })?;
            let token = issued.status.and_then(|s| s.token).unwrap_or_default();
            if token.is_empty() {
                bail!(
                    "the hub answered the TokenRequest for {cluster_namespace}/{sa} without a token"
                );
            }
            break (token, ca.into_bytes());
        }
        if Instant::now() >= deadline {
            bail!(
                "the hub did not prepare ServiceAccount {cluster_namespace}/{sa} (and ConfigMap kube-root-ca.crt) within {timeout:?}: \
                 is tender-hub running and watching workspace {workspace}?"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    Ok(Registration {
        hub_kubeconfig: hub_kubeconfig(hub_server, &ca, &token, &cluster_namespace),
        cluster_namespace,
    })
}

/// A kubeconfig for the agent with a bearer token.
pub fn hub_kubeconfig(server: &str, ca_pem: &[u8], token: &str, namespace: &str) -> String {
    tender_runtime::kubeconfig::TokenKubeconfig {
        name: "hub",
        server,
        ca_pem,
        user: "tender-agent",
        token,
        namespace: Some(namespace),
    }
    .to_yaml()
}

/// The downstream install manifests for an agent: namespace, identity, RBAC (the agent's and
/// the Bundle ServiceAccount's, [`agent_rbac`]), the hub kubeconfig Secret and the Deployment.
/// Pure, so it is unit-tested.
pub fn agent_manifests(
    workspace: &str,
    cluster: &str,
    agent_namespace: &str,
    image: &str,
    hub_kubeconfig: &str,
    access: &BundleAccess,
    hub_signing_keys: &str,
) -> Vec<serde_json::Value> {
    let app = BTreeMap::from([
        (labels::APP_NAME, labels::AGENT_APP_NAME),
        (labels::MANAGED_BY, "tender-cli"),
    ]);
    let mut out = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": agent_namespace}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "tender-agent", "namespace": agent_namespace, "labels": app}}),
    ];
    out.extend(agent_rbac(agent_namespace, access));
    out.extend([
        json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
               "metadata": {"name": HUB_KUBECONFIG_SECRET, "namespace": agent_namespace, "labels": app},
               "stringData": {"kubeconfig": hub_kubeconfig}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "tender-agent", "namespace": agent_namespace, "labels": app},
        "spec": {
          "replicas": 1,
          "strategy": {"type": "Recreate"},
          "selector": {"matchLabels": {"app.kubernetes.io/name": "tender-agent"}},
          "template": {
            "metadata": {"labels": {"app.kubernetes.io/name": "tender-agent"}},
            "spec": {
              "serviceAccountName": "tender-agent",
              "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
              "containers": [{
                "name": "agent",
                "image": image,
                "args": ["--hub-kubeconfig=/etc/tender/hub/kubeconfig",
                         format!("--workspace-namespace={workspace}"),
                         format!("--cluster-name={cluster}"),
                         format!("--hub-kubeconfig-secret={HUB_KUBECONFIG_SECRET}"),
                         format!("--bundle-service-account={}", bundle_service_account(agent_namespace)),
                         // The root filesystem is read-only: charts are cached in a volume.
                         "--chart-cache-dir=/var/cache/tender"],
                "env": [{"name": tender_types::gate::COPY_RESOURCES_ENV, "value": "true"},
                        {"name": "TENDER_HUB_SIGNING_KEYS", "value": hub_signing_keys},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
                "ports": [{"name": "metrics", "containerPort": 8080}],
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}},
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}},
                "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "hub", "mountPath": "/etc/tender/hub", "readOnly": true},
                                 {"name": "chart-cache", "mountPath": "/var/cache/tender"}]
              }],
              "volumes": [{"name": "hub", "secret": {"secretName": HUB_KUBECONFIG_SECRET}},
                          {"name": "chart-cache", "emptyDir": {"sizeLimit": "256Mi"}}]
            }
          }
        }}),
    ]);
    out
}

/// Runs `tender cluster ...`.
pub async fn run(args: Args) -> Result<()> {
    match args.command {
        Command::Add(a) => add(*a).await,
        Command::List(a) => list::run(a).await,
        Command::Remove(a) => remove::run(*a).await,
    }
}

async fn add(a: AddArgs) -> Result<()> {
    let config = match &a.hub.hub_kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("loading the hub kubeconfig")?,
    };
    let server = a.hub_server.clone().unwrap_or_else(|| {
        if a.local {
            IN_CLUSTER_SERVER.to_string()
        } else {
            config
                .cluster_url
                .to_string()
                .trim_end_matches('/')
                .to_string()
        }
    });
    let hub = tender_runtime::client::client_from_config(config, None, "tender-cli")?;
    let cluster_labels: BTreeMap<String, String> = a.labels.iter().cloned().collect();
    let reg = register(
        &hub,
        &server,
        &a.hub.workspace,
        &a.name,
        &cluster_labels,
        &a.agent_namespace,
        a.timeout,
        a.token_expiration,
    )
    .await?;
    eprintln!(
        "registered Cluster {}/{} (hub namespace {})",
        a.hub.workspace, a.name, reg.cluster_namespace
    );
    if let Some(path) = a.kubeconfig_out {
        std::fs::write(&path, &reg.hub_kubeconfig)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("agent hub kubeconfig written to {}", path.display());
        return Ok(());
    }
    // Read once the hub has provisioned the Cluster: a hub that just started has created its
    // key Secret by then, or does so moments later.
    let signing_keys = match &a.hub_signing_keys {
        Some(keys) => keys.clone(),
        None => {
            hub_signing_keys(&hub, &a.hub_namespace, &a.hub_signing_key_secret, a.timeout).await?
        }
    };
    let manifests = agent_manifests(
        &a.hub.workspace,
        &a.name,
        &a.agent_namespace,
        &a.image,
        &reg.hub_kubeconfig,
        &BundleAccess {
            namespaces: a.bundle_namespaces.clone(),
            cluster_admin: a.bundle_cluster_admin,
        },
        &signing_keys,
    );
    if a.local {
        for line in apply_manifests(&hub, &manifests).await? {
            eprintln!("applied {line}");
        }
        eprintln!(
            "the agent of {} runs on the hub itself (namespace {}): Bundles targeting it copy \
             from the workspace into other namespaces of this cluster",
            a.name, a.agent_namespace
        );
        return Ok(());
    }
    eprintln!(
        "apply the agent on the downstream cluster: tender cluster add ... | kubectl apply -f -"
    );
    for m in manifests {
        print!("---\n{}", serde_saphyr::to_string(&m)?);
    }
    Ok(())
}

/// The hub's public signing keys from its key Secret (`public-keys`): what the agent is
/// registered with (decision 0089-signed-copies).
async fn hub_signing_keys(
    hub: &kube::Client,
    namespace: &str,
    secret: &str,
    timeout: std::time::Duration,
) -> Result<String> {
    let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(hub.clone(), namespace);
    let deadline = std::time::Instant::now() + timeout;
    let keys = loop {
        let found = api.get_opt(secret).await.with_context(|| {
            format!("reading the hub's signing key Secret {namespace}/{secret}")
        })?;
        let keys = found
            .and_then(|s| s.data?.get("public-keys").cloned())
            .map(|k| String::from_utf8_lossy(&k.0).into_owned());
        if keys.is_some() || std::time::Instant::now() >= deadline {
            break keys;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    };
    keys.with_context(|| {
        format!(
            "the hub's signing key Secret {namespace}/{secret} does not exist yet: start the hub first (it creates it), or pass --hub-signing-keys"
        )
    })
}

/// The hub's address from inside the hub cluster, for `--local`.
pub const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";

/// Server-side applies `manifests` (as `tender-cli`) through `client`, kinds found by
/// discovery; returns `Kind namespace/name` of each.
pub async fn apply_manifests(
    client: &kube::Client,
    manifests: &[serde_json::Value],
) -> Result<Vec<String>> {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    use kube::discovery::{self, Scope};
    let mut applied = Vec::new();
    for m in manifests {
        let object: DynamicObject =
            serde_json::from_value(m.clone()).context("an agent manifest")?;
        let types = object
            .types
            .clone()
            .context("an agent manifest without apiVersion/kind")?;
        let gvk = kube::api::GroupVersionKind::try_from(&types)?;
        let (resource, caps) = discovery::pinned_kind(client, &gvk)
            .await
            .with_context(|| format!("discovering {} {}", types.api_version, types.kind))?;
        let name = object.metadata.name.clone().unwrap_or_default();
        let namespace = object.metadata.namespace.clone();
        let api: Api<DynamicObject> = match (&namespace, caps.scope) {
            (Some(ns), Scope::Namespaced) => Api::namespaced_with(client.clone(), ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        };
        api.patch(
            &name,
            &PatchParams::apply("tender-cli").force(),
            &Patch::Apply(&object),
        )
        .await
        .with_context(|| format!("applying {} {name}", types.kind))?;
        applied.push(match namespace {
            Some(ns) => format!("{} {ns}/{name}", types.kind),
            None => format!("{} {name}", types.kind),
        });
    }
    Ok(applied)
}

/// The kinds `tender cluster add` prints, in order, with one Bundle namespace and no opt-in.
pub const AGENT_KINDS: [&str; 12] = [
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ServiceAccount",
    "ClusterRole",
    "Namespace",
    "RoleBinding",
    "Secret",
    "Deployment",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_and_reject_bad_values() {
        assert_eq!(
            parse_label("env=prod").unwrap(),
            ("env".to_string(), "prod".to_string())
        );
        assert!(parse_label("env").is_err());
        assert!(parse_label("env=not a value").is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("15").unwrap(), Duration::from_secs(15));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert!(parse_duration("1d").is_err());
    }

    #[test]
    fn agent_manifests_mount_the_hub_kubeconfig_and_enable_the_gate() {
        let ms = agent_manifests(
            "tender-default",
            "east",
            "tender-system",
            "img:1",
            "KUBECONFIG",
            &BundleAccess {
                namespaces: vec!["default".into()],
                cluster_admin: false,
            },
            "k1",
        );
        let kinds: Vec<_> = ms.iter().map(|m| m["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, AGENT_KINDS);
        let secret = &ms[kinds.len() - 2];
        assert_eq!(secret["metadata"]["namespace"], "tender-system");
        assert_eq!(secret["stringData"]["kubeconfig"], "KUBECONFIG");
        let c = &ms[kinds.len() - 1]["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "img:1");
        let args: Vec<_> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(args.contains(&"--cluster-name=east"));
        assert!(args.contains(&"--workspace-namespace=tender-default"));
        // The agent stores its renewed hub kubeconfig where it was mounted from.
        assert!(args.contains(&"--hub-kubeconfig-secret=tender-agent-hub"));
        // Bundles are applied as the Bundle ServiceAccount, not as the agent.
        assert!(args.contains(&"--bundle-service-account=tender-system/tender-bundles"));
        assert_eq!(c["env"][0]["name"], tender_types::gate::COPY_RESOURCES_ENV);
        assert_eq!(c["env"][0]["value"], "true");
    }

    #[test]
    fn hub_kubeconfig_parses_and_sets_the_cluster_namespace() {
        let text = hub_kubeconfig("https://hub:6443", b"CA", "tok", "cluster-ns");
        let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        let ctx = kc.contexts[0].context.as_ref().unwrap();
        assert_eq!(ctx.namespace.as_deref(), Some("cluster-ns"));
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert!(user.token.is_some());
    }
}
