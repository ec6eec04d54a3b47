//! Cluster controller: the cluster's namespace on the hub, its agent's identity and RBAC,
//! cleanup on deletion, and status (namespace, agent heartbeat, BundleDeployment summary).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tender_types::conditions::{self, TYPE_AGENT_CONNECTED, TYPE_READY, reason};
use tender_types::{
    API_GROUP, BundleDeployment, BundleSummary, Cluster, ClusterDisplay, ClusterStatus, hash,
    labels, names,
};

use crate::bundle::status::{summarize, summary_reason};
use crate::context::Ctx;
use crate::{Error, kube_err};

const CONTROLLER: &str = "cluster";
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Everything the hub creates for one Cluster so its agent can work, and nothing more.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentAccess {
    /// The cluster namespace.
    pub namespace: Namespace,
    /// The agent's ServiceAccount in the cluster namespace.
    pub service_account: ServiceAccount,
    /// Long-lived token Secret of that ServiceAccount.
    pub token: Secret,
    /// What the agent may do in its cluster namespace.
    pub role: Role,
    /// Binds [`AgentAccess::role`] to the agent.
    pub role_binding: RoleBinding,
    /// In the workspace: read its own Cluster and write its status, nothing else.
    pub workspace_role: Role,
    /// Binds [`AgentAccess::workspace_role`] to the agent.
    pub workspace_role_binding: RoleBinding,
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |s: &[&str]| s.iter().map(ToString::to_string).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..Default::default()
    }
}

fn meta(name: &str, namespace: Option<&str>, labels: &BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(ToString::to_string),
        labels: Some(labels.clone()),
        ..Default::default()
    }
}

/// The namespace, identity and RBAC of the agent of Cluster `cluster` in `workspace`.
pub fn agent_access(workspace: &str, cluster: &str) -> AgentAccess {
    let ns = names::cluster_namespace(workspace, cluster);
    let labels = BTreeMap::from([
        (
            labels::MANAGED_BY.to_string(),
            labels::MANAGED_BY_VALUE.to_string(),
        ),
        (labels::WORKSPACE.to_string(), workspace.to_string()),
        (
            labels::CLUSTER.to_string(),
            labels::safe_label_value(cluster),
        ),
    ]);
    let sa = names::AGENT_SERVICE_ACCOUNT;
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: sa.into(),
        namespace: Some(ns.clone()),
        ..Default::default()
    };
    let role_ref = |name: &str| RoleRef {
        api_group: Some(RBAC_GROUP.into()),
        kind: "Role".into(),
        name: name.into(),
    };
    let ws_role = names::agent_workspace_role(cluster);
    let own = |mut r: PolicyRule| {
        r.resource_names = Some(vec![cluster.to_string()]);
        r
    };
    AgentAccess {
        namespace: Namespace {
            metadata: meta(&ns, None, &labels),
            ..Default::default()
        },
        service_account: ServiceAccount {
            metadata: meta(sa, Some(&ns), &labels),
            ..Default::default()
        },
        token: Secret {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    "kubernetes.io/service-account.name".to_string(),
                    sa.to_string(),
                )])),
                ..meta(names::AGENT_TOKEN_SECRET, Some(&ns), &labels)
            },
            type_: Some("kubernetes.io/service-account-token".into()),
            ..Default::default()
        },
        role: Role {
            metadata: meta(names::AGENT_ROLE, Some(&ns), &labels),
            rules: Some(vec![
                rule(
                    &[API_GROUP],
                    &["bundledeployments"],
                    &["get", "list", "watch", "patch", "update"],
                ),
                rule(
                    &[API_GROUP],
                    &["bundledeployments/status"],
                    &["get", "patch", "update"],
                ),
                rule(&[""], &["secrets", "configmaps"], &["get", "list", "watch"]),
                rule(
                    &["coordination.k8s.io"],
                    &["leases"],
                    &["get", "list", "watch", "create", "update", "patch"],
                ),
                rule(&["", "events.k8s.io"], &["events"], &["create", "patch"]),
            ]),
        },
        role_binding: RoleBinding {
            metadata: meta(names::AGENT_ROLE, Some(&ns), &labels),
            role_ref: role_ref(names::AGENT_ROLE),
            subjects: Some(vec![subject.clone()]),
        },
        workspace_role: Role {
            metadata: meta(&ws_role, Some(workspace), &labels),
            rules: Some(vec![
                own(rule(&[API_GROUP], &["clusters"], &["get"])),
                own(rule(
                    &[API_GROUP],
                    &["clusters/status"],
                    &["get", "patch", "update"],
                )),
            ]),
        },
        workspace_role_binding: RoleBinding {
            metadata: meta(&ws_role, Some(workspace), &labels),
            role_ref: role_ref(&ws_role),
            subjects: Some(vec![subject]),
        },
    }
}

/// When the agent last reported: the later of its Lease renewal and `status.agent.lastSeen`.
pub fn last_heartbeat(cluster: &Cluster, lease_renewed: Option<Timestamp>) -> Option<Timestamp> {
    let seen = cluster
        .status
        .as_ref()
        .and_then(|s| s.agent.as_ref())
        .and_then(|a| a.last_seen.as_ref())
        .map(|t| t.0);
    seen.into_iter().chain(lease_renewed).max()
}

/// The Cluster status the hub writes (everything but `agent`, which is the agent's), starting
/// from `existing` so an unchanged result compares equal; and when to look again because the
/// heartbeat will expire.
#[allow(clippy::too_many_arguments)]
pub fn cluster_status(
    existing: Option<&ClusterStatus>,
    namespace: &str,
    heartbeat: Option<Timestamp>,
    summary: BundleSummary,
    paused: bool,
    generation: Option<i64>,
    now: Timestamp,
    offline_after: Duration,
) -> (ClusterStatus, Option<Duration>) {
    let mut status = existing.cloned().unwrap_or_default();
    status.observed_generation = generation;
    status.namespace = Some(namespace.to_string());
    let offline_ms = i64::try_from(offline_after.as_millis()).unwrap_or(i64::MAX);
    let (connected, agent_reason, agent_message, recheck) = match heartbeat {
        None => (
            false,
            reason::WAITING_FOR_AGENT,
            "no heartbeat from the agent yet; install it with the kubeconfig built from the tender-agent-token Secret".to_string(),
            None,
        ),
        Some(last) => {
            let age_ms = now.as_millisecond() - last.as_millisecond();
            if age_ms < offline_ms {
                let left = u64::try_from(offline_ms - age_ms).unwrap_or(0);
                (
                    true,
                    reason::AGENT_CONNECTED,
                    "the agent reports in".to_string(),
                    Some(Duration::from_millis(left) + Duration::from_secs(1)),
                )
            } else {
                (
                    false,
                    reason::AGENT_OFFLINE,
                    format!("no heartbeat from the agent since {last}"),
                    None,
                )
            }
        }
    };
    let now = Time(now);
    conditions::set_condition(
        &mut status.conditions,
        TYPE_AGENT_CONNECTED,
        connected,
        agent_reason,
        &agent_message,
        generation,
        now.clone(),
    );
    let ready_bundles = format!("{}/{}", summary.ready, summary.desired_ready);
    let (ready, ready_reason, message, state) = if !connected {
        let state = if heartbeat.is_none() {
            "WaitingForAgent"
        } else {
            "Offline"
        };
        (false, agent_reason, agent_message.clone(), state)
    } else if paused {
        (
            false,
            reason::PAUSED,
            "the cluster is paused".to_string(),
            "Paused",
        )
    } else if let Some((why, _)) = summary_reason(&summary) {
        (
            false,
            why,
            format!("{ready_bundles} BundleDeployments ready"),
            "NotReady",
        )
    } else {
        (true, reason::READY, String::new(), "Ready")
    };
    conditions::set_condition(
        &mut status.conditions,
        TYPE_READY,
        ready,
        ready_reason,
        &message,
        generation,
        now,
    );
    status.summary = Some(summary);
    status.display = Some(ClusterDisplay {
        ready_bundles,
        state: state.to_string(),
    });
    (status, recheck)
}

/// Key of a status in the recent-writes memo: its content without condition transition times.
/// A reconcile that runs before the cache has our last status write sees no conditions and
/// stamps new ones with the current time; that is the status already written, not a new one
/// (without this, most provisioned Clusters got their first status written twice).
fn status_key(status: &ClusterStatus) -> String {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(conditions) = value.get_mut("conditions").and_then(|c| c.as_array_mut()) {
        for c in conditions.iter_mut().filter_map(|c| c.as_object_mut()) {
            c.remove("lastTransitionTime");
        }
    }
    hash::value_hash(&value)
}

pub(crate) async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    let workspace = cluster.namespace().unwrap_or_default();
    let object = format!("Cluster {workspace}/{}", cluster.name_any());
    let api: Api<Cluster> = Api::namespaced(ctx.client.clone(), &workspace);
    finalizer(
        &api,
        labels::CLUSTER_CLEANUP_FINALIZER,
        cluster,
        |event| async {
            match event {
                Finalizer::Apply(c) => apply(&c, &ctx).await,
                Finalizer::Cleanup(c) => cleanup(&c, &ctx).await,
            }
        },
    )
    .await
    .map_err(|source| Error::Finalizer {
        object,
        source: Box::new(source),
    })
}

pub(crate) fn error_policy(cluster: Arc<Cluster>, error: &Error, ctx: Arc<Ctx>) -> Action {
    ctx.metrics.reconcile_error(CONTROLLER, error.reason());
    tracing::warn!(cluster = %cluster.name_any(), namespace = ?cluster.namespace(), %error, "cluster reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// Applies `obj` unless the live object already carries the content hash of exactly this
/// desired state (one metadata read instead of a write).
async fn ensure<K>(api: &Api<K>, mut obj: K) -> Result<bool, Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    let kind = std::any::type_name::<K>()
        .rsplit("::")
        .next()
        .unwrap_or("object");
    let desired = hash::value_hash(&serde_json::to_value(&obj).unwrap_or_default());
    obj.meta_mut()
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::CONTENT_HASH.to_string(), desired.clone());
    let live = api
        .get_metadata_opt(&name)
        .await
        .map_err(kube_err(format!("read {kind} {name}")))?;
    if live.is_some_and(|m| m.annotations().get(labels::CONTENT_HASH) == Some(&desired)) {
        return Ok(false);
    }
    api.patch(
        &name,
        &PatchParams::apply(labels::HUB_FIELD_MANAGER).force(),
        &Patch::Apply(&obj),
    )
    .await
    .map_err(kube_err(format!("apply {kind} {name}")))?;
    Ok(true)
}

async fn provision(cluster: &Cluster, ctx: &Ctx) -> Result<(), Error> {
    let workspace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let uid = cluster.uid().unwrap_or_default();
    let access = agent_access(&workspace, &name);
    let ns_name = access.namespace.name_any();
    let key = (workspace.clone(), name.clone());
    let ns_cached = ctx
        .stores
        .namespaces
        .get(&ObjectRef::new(&ns_name))
        .is_some();
    if ns_cached && ctx.provisioned.lock().expect("lock").get(&key) == Some(&uid) {
        return Ok(());
    }
    let (client, ns) = (ctx.client.clone(), ns_name.clone());
    let mut wrote = ensure(&Api::<Namespace>::all(client.clone()), access.namespace).await?;
    wrote |= ensure(
        &Api::namespaced(client.clone(), &ns),
        access.service_account,
    )
    .await?;
    wrote |= ensure(&Api::namespaced(client.clone(), &ns), access.token).await?;
    wrote |= ensure(&Api::namespaced(client.clone(), &ns), access.role).await?;
    wrote |= ensure(&Api::namespaced(client.clone(), &ns), access.role_binding).await?;
    wrote |= ensure(
        &Api::namespaced(client.clone(), &workspace),
        access.workspace_role,
    )
    .await?;
    wrote |= ensure(
        &Api::namespaced(client.clone(), &workspace),
        access.workspace_role_binding,
    )
    .await?;
    ctx.provisioned.lock().expect("lock").insert(key, uid);
    if wrote {
        ctx.event(
            &cluster.object_ref(&()),
            EventType::Normal,
            "Provisioned",
            "Provision",
            format!("namespace {ns_name} with the agent's ServiceAccount, token Secret and RBAC"),
        )
        .await;
    }
    Ok(())
}

async fn apply(cluster: &Cluster, ctx: &Ctx) -> Result<Action, Error> {
    let workspace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let ns_name = names::cluster_namespace(&workspace, &name);
    if let Some(ns) = ctx.stores.namespaces.get(&ObjectRef::new(&ns_name))
        && ns.metadata.deletion_timestamp.is_some()
    {
        // Somebody deleted it: recreate once it is gone (its deletion event brings us back).
        tracing::info!(cluster = %name, namespace = %ns_name, "cluster namespace is terminating; waiting to recreate it");
        return Ok(Action::await_change());
    }
    provision(cluster, ctx).await?;

    let lease = ctx
        .stores
        .leases
        .get(&ObjectRef::new(names::AGENT_LEASE).within(&ns_name))
        .and_then(|l| l.spec.as_ref()?.renew_time.as_ref().map(|t| t.0));
    let heartbeat = last_heartbeat(cluster, lease);
    let bds: Vec<Arc<BundleDeployment>> = ctx
        .bundle_deployments_in(&ns_name)
        .into_iter()
        .filter(|bd| bd.metadata.deletion_timestamp.is_none())
        .collect();
    let summary = summarize(bds.len(), bds.iter().map(AsRef::as_ref));
    let (status, recheck) = cluster_status(
        cluster.status.as_ref(),
        &ns_name,
        heartbeat,
        summary,
        cluster.spec.paused,
        cluster.metadata.generation,
        Timestamp::now(),
        ctx.config.agent_offline_after,
    );
    let recent_key = format!("status/Cluster/{workspace}/{name}");
    let desired_key = status_key(&status);
    let live_rv = cluster.resource_version();
    let written = ctx
        .recent
        .get(&recent_key, live_rv.as_deref(), &desired_key)
        .is_some();
    if cluster.status.as_ref() != Some(&status) && !written {
        let mut ours = status;
        ours.agent = None; // the agent's field: never written by the hub
        ctx.apply_status::<Cluster>(&workspace, &name, &ours, (recent_key, live_rv, desired_key))
            .await?;
    }
    Ok(recheck.map_or_else(Action::await_change, Action::requeue))
}

fn ignore_not_found<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Works without an agent: strips the agent's finalizers (nobody would remove them), then
/// deletes the namespace (and with it BundleDeployments and copies) and the workspace RBAC.
async fn cleanup(cluster: &Cluster, ctx: &Ctx) -> Result<Action, Error> {
    let workspace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let ns_name = names::cluster_namespace(&workspace, &name);
    ctx.provisioned
        .lock()
        .expect("lock")
        .remove(&(workspace.clone(), name.clone()));
    let bds: Api<BundleDeployment> = Api::namespaced(ctx.client.clone(), &ns_name);
    let list = match bds.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(e) => return Err(kube_err(format!("list BundleDeployments in {ns_name}"))(e)),
    };
    for bd in list {
        if !bd
            .finalizers()
            .iter()
            .any(|f| f == labels::AGENT_CLEANUP_FINALIZER)
        {
            continue;
        }
        let kept: Vec<&String> = bd
            .finalizers()
            .iter()
            .filter(|f| *f != labels::AGENT_CLEANUP_FINALIZER)
            .collect();
        // resourceVersion makes this a compare-and-swap: a concurrent change fails and retries.
        let patch = serde_json::json!({
            "metadata": {"finalizers": kept, "resourceVersion": bd.resource_version()}
        });
        ignore_not_found(
            bds.patch(
                &bd.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await,
        )
        .map_err(kube_err(format!(
            "remove the agent finalizer from BundleDeployment {ns_name}/{}",
            bd.name_any()
        )))?;
    }
    let dp = DeleteParams::background();
    ignore_not_found(
        Api::<Namespace>::all(ctx.client.clone())
            .delete(&ns_name, &dp)
            .await,
    )
    .map_err(kube_err(format!("delete namespace {ns_name}")))?;
    let role = names::agent_workspace_role(&name);
    ignore_not_found(
        Api::<RoleBinding>::namespaced(ctx.client.clone(), &workspace)
            .delete(&role, &dp)
            .await,
    )
    .map_err(kube_err(format!("delete RoleBinding {workspace}/{role}")))?;
    ignore_not_found(
        Api::<Role>::namespaced(ctx.client.clone(), &workspace)
            .delete(&role, &dp)
            .await,
    )
    .map_err(kube_err(format!("delete Role {workspace}/{role}")))?;
    tracing::info!(cluster = %name, namespace = %ns_name, "cluster deleted: namespace and agent access removed");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn agent_access_is_scoped_to_its_cluster() {
        let a = agent_access("ws", "east");
        let ns = names::cluster_namespace("ws", "east");
        assert_eq!(a.namespace.name_any(), ns);
        assert_eq!(a.namespace.labels()[labels::WORKSPACE], "ws");
        assert_eq!(a.namespace.labels()[labels::CLUSTER], "east");
        for obj in [
            &a.service_account.metadata,
            &a.token.metadata,
            &a.role.metadata,
            &a.role_binding.metadata,
        ] {
            assert_eq!(obj.namespace.as_deref(), Some(ns.as_str()));
        }
        assert_eq!(
            a.token.type_.as_deref(),
            Some("kubernetes.io/service-account-token")
        );
        assert_eq!(a.token.metadata.name.as_deref(), Some("tender-agent-token"));
        let ws_rules = a.workspace_role.rules.as_ref().unwrap();
        assert!(
            ws_rules
                .iter()
                .all(|r| r.resource_names.as_deref() == Some(&["east".to_string()][..])),
            "workspace rules are limited to the cluster's own object"
        );
        assert_eq!(a.workspace_role.metadata.namespace.as_deref(), Some("ws"));
        assert_eq!(a.workspace_role.name_any(), "tender-agent-east");
        let subject = &a.workspace_role_binding.subjects.as_ref().unwrap()[0];
        assert_eq!(subject.namespace.as_deref(), Some(ns.as_str()));
        let verbs: Vec<_> = a
            .role
            .rules
            .as_ref()
            .unwrap()
            .iter()
            .flat_map(|r| r.verbs.clone())
            .collect();
        assert!(
            !verbs.contains(&"delete".to_string()),
            "the agent never deletes on the hub"
        );
    }

    fn summary(desired: i32, ready: i32) -> BundleSummary {
        BundleSummary {
            desired_ready: desired,
            ready,
            wait_applied: desired - ready,
            ..Default::default()
        }
    }

    #[test]
    fn heartbeat_drives_connected_offline_and_recheck() {
        let after = Duration::from_secs(90);
        let (waiting, recheck) = cluster_status(
            None,
            "ns",
            None,
            summary(0, 0),
            false,
            Some(1),
            at(100),
            after,
        );
        assert_eq!(waiting.display.as_ref().unwrap().state, "WaitingForAgent");
        assert!(recheck.is_none(), "nothing to wait for without an agent");
        assert_eq!(waiting.namespace.as_deref(), Some("ns"));

        let (online, recheck) = cluster_status(
            Some(&waiting),
            "ns",
            Some(at(100)),
            summary(2, 2),
            false,
            Some(1),
            at(130),
            after,
        );
        assert_eq!(online.display.as_ref().unwrap().state, "Ready");
        assert!(conditions::is_true(
            &online.conditions,
            TYPE_AGENT_CONNECTED
        ));
        assert_eq!(recheck, Some(Duration::from_secs(61)), "re-check at expiry");

        let (again, _) = cluster_status(
            Some(&online),
            "ns",
            Some(at(120)),
            summary(2, 2),
            false,
            Some(1),
            at(140),
            after,
        );
        assert_eq!(again, online, "a fresh heartbeat alone changes nothing");

        let (offline, recheck) = cluster_status(
            Some(&online),
            "ns",
            Some(at(100)),
            summary(2, 2),
            false,
            Some(1),
            at(200),
            after,
        );
        assert_eq!(offline.display.as_ref().unwrap().state, "Offline");
        let ready = conditions::find_condition(&offline.conditions, TYPE_READY).unwrap();
        assert_eq!(ready.reason, reason::AGENT_OFFLINE);
        assert!(recheck.is_none());

        let (not_ready, _) = cluster_status(
            Some(&online),
            "ns",
            Some(at(100)),
            summary(2, 1),
            false,
            Some(1),
            at(110),
            after,
        );
        assert_eq!(not_ready.display.as_ref().unwrap().ready_bundles, "1/2");
        assert!(!conditions::is_true(&not_ready.conditions, TYPE_READY));
    }

    #[test]
    fn status_key_ignores_transition_times_only() {
        let status = |now, desired| {
            cluster_status(
                None,
                "ns",
                None,
                summary(desired, 0),
                false,
                Some(1),
                at(now),
                Duration::from_secs(90),
            )
            .0
        };
        assert_ne!(status(100, 1), status(101, 1), "the times differ");
        assert_eq!(status_key(&status(100, 1)), status_key(&status(101, 1)));
        assert_ne!(status_key(&status(100, 1)), status_key(&status(100, 2)));
    }

    #[test]
    fn heartbeat_is_the_later_of_lease_and_last_seen() {
        let mut c = Cluster::new("c", Default::default());
        assert_eq!(last_heartbeat(&c, None), None);
        assert_eq!(last_heartbeat(&c, Some(at(5))), Some(at(5)));
        c.status = Some(ClusterStatus {
            agent: Some(tender_types::AgentStatus {
                last_seen: Some(Time(at(9))),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(last_heartbeat(&c, Some(at(5))), Some(at(9)));
        assert_eq!(last_heartbeat(&c, Some(at(12))), Some(at(12)));
    }
}
