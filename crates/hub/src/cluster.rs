//! Cluster controller: the cluster's namespace on the hub, its agent's identity and RBAC,
//! cleanup on deletion, and status (namespace, agent heartbeat, BundleDeployment summary).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde_json::Value;
use tender_runtime::executor::{Apply, ObjectKey, Op, body_of};
use tender_types::conditions::{
    self, TYPE_AGENT_CONNECTED, TYPE_CLUSTER_CONNECTED, TYPE_READY, reason,
};
use tender_types::{
    API_GROUP, BundleDeployment, BundleSummary, Cluster, ClusterDisplay, ClusterMode,
    ClusterStatus, hash, labels, names,
};

use crate::bundle::status::{summarize, summary_reason};
use crate::context::{Ctx, status_op};
use crate::push::PushState;
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
                // Renewing its own expiring token, and nobody else's.
                PolicyRule {
                    resource_names: Some(vec![sa.to_string()]),
                    ..rule(&[""], &["serviceaccounts/token"], &["create"])
                },
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

/// The Role and RoleBinding letting the agent of `cluster_ns` write exactly the placeholders of
/// one Bundle there (reverse sync): `get`/`patch`/`update` with `resourceNames`, never
/// `create`, `list` or another name. `None` when the Bundle has no placeholders there.
pub fn upstream_access(
    cluster_ns: &str,
    bundle: &str,
    secrets: &[String],
    config_maps: &[String],
    labels: &BTreeMap<String, String>,
) -> Option<(Role, RoleBinding)> {
    let verbs = ["get", "patch", "update"];
    let named = |resource: &str, names: &[String]| {
        (!names.is_empty()).then(|| PolicyRule {
            resource_names: Some(names.to_vec()),
            ..rule(&[""], &[resource], &verbs)
        })
    };
    let rules: Vec<PolicyRule> = [named("secrets", secrets), named("configmaps", config_maps)]
        .into_iter()
        .flatten()
        .collect();
    if rules.is_empty() {
        return None;
    }
    let name = names::upstream_role(bundle);
    let role = Role {
        metadata: meta(&name, Some(cluster_ns), labels),
        rules: Some(rules),
    };
    let binding = RoleBinding {
        metadata: meta(&name, Some(cluster_ns), labels),
        role_ref: RoleRef {
            api_group: Some(RBAC_GROUP.into()),
            kind: "Role".into(),
            name,
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: names::AGENT_SERVICE_ACCOUNT.into(),
            namespace: Some(cluster_ns.to_string()),
            ..Default::default()
        }]),
    };
    Some((role, binding))
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
/// heartbeat will expire. `push` is the hub's connection to a push cluster (`None`: pull mode):
/// it sets `ClusterConnected`, and a push cluster the hub cannot reach is not Ready for that
/// reason, whatever the heartbeat of its in-hub agent says.
#[allow(clippy::too_many_arguments)]
pub fn cluster_status(
    existing: Option<&ClusterStatus>,
    namespace: &str,
    heartbeat: Option<Timestamp>,
    summary: BundleSummary,
    paused: bool,
    push: Option<&PushState>,
    generation: Option<i64>,
    now: Timestamp,
    offline_after: Duration,
) -> (ClusterStatus, Option<Duration>) {
    let mut status = existing.cloned().unwrap_or_default();
    status.observed_generation = generation;
    status.namespace = Some(namespace.to_string());
    status.mode = Some(if push.is_some() {
        ClusterMode::Push
    } else {
        ClusterMode::Pull
    });
    let offline_ms = i64::try_from(offline_after.as_millis()).unwrap_or(i64::MAX);
    let (connected, agent_reason, agent_message, recheck) = match heartbeat {
        None if push.is_some() => (
            false,
            reason::WAITING_FOR_AGENT,
            "the hub's agent for this push cluster has not reported in yet".to_string(),
            None,
        ),
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
    match push {
        Some(state) => {
            conditions::set_condition(
                &mut status.conditions,
                TYPE_CLUSTER_CONNECTED,
                state.is_connected(),
                state.reason(),
                &state.message(),
                generation,
                now.clone(),
            );
        }
        None => status
            .conditions
            .retain(|c| c.type_ != TYPE_CLUSTER_CONNECTED),
    }
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
    let unreachable = push.filter(|p| !p.is_connected());
    let (ready, ready_reason, message, state) = if let Some(p) = unreachable {
        (false, p.reason(), p.message(), p.reason())
    } else if !connected {
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

/// Key of a status in the executor's write memo: its content without condition transition times.
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

/// One object of [`agent_access`], annotated with the hash of its content; `wanted: false`
/// means it must not exist (an agent RoleBinding of a push cluster).
struct Provisioned {
    key: ObjectKey,
    body: Value,
    hash: String,
    wanted: bool,
}

fn provisioned<K>(mut obj: K) -> Provisioned
where
    K: Resource<DynamicType = ()> + Serialize,
{
    let hash = hash::value_hash(&serde_json::to_value(&obj).unwrap_or_default());
    obj.meta_mut()
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::CONTENT_HASH.to_string(), hash.clone());
    let meta = obj.meta();
    Provisioned {
        key: ObjectKey::of::<K>(
            meta.namespace.as_deref(),
            meta.name.as_deref().unwrap_or_default(),
        ),
        body: body_of(&obj),
        hash,
        wanted: true,
    }
}

/// Every object of the agent's access, in creation order (namespace first). In push mode the
/// two RoleBindings are unwanted: a pull agent still running downstream then gets 403 on
/// everything and, by design, deletes nothing — it cannot fight the hub's own agent.
fn access_objects(access: AgentAccess, mode: ClusterMode) -> Vec<Provisioned> {
    let binding = |b: RoleBinding| Provisioned {
        wanted: mode == ClusterMode::Pull,
        ..provisioned(b)
    };
    let ns = access.namespace.metadata.name.clone();
    // Clusters registered before tokens expired had a long-lived token Secret: it must go.
    let legacy_token = Provisioned {
        wanted: false,
        ..provisioned(Secret {
            metadata: ObjectMeta {
                name: Some(names::AGENT_TOKEN_SECRET.to_string()),
                namespace: ns,
                ..Default::default()
            },
            ..Default::default()
        })
    };
    vec![
        provisioned(access.namespace),
        provisioned(access.service_account),
        legacy_token,
        provisioned(access.role),
        binding(access.role_binding),
        provisioned(access.workspace_role),
        binding(access.workspace_role_binding),
    ]
}

/// Applies for the wanted objects whose live content hash (`live[i]`: `None` when absent,
/// empty when present without one) differs from the desired one; deletes for the unwanted
/// objects that exist. Pure.
fn provision_ops(objects: Vec<Provisioned>, live: &[Option<String>]) -> Vec<Op> {
    objects
        .into_iter()
        .zip(live)
        .filter_map(|(o, live)| match (o.wanted, live) {
            (true, live) if live.as_deref() == Some(o.hash.as_str()) => None,
            (true, _) => Some(Op::Apply(Apply {
                key: o.key,
                body: o.body,
                replace_if_immutable: false,
                fingerprint: None,
            })),
            (false, Some(_)) => Some(Op::Delete {
                key: o.key,
                uid: None,
            }),
            (false, None) => None,
        })
        .collect()
}

/// What the hub removes when a Cluster goes, in order: the agent's finalizer on each of the
/// cluster's BundleDeployments (nobody else would remove it), the namespace (and with it
/// BundleDeployments and copies), then the workspace RBAC. Pure.
fn cleanup_ops(workspace: &str, cluster: &str, bds: &[BundleDeployment]) -> Vec<Op> {
    let ns = names::cluster_namespace(workspace, cluster);
    let mut ops: Vec<Op> = bds
        .iter()
        .filter(|bd| {
            bd.finalizers()
                .iter()
                .any(|f| f == labels::AGENT_CLEANUP_FINALIZER)
        })
        .map(|bd| {
            let kept: Vec<&String> = bd
                .finalizers()
                .iter()
                .filter(|f| *f != labels::AGENT_CLEANUP_FINALIZER)
                .collect();
            // resourceVersion makes this a compare-and-swap: a concurrent change fails and retries.
            Op::MergePatch {
                key: ObjectKey::of::<BundleDeployment>(Some(&ns), &bd.name_any()),
                patch: serde_json::json!({
                    "metadata": {"finalizers": kept, "resourceVersion": bd.resource_version()}
                }),
            }
        })
        .collect();
    let role = names::agent_workspace_role(cluster);
    ops.push(Op::Delete {
        key: ObjectKey::of::<Namespace>(None, &ns),
        uid: None,
    });
    ops.push(Op::Delete {
        key: ObjectKey::of::<RoleBinding>(Some(workspace), &role),
        uid: None,
    });
    ops.push(Op::Delete {
        key: ObjectKey::of::<Role>(Some(workspace), &role),
        uid: None,
    });
    ops
}

async fn provision(cluster: &Cluster, ctx: &Ctx) -> Result<(), Error> {
    let workspace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let uid = cluster.uid().unwrap_or_default();
    let ns_name = names::cluster_namespace(&workspace, &name);
    let key = (workspace.clone(), name.clone());
    let mode = cluster.spec.mode();
    let done = (uid.clone(), mode);
    let ns_cached = ctx
        .stores
        .namespaces
        .get(&ObjectRef::new(&ns_name))
        .is_some();
    if ns_cached && ctx.provisioned.lock().expect("lock").get(&key) == Some(&done) {
        return Ok(());
    }
    // Observe: each object's content-hash annotation (one metadata read per object, once per
    // Cluster and mode per process).
    let objects = access_objects(agent_access(&workspace, &name), mode);
    let mut live = Vec::with_capacity(objects.len());
    for o in &objects {
        let api: Api<DynamicObject> = match &o.key.namespace {
            Some(ns) => Api::namespaced_with(ctx.client.clone(), ns, &o.key.resource),
            None => Api::all_with(ctx.client.clone(), &o.key.resource),
        };
        let meta = api
            .get_metadata_opt(&o.key.name)
            .await
            .map_err(kube_err(format!("read {}", o.key)))?;
        live.push(meta.map(|m| {
            m.annotations()
                .get(labels::CONTENT_HASH)
                .cloned()
                .unwrap_or_default()
        }));
    }
    let ops = provision_ops(objects, &live);
    let wrote = !ops.is_empty();
    ctx.exec.execute_in_order(ops).await?;
    ctx.provisioned.lock().expect("lock").insert(key, done);
    if wrote {
        let note = match mode {
            ClusterMode::Pull => format!(
                "namespace {ns_name} with the agent's ServiceAccount, token Secret and RBAC"
            ),
            ClusterMode::Push => format!(
                "namespace {ns_name} for push mode; the pull agent's RoleBindings are removed"
            ),
        };
        ctx.event(
            &cluster.object_ref(&()),
            EventType::Normal,
            "Provisioned",
            "Provision",
            note,
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
    // Decide the status on the cache as it is now: the reconcile's snapshot may predate our
    // own last status write, whose watch event has since retired its memo entry.
    let latest = ctx.stores.clusters.get(&ObjectRef::from_obj(cluster));
    let cluster: &Cluster = latest.as_deref().unwrap_or(cluster);

    // Push mode: the kubeconfig Secret's metadata from the source cache; its content is read
    // only when its resourceVersion moved.
    let secret_version = cluster.spec.kubeconfig_secret_ref.as_ref().and_then(|r| {
        ctx.stores
            .source_secrets
            .get(&ObjectRef::new(&r.name).within(&workspace))
            .map(|s| s.resource_version().unwrap_or_default())
    });
    let push = ctx.push.ensure(cluster, secret_version.as_deref()).await?;

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
        push.as_ref(),
        cluster.metadata.generation,
        Timestamp::now(),
        ctx.config.agent_offline_after,
    );
    let desired = status_key(&status);
    let unchanged = cluster.status.as_ref() == Some(&status);
    let mut ours = status;
    ours.agent = None; // the agent's field: never written by the hub
    // `old` is what the hub's own fields would be if nothing changed (the agent's are not ours).
    let op = status_op::<Cluster, _>(
        &workspace,
        &name,
        cluster.resource_version(),
        unchanged.then_some(&ours),
        &ours,
        desired,
    );
    ctx.write_status(op).await?;
    Ok(recheck.map_or_else(Action::await_change, Action::requeue))
}

/// Works without an agent: see [`cleanup_ops`].
async fn cleanup(cluster: &Cluster, ctx: &Ctx) -> Result<Action, Error> {
    let workspace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let ns_name = names::cluster_namespace(&workspace, &name);
    ctx.push.stop(&ObjectRef::from_obj(cluster));
    ctx.provisioned
        .lock()
        .expect("lock")
        .remove(&(workspace.clone(), name.clone()));
    // Read fresh, not from the cache: a finalizer added a moment ago must not be missed.
    let bds: Api<BundleDeployment> = Api::namespaced(ctx.client.clone(), &ns_name);
    let list = match bds.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) if tender_runtime::reconcile::is_not_found(&e) => Vec::new(),
        Err(e) => return Err(kube_err(format!("list BundleDeployments in {ns_name}"))(e)),
    };
    ctx.exec
        .execute_in_order(cleanup_ops(&workspace, &name, &list))
        .await?;
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
    fn upstream_access_names_exactly_the_placeholders() {
        let (role, binding) =
            upstream_access("cns", "vpc", &["p1".to_string()], &[], &BTreeMap::new()).unwrap();
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["secrets".to_string()][..])
        );
        assert_eq!(
            rules[0].resource_names.as_deref(),
            Some(&["p1".to_string()][..])
        );
        assert_eq!(rules[0].verbs, ["get", "patch", "update"]);
        assert_eq!(binding.role_ref.name, "tender-agent-upstream-vpc");
        assert_eq!(
            binding.subjects.unwrap()[0].namespace.as_deref(),
            Some("cns")
        );
        assert!(upstream_access("cns", "vpc", &[], &[], &BTreeMap::new()).is_none());
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
            &a.role.metadata,
            &a.role_binding.metadata,
        ] {
            assert_eq!(obj.namespace.as_deref(), Some(ns.as_str()));
        }
        // The agent may mint tokens of its own ServiceAccount only.
        let mint: Vec<_> = a
            .role
            .rules
            .as_ref()
            .unwrap()
            .iter()
            .filter(|r| {
                r.resources
                    .iter()
                    .flatten()
                    .any(|x| x == "serviceaccounts/token")
            })
            .collect();
        assert_eq!(mint.len(), 1);
        assert_eq!(mint[0].verbs, ["create"]);
        assert_eq!(
            mint[0].resource_names.as_deref(),
            Some(&[names::AGENT_SERVICE_ACCOUNT.to_string()][..])
        );
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
            None,
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
            None,
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
            None,
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
            None,
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
            None,
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
                None,
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

    fn kinds(ops: &[Op]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                Op::Apply(a) => format!("apply {}", a.key),
                Op::Delete { key, .. } => format!("delete {key}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_legacy_long_lived_token_secret_is_deleted_and_never_written() {
        let objects = access_objects(agent_access("ws", "east"), ClusterMode::Pull);
        // Provisioned before decision 43: the token Secret exists next to everything else.
        let live: Vec<Option<String>> = objects.iter().map(|o| Some(o.hash.clone())).collect();
        let ops = kinds(&provision_ops(objects, &live));
        let ns = names::cluster_namespace("ws", "east");
        assert_eq!(ops.len(), 1, "{ops:?}");
        assert!(
            ops[0].starts_with("delete ") && ops[0].contains(names::AGENT_TOKEN_SECRET),
            "{ops:?}"
        );
        assert!(ops[0].contains(&ns), "{ops:?}");
        // A fresh cluster: nothing is created under that name.
        let objects = access_objects(agent_access("ws", "east"), ClusterMode::Pull);
        let none = vec![None; objects.len()];
        let ops = kinds(&provision_ops(objects, &none));
        assert!(
            ops.iter().all(|o| !o.contains(names::AGENT_TOKEN_SECRET)),
            "{ops:?}"
        );
    }

    #[test]
    fn push_mode_removes_the_agent_bindings_and_pull_restores_them() {
        let hashes = |objects: &[Provisioned]| -> Vec<Option<String>> {
            objects
                .iter()
                .map(|o| o.wanted.then(|| o.hash.clone()))
                .collect()
        };
        // Everything provisioned for pull: nothing changed → no operations.
        let pull = access_objects(agent_access("ws", "east"), ClusterMode::Pull);
        let live = hashes(&pull);
        assert!(provision_ops(pull, &live).is_empty(), "nothing changed");

        // Switched to push: exactly the two RoleBindings go, nothing else is written.
        let push = access_objects(agent_access("ws", "east"), ClusterMode::Push);
        let ops = kinds(&provision_ops(push, &live));
        assert_eq!(ops.len(), 2, "{ops:?}");
        assert!(
            ops.iter()
                .all(|o| o.starts_with("delete ") && o.contains("RoleBinding ")),
            "{ops:?}"
        );

        // Push, bindings already gone: no operations.
        let push = access_objects(agent_access("ws", "east"), ClusterMode::Push);
        let gone: Vec<Option<String>> = push
            .iter()
            .map(|o| o.wanted.then(|| o.hash.clone()))
            .collect();
        assert!(provision_ops(push, &gone).is_empty());

        // Back to pull: the two bindings are applied again.
        let pull = access_objects(agent_access("ws", "east"), ClusterMode::Pull);
        let ops = kinds(&provision_ops(pull, &gone));
        assert_eq!(ops.len(), 2, "{ops:?}");
        assert!(
            ops.iter()
                .all(|o| o.starts_with("apply ") && o.contains("RoleBinding ")),
            "{ops:?}"
        );
    }

    #[test]
    fn push_state_drives_cluster_connected_ready_and_mode() {
        let after = Duration::from_secs(90);
        let status = |existing: Option<&ClusterStatus>, push: Option<&PushState>, heartbeat| {
            cluster_status(
                existing,
                "ns",
                heartbeat,
                summary(1, 1),
                false,
                push,
                Some(1),
                at(100),
                after,
            )
            .0
        };
        let unreachable = PushState::Unreachable("no answer".into());
        let down = status(None, Some(&unreachable), Some(at(99)));
        assert_eq!(down.mode, Some(ClusterMode::Push));
        let connected =
            conditions::find_condition(&down.conditions, TYPE_CLUSTER_CONNECTED).unwrap();
        assert_eq!(
            (connected.status.as_str(), connected.reason.as_str()),
            ("False", "ClusterUnreachable")
        );
        let ready = conditions::find_condition(&down.conditions, TYPE_READY).unwrap();
        assert_eq!(
            ready.reason, "ClusterUnreachable",
            "unreachable wins over a fresh heartbeat"
        );
        assert_eq!(down.display.as_ref().unwrap().state, "ClusterUnreachable");

        for (state, reason) in [
            (
                PushState::KubeconfigMissing("x".into()),
                "KubeconfigMissing",
            ),
            (
                PushState::KubeconfigInvalid("x".into()),
                "KubeconfigInvalid",
            ),
            (
                PushState::ExecNotAllowed("x".into()),
                "KubeconfigExecNotAllowed",
            ),
            (PushState::Refused("x".into()), "KubeconfigRefused"),
        ] {
            let s = status(None, Some(&state), None);
            assert_eq!(
                conditions::find_condition(&s.conditions, TYPE_READY)
                    .unwrap()
                    .reason,
                reason
            );
        }

        let up = status(Some(&down), Some(&PushState::Connected), Some(at(99)));
        assert!(conditions::is_true(&up.conditions, TYPE_CLUSTER_CONNECTED));
        assert!(conditions::is_true(&up.conditions, TYPE_READY));
        assert_eq!(up.display.as_ref().unwrap().state, "Ready");
        assert_eq!(
            status(Some(&up), Some(&PushState::Connected), Some(at(99))),
            up,
            "nothing changed"
        );

        // Back to pull: the push condition goes, the mode says Pull.
        let pulled = status(Some(&up), None, Some(at(99)));
        assert_eq!(pulled.mode, Some(ClusterMode::Pull));
        assert!(conditions::find_condition(&pulled.conditions, TYPE_CLUSTER_CONNECTED).is_none());
        assert!(conditions::is_true(&pulled.conditions, TYPE_READY));
    }
}
