//! `tender cluster remove`: deletes a Cluster on the hub, waits for the hub to finish with it
//! (its BundleDeployments removed — the running agent deletes what it deployed first — then its
//! namespace, with the agent's hub ServiceAccount: every token the agent holds stops working),
//! and then removes what `tender cluster add` installed downstream, or prints the commands that
//! do. Namespaces are never deleted (a Bundle namespace or a shared agent namespace holds other
//! things), and a downstream object is deleted only when it carries the labels `cluster add`
//! gave it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};
use kube::discovery::{self, Scope};
use serde::Serialize;
use tender_types::service_account::DEFAULT_BUNDLE_SERVICE_ACCOUNT;
use tender_types::{Cluster, ClusterMode, labels, names};

use crate::status::{Output, render};

/// Arguments of `tender cluster remove`.
#[derive(Debug, clap::Args)]
pub struct RemoveArgs {
    /// Name of the Cluster.
    pub name: String,
    /// The hub and the workspace.
    #[command(flatten)]
    pub hub: crate::hub::HubArgs,
    /// Kubeconfig of the downstream cluster: delete the agent's objects there once the hub is
    /// done. Without it (and without `--downstream-context`) the commands are printed.
    #[arg(long)]
    pub downstream_kubeconfig: Option<PathBuf>,
    /// Context of the downstream cluster in the kubeconfig (`--downstream-kubeconfig`, else
    /// $KUBECONFIG or ~/.kube/config).
    #[arg(long)]
    pub downstream_context: Option<String>,
    /// Return once the deletion is requested, without waiting for the hub (nothing is then
    /// deleted downstream: the agent may still be removing what it deployed).
    #[arg(long)]
    pub no_wait: bool,
    /// How long to wait for the hub to finish with the Cluster.
    #[arg(long, default_value = "3m", value_parser = super::parse_duration)]
    pub timeout: Duration,
    /// Output format of the summary.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// One downstream object `tender cluster add` installed for the agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentObject {
    /// `apiVersion`.
    pub api_version: &'static str,
    /// `kind`.
    pub kind: &'static str,
    /// Namespace; `None` for a cluster-scoped kind, `Some("*")` for every namespace (the
    /// Bundle ServiceAccount's RoleBindings live in each Bundle namespace).
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

/// What `tender cluster add` installs downstream for an agent in `agent_namespace`, in the
/// order to delete it (the agent first, so it stops; its rights last). Namespaces are left.
pub fn agent_objects(agent_namespace: &str) -> Vec<AgentObject> {
    const RBAC: &str = "rbac.authorization.k8s.io/v1";
    let bundles_role = format!("{DEFAULT_BUNDLE_SERVICE_ACCOUNT}-{agent_namespace}");
    let ns = Some(agent_namespace.to_string());
    let obj = |api_version, kind, namespace: Option<String>, name: &str| AgentObject {
        api_version,
        kind,
        namespace,
        name: name.to_string(),
    };
    vec![
        obj("apps/v1", "Deployment", ns.clone(), "tender-agent"),
        obj(
            "v1",
            "Secret",
            ns.clone(),
            crate::cluster::HUB_KUBECONFIG_SECRET,
        ),
        obj(RBAC, "RoleBinding", Some("*".into()), &bundles_role),
        obj(
            RBAC,
            "ClusterRoleBinding",
            None,
            &format!("{bundles_role}-cluster-admin"),
        ),
        obj(RBAC, "ClusterRole", None, &bundles_role),
        obj(
            "v1",
            "ServiceAccount",
            ns.clone(),
            DEFAULT_BUNDLE_SERVICE_ACCOUNT,
        ),
        obj(RBAC, "RoleBinding", ns.clone(), "tender-agent"),
        obj(RBAC, "Role", ns.clone(), "tender-agent"),
        obj(RBAC, "ClusterRoleBinding", None, "tender-agent"),
        obj(RBAC, "ClusterRole", None, "tender-agent"),
        obj("v1", "ServiceAccount", ns, "tender-agent"),
    ]
}

/// The label selector every object of [`agent_objects`] carries (and nothing else tender makes).
pub fn agent_selector() -> String {
    format!(
        "{}={},{}=tender-cli",
        labels::APP_NAME,
        labels::AGENT_APP_NAME,
        labels::MANAGED_BY
    )
}

/// `kubectl` commands that delete [`agent_objects`] (only those carrying [`agent_selector`]).
pub fn cleanup_commands(agent_namespace: &str) -> Vec<String> {
    let selector = agent_selector();
    agent_objects(agent_namespace)
        .iter()
        .map(|o| {
            let kind = o.kind.to_lowercase();
            match o.namespace.as_deref() {
                Some("*") => format!(
                    "kubectl delete {kind} -A -l {selector} --field-selector metadata.name={} --ignore-not-found",
                    o.name
                ),
                Some(ns) => format!(
                    "kubectl delete {kind} {} -n {ns} -l {selector} --ignore-not-found",
                    o.name
                ),
                None => format!(
                    "kubectl delete {kind} {} -l {selector} --ignore-not-found",
                    o.name
                ),
            }
        })
        .collect()
}

/// What `tender cluster remove` did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoveReport {
    /// `<workspace>/<name>`.
    pub cluster: String,
    /// `Pull` or `Push`.
    pub mode: String,
    /// The Cluster is gone from the hub (its BundleDeployments and namespace removed).
    pub removed_from_hub: bool,
    /// The agent's hub ServiceAccount is gone, with its namespace and bindings: its tokens
    /// grant nothing (and stop authenticating once the apiserver sees the deletion).
    pub agent_revoked: bool,
    /// Downstream objects deleted, `Kind namespace/name`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deleted_downstream: Vec<String>,
    /// Downstream objects left because they lack `cluster add`'s labels.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_downstream: Vec<String>,
    /// Commands to run against the downstream cluster (when it was not given).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub downstream_commands: Vec<String>,
}

fn render_summary(r: &RemoveReport) -> String {
    let mut out = format!(
        "Cluster {} ({}): {}\n",
        r.cluster,
        r.mode,
        if r.removed_from_hub {
            "removed from the hub"
        } else {
            "deletion requested on the hub"
        }
    );
    if r.agent_revoked {
        out.push_str("agent credentials revoked (its hub ServiceAccount is deleted)\n");
    }
    for d in &r.deleted_downstream {
        out.push_str(&format!("deleted downstream: {d}\n"));
    }
    for l in &r.left_downstream {
        out.push_str(&format!(
            "left downstream (not made by `tender cluster add`): {l}\n"
        ));
    }
    if !r.downstream_commands.is_empty() {
        out.push_str(
            "\nOn the downstream cluster, remove the agent (installed with `tender cluster add`):\n",
        );
        for c in &r.downstream_commands {
            out.push_str(&format!("  {c}\n"));
        }
        out.push_str(
            "  (installed with the agent chart instead: helm uninstall <release> -n <namespace>)\n",
        );
        out.push_str("Namespaces are left in place: delete the agent's namespace yourself if nothing else lives there.\n");
    }
    out
}

/// Runs `tender cluster remove`.
pub async fn run(a: RemoveArgs) -> Result<()> {
    let hub = a.hub.client().await?;
    let ws = &a.hub.workspace;
    let clusters: Api<Cluster> = Api::namespaced(hub.clone(), ws);
    let cluster = clusters
        .get_opt(&a.name)
        .await
        .with_context(|| format!("reading Cluster {ws}/{}", a.name))?
        .with_context(|| format!("Cluster {ws}/{} not found", a.name))?;
    let mode = cluster.spec.mode();
    let agent_namespace = cluster.spec.agent_namespace().to_string();
    clusters
        .delete(&a.name, &DeleteParams::background())
        .await
        .with_context(|| format!("deleting Cluster {ws}/{}", a.name))?;
    let mut report = RemoveReport {
        cluster: format!("{ws}/{}", a.name),
        mode: mode.to_string(),
        ..Default::default()
    };
    if a.no_wait {
        print!("{}", render(&report, a.output, render_summary)?);
        return Ok(());
    }
    let cluster_ns = names::cluster_namespace(ws, &a.name);
    let accounts: Api<ServiceAccount> = Api::namespaced(hub.clone(), &cluster_ns);
    let deadline = Instant::now() + a.timeout;
    loop {
        let gone = clusters.get_opt(&a.name).await?.is_none();
        let revoked = accounts
            .get_opt(names::AGENT_SERVICE_ACCOUNT)
            .await?
            .is_none();
        (report.removed_from_hub, report.agent_revoked) = (gone, revoked);
        if gone && revoked {
            break;
        }
        if Instant::now() >= deadline {
            bail!(
                "Cluster {ws}/{} is not gone after {:?} (removed from the hub: {gone}, agent revoked: {revoked}); \
                 the hub's finalizer waits for a running agent (at most 60 s) — is the hub running? \
                 Nothing was deleted downstream.",
                a.name,
                a.timeout
            );
        }
        // Polling the hub (the namespace controller's pace); the deadline above bounds it.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if mode == ClusterMode::Pull {
        if a.downstream_kubeconfig.is_some() || a.downstream_context.is_some() {
            let down = downstream_client(&a).await?;
            (report.deleted_downstream, report.left_downstream) =
                delete_agent_objects(&down, &agent_namespace).await?;
        } else {
            report.downstream_commands = cleanup_commands(&agent_namespace);
        }
    }
    print!("{}", render(&report, a.output, render_summary)?);
    Ok(())
}

async fn downstream_client(a: &RemoveArgs) -> Result<kube::Client> {
    let kc = match &a.downstream_kubeconfig {
        Some(path) => kube::config::Kubeconfig::read_from(path)
            .with_context(|| format!("reading {}", path.display()))?,
        None => kube::config::Kubeconfig::read().context("reading the kubeconfig")?,
    };
    let options = kube::config::KubeConfigOptions {
        context: a.downstream_context.clone(),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kc, &options)
        .await
        .context("the downstream cluster's kubeconfig")?;
    Ok(tender_runtime::client::client_from_config(
        config,
        None,
        "tender-cli",
    )?)
}

/// Deletes each of [`agent_objects`] that exists and carries `cluster add`'s labels; returns
/// (deleted, left because unlabelled), each as `Kind namespace/name`.
async fn delete_agent_objects(
    down: &kube::Client,
    agent_namespace: &str,
) -> Result<(Vec<String>, Vec<String>)> {
    let selector = agent_selector();
    let (mut deleted, mut left) = (Vec::new(), Vec::new());
    for o in agent_objects(agent_namespace) {
        let (group, version) = match o.api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", o.api_version),
        };
        let gvk = kube::api::GroupVersionKind::gvk(group, version, o.kind);
        let (resource, caps) = discovery::pinned_kind(down, &gvk)
            .await
            .with_context(|| format!("discovering {} downstream", o.kind))?;
        let candidates: Vec<(Api<DynamicObject>, String)> =
            match (o.namespace.as_deref(), caps.scope) {
                (Some("*"), _) => {
                    let all: Api<DynamicObject> = Api::all_with(down.clone(), &resource);
                    let found = all
                        .list(&ListParams::default().fields(&format!("metadata.name={}", o.name)))
                        .await?;
                    found
                        .items
                        .into_iter()
                        .filter_map(|d| d.metadata.namespace)
                        .map(|ns| (Api::namespaced_with(down.clone(), &ns, &resource), ns))
                        .collect()
                }
                (Some(ns), Scope::Namespaced) => vec![(
                    Api::namespaced_with(down.clone(), ns, &resource),
                    ns.to_string(),
                )],
                _ => vec![(Api::all_with(down.clone(), &resource), String::new())],
            };
        for (api, ns) in candidates {
            let label = if ns.is_empty() {
                format!("{} {}", o.kind, o.name)
            } else {
                format!("{} {ns}/{}", o.kind, o.name)
            };
            let Some(live) = api.get_opt(&o.name).await? else {
                continue;
            };
            if !matches_selector(&live, &selector) {
                left.push(label);
                continue;
            }
            api.delete(&o.name, &DeleteParams::background())
                .await
                .with_context(|| format!("deleting {label} downstream"))?;
            deleted.push(label);
        }
    }
    Ok((deleted, left))
}

/// Whether `obj` carries every `k=v` of `selector`.
fn matches_selector(obj: &DynamicObject, selector: &str) -> bool {
    let labels = obj.metadata.labels.clone().unwrap_or_default();
    selector.split(',').all(|kv| {
        kv.split_once('=')
            .is_some_and(|(k, v)| labels.get(k).map(String::as_str) == Some(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_rbac::BundleAccess;

    /// Every object `cluster add` prints, except the namespaces, is one `remove` deletes, and
    /// each carries the selector `remove` checks.
    #[test]
    fn remove_covers_what_add_installs_and_never_a_namespace() {
        let printed = crate::cluster::agent_manifests(
            "ws",
            "east",
            "tender-system",
            "img",
            "kc",
            &BundleAccess {
                namespaces: vec!["default".into(), "apps".into()],
                cluster_admin: true,
            },
            "keys",
        );
        let removed = agent_objects("tender-system");
        assert!(removed.iter().all(|o| o.kind != "Namespace"));
        for m in printed.iter().filter(|m| m["kind"] != "Namespace") {
            let kind = m["kind"].as_str().unwrap();
            let name = m["metadata"]["name"].as_str().unwrap();
            let ns = m["metadata"]["namespace"].as_str();
            let covered = removed.iter().any(|o| {
                o.kind == kind
                    && o.name == name
                    && match (o.namespace.as_deref(), ns) {
                        (Some("*"), Some(_)) => true,
                        (a, b) => a == b,
                    }
            });
            assert!(covered, "{kind} {ns:?}/{name} printed by add, not removed");
            let labels = &m["metadata"]["labels"];
            let obj: DynamicObject = serde_json::from_value(m.clone()).unwrap();
            assert!(
                matches_selector(&obj, &agent_selector()),
                "{kind} {name} lacks the selector: {labels}"
            );
        }
    }

    #[test]
    fn commands_delete_only_labelled_objects_and_no_namespace() {
        let cmds = cleanup_commands("tender-system");
        assert!(cmds.iter().all(|c| c.contains(
            "-l app.kubernetes.io/name=tender-agent,app.kubernetes.io/managed-by=tender-cli"
        )));
        assert!(cmds.iter().all(|c| !c.contains("delete namespace")));
        assert!(cmds[0].starts_with("kubectl delete deployment tender-agent -n tender-system"));
    }

    #[test]
    fn an_unlabelled_object_does_not_match() {
        let mut obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "tender-agent", "labels": {"app.kubernetes.io/name": "tender-agent"}}
        }))
        .unwrap();
        assert!(!matches_selector(&obj, &agent_selector()));
        obj.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("app.kubernetes.io/managed-by".into(), "tender-cli".into());
        assert!(matches_selector(&obj, &agent_selector()));
    }

    #[test]
    fn the_summary_names_what_was_done_and_what_is_left() {
        let r = RemoveReport {
            cluster: "ws/east".into(),
            mode: "Pull".into(),
            removed_from_hub: true,
            agent_revoked: true,
            downstream_commands: cleanup_commands("tender-system"),
            ..Default::default()
        };
        let text = render_summary(&r);
        assert!(text.contains("removed from the hub"), "{text}");
        assert!(text.contains("revoked"), "{text}");
        assert!(text.contains("kubectl delete deployment"), "{text}");
        let json: serde_json::Value =
            serde_json::from_str(&render(&r, Output::Json, render_summary).unwrap()).unwrap();
        assert_eq!(json["agentRevoked"], true);
    }
}
