//! Cluster controller: the cluster's namespace on the hub, its agent's identity and RBAC,
//! cleanup on deletion, and status (namespace, agent heartbeat, BundleDeployment summary).
//!
//! Pure parts: [`access`] (what an agent is granted) and [`status`] (the status written).

mod access;
mod deletion;
mod namespace;
mod status;

pub use access::{AgentAccess, agent_access, upstream_access};
pub use deletion::AGENT_CLEANUP_GRACE;
#[cfg(test)]
use deletion::{AgentCleanup, agent_cleanup_step};
use deletion::{await_agent_cleanup, cleanup};
use namespace::{create_namespace, namespace_ownership, record_namespace};
pub use status::{cluster_status, last_heartbeat};
use status::{not_owned_status, rollout_only, status_key, summary_wait};
use tender_types::ownership::Ownership;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, ObjectMeta};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::Event as Finalizer;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde_json::Value;
use tender_runtime::executor::{Apply, ObjectKey, Op, body_of};
use tender_runtime::retry;
use tender_types::{BundleDeployment, Cluster, ClusterMode, hash, labels, names};

use crate::context::{Ctx, status_op};
use crate::summary::summarize_with;
use crate::{Error, kube_err};

const CONTROLLER: &str = "cluster";

pub(crate) async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    if !ctx.serves(&cluster) {
        // Another shard's (or it just moved there): forget it, touch nothing
        // (decision 0062-hub-shards).
        release(&cluster, &ctx);
        warn_invalid_shard(&cluster, &ctx).await;
        return Ok(Action::await_change());
    }
    // A Cluster going away while its agent reports in: its BundleDeployments go first and the
    // agent cleans up downstream before the hub strips the agent's finalizers
    // (decision 0068-deleted-cluster-waits-for-agent).
    if cluster.metadata.deletion_timestamp.is_some()
        && cluster
            .finalizers()
            .iter()
            .any(|f| f == labels::CLUSTER_CLEANUP_FINALIZER)
        && let Some(wait) = await_agent_cleanup(&cluster, &ctx).await?
    {
        return Ok(Action::requeue(wait));
    }
    let workspace = cluster.namespace().unwrap_or_default();
    let api: Api<Cluster> = Api::namespaced(ctx.client.clone(), &workspace);
    retry::finalized(
        &api,
        labels::CLUSTER_CLEANUP_FINALIZER,
        cluster,
        &ctx.retries,
        |event| async {
            match event {
                Finalizer::Apply(c) => apply(&c, &ctx).await,
                Finalizer::Cleanup(c) => cleanup(&c, &ctx).await,
            }
        },
    )
    .await
}

pub(crate) fn error_policy(cluster: Arc<Cluster>, error: &Error, ctx: Arc<Ctx>) -> Action {
    retry::error_policy(
        CONTROLLER,
        cluster.as_ref(),
        error,
        &ctx.retries,
        &ctx.metrics,
    )
}

/// Forgets what this process keeps for `cluster`: its push task, pending summary and
/// provisioning memo. Never deletes anything.
fn release(cluster: &Cluster, ctx: &Ctx) {
    let key = (cluster.namespace().unwrap_or_default(), cluster.name_any());
    ctx.push.stop(&ObjectRef::from_obj(cluster));
    summary_due(ctx, key.clone(), None);
    ctx.provisioned.lock().expect("lock").remove(&key);
}

/// The unsharded replica's Warning Event on a Cluster whose shard label no replica can serve
/// (not a valid shard id: CEL cannot see labels), once per Cluster and value per process.
async fn warn_invalid_shard(cluster: &Cluster, ctx: &Ctx) {
    let Some(value) = cluster.labels().get(labels::SHARD) else {
        return;
    };
    let Err(why) = labels::validate_shard_id(value) else {
        return;
    };
    if ctx.config.shard_id.is_some() {
        return;
    }
    let key = (cluster.uid().unwrap_or_default(), value.clone());
    if !ctx.invalid_shards.lock().expect("lock").insert(key) {
        return;
    }
    let note = format!("{why}; no hub replica serves this Cluster until the label is fixed");
    ctx.event(
        &cluster.object_ref(&()),
        EventType::Warning,
        "InvalidShard",
        "Serve",
        note,
    )
    .await;
}

/// Labels every object of `access` with the serving replica's shard (none: unsharded), so
/// that replica's namespace cache holds the cluster's namespace (decision 0062-hub-shards).
fn in_shard(mut access: AgentAccess, shard: Option<&str>) -> AgentAccess {
    let Some(id) = shard else { return access };
    let metas = [
        &mut access.namespace.metadata,
        &mut access.service_account.metadata,
        &mut access.role.metadata,
        &mut access.role_binding.metadata,
        &mut access.workspace_role.metadata,
        &mut access.workspace_role_binding.metadata,
    ];
    for meta in metas {
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(labels::SHARD.to_string(), id.to_string());
    }
    access
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

/// Provisions the cluster namespace and the agent's access; `false` when the namespace is not
/// the hub's own (nothing is written then).
async fn provision(cluster: &Cluster, ctx: &Ctx) -> Result<bool, Error> {
    let workspace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let uid = cluster.uid().unwrap_or_default();
    let ns_name = names::cluster_namespace(&workspace, &name);
    let key = (workspace.clone(), name.clone());
    let mode = cluster.spec.mode();
    let done = (uid.clone(), mode);
    if ctx.owned_namespace(cluster).is_some()
        && ctx.provisioned.lock().expect("lock").get(&key) == Some(&done)
    {
        return Ok(true);
    }
    let access = in_shard(
        agent_access(&workspace, &name),
        ctx.config.shard_id.as_deref(),
    );
    let mut objects = access_objects(access, mode);
    // The namespace first: the hub writes only into one it created
    // (decision 0074-cluster-namespaces-provably-the-hubs).
    match namespace_ownership(ctx, cluster, &ns_name).await? {
        (Ownership::NotOurs, _) => {
            ctx.provisioned.lock().expect("lock").remove(&key);
            return Ok(false);
        }
        (Ownership::Absent, _) => {
            let namespace = objects.remove(0);
            if !create_namespace(ctx, cluster, namespace).await? {
                return Ok(false);
            }
            // The rest once the Cluster carries the record (its event brings us back).
            return Ok(true);
        }
        (Ownership::Claimed, uid) => {
            // Created by this hub, which stopped before recording it: record it now.
            tracing::info!(cluster = %name, namespace = %ns_name, "recording the uid of the cluster namespace created before a restart");
            record_namespace(ctx, cluster, uid.as_deref().unwrap_or_default()).await?;
            return Ok(true);
        }
        (Ownership::Ours, _) => {}
    }
    // Observe: each object's content-hash annotation (one metadata read per object, once per
    // Cluster and mode per process).
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
    Ok(true)
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
    if !provision(cluster, ctx).await? {
        return not_owned(cluster, ctx, &workspace, &ns_name).await;
    }
    if ctx.owned_namespace(cluster).is_none() {
        // Just created: its cache event and the Cluster's record of it bring us back.
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
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

    let heartbeat = agent_heartbeat(ctx, cluster, &ns_name);
    let bds: Vec<Arc<BundleDeployment>> = ctx
        .bundle_deployments_in(&ns_name)
        .into_iter()
        .filter(|bd| bd.metadata.deletion_timestamp.is_none())
        .collect();
    let summary = summarize_with(bds.len(), bds.iter().map(AsRef::as_ref), |bd| {
        ctx.expected_deployment_id(bd)
    });
    let now = ctx.clock.now();
    let status_with = |summary| {
        cluster_status(
            cluster.status.as_ref(),
            &ns_name,
            heartbeat,
            summary,
            cluster.spec.paused,
            push.as_ref(),
            cluster.metadata.generation,
            now,
            ctx.config.agent_offline_after,
        )
    };
    let written_summary = cluster.status.as_ref().and_then(|s| s.summary.clone());
    let (status, recheck) = status_with(summary);
    let desired = status_key(&status);
    let unchanged = cluster.status.as_ref() == Some(&status);
    // A change that only moves the summary waits (decision 0053-cluster-summary-delay): transient
    // BundleDeployment states (a rotation's WaitApplied, a fan-out's arrivals) coalesce into one
    // write, or none when the summary is back where it was.
    let summary_only = !unchanged
        && written_summary.as_ref().is_some_and(|old| {
            let (held, _) = status_with(old.clone());
            cluster.status.as_ref().map(status_key) == Some(status_key(&held))
        });
    // A new version rolling out to ready deployments waits longer
    // (decision 0066-rollout-summary-delay): at 1000 agents a rotation outlasts the summary delay,
    // and showing it cost two writes per cluster.
    let delay = summary_only.then(|| match (&written_summary, &status.summary) {
        (Some(old), Some(new)) if rollout_only(old, new) => {
            ctx.config.cluster_rollout_summary_delay
        }
        _ => ctx.config.cluster_summary_delay,
    });
    let due = summary_due(ctx, (workspace.clone(), name.clone()), delay);
    if let Some(wait) = due {
        let wait = recheck.map_or(wait, |r| r.min(wait));
        return Ok(Action::requeue(wait));
    }
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

/// A Cluster whose namespace is somebody else's: says so in its status, writes nothing else.
async fn not_owned(
    cluster: &Cluster,
    ctx: &Ctx,
    workspace: &str,
    ns_name: &str,
) -> Result<Action, Error> {
    tracing::warn!(cluster = %cluster.name_any(), namespace = %ns_name, "cluster namespace exists but was not created by tender for this Cluster; not provisioning");
    let status = not_owned_status(
        cluster.status.as_ref(),
        ns_name,
        cluster.metadata.generation,
        ctx.clock.now(),
    );
    let mut ours = status.clone();
    ours.agent = None;
    let unchanged = cluster.status.as_ref() == Some(&status);
    let op = status_op::<Cluster, _>(
        workspace,
        &cluster.name_any(),
        cluster.resource_version(),
        unchanged.then_some(&ours),
        &ours,
        status_key(&status),
    );
    ctx.write_status(op).await?;
    // Looked at again when the namespace or the Cluster changes.
    Ok(Action::await_change())
}

/// How long a summary-only status change of Cluster `key` still waits (`None`: write now);
/// `delay` is `Some` for a summary-only change.
fn summary_due(ctx: &Ctx, key: (String, String), delay: Option<Duration>) -> Option<Duration> {
    let mut due = ctx.summary_due.lock().expect("lock");
    summary_wait(&mut due, key, delay, ctx.clock.instant())
}

/// When Cluster `cluster` (namespace `ns`) last heard from its agent: its Lease in the cache
/// and `status.agent`.
pub(crate) fn agent_heartbeat(ctx: &Ctx, cluster: &Cluster, ns: &str) -> Option<Timestamp> {
    let lease = ctx
        .stores
        .leases
        .get(&ObjectRef::new(names::AGENT_LEASE).within(ns))
        .and_then(|l| l.spec.as_ref()?.renew_time.as_ref().map(|t| t.0));
    last_heartbeat(cluster, lease)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_deleted_cluster_waits_for_its_agent_only_while_it_reports_in_and_within_the_grace() {
        let bd = |name: &str, agent_finalizer: bool, deleting: bool| {
            let mut bd = BundleDeployment::new(name, Default::default());
            bd.metadata.namespace = Some("cluster-ws-east-1".into());
            bd.metadata.uid = Some(format!("uid-{name}"));
            if agent_finalizer {
                bd.metadata.finalizers = Some(vec![labels::AGENT_CLEANUP_FINALIZER.into()]);
            }
            if deleting {
                bd.metadata.deletion_timestamp = Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
                );
            }
            bd
        };
        let at = |s: i64| Timestamp::from_second(s).unwrap();
        let (offline, grace) = (Duration::from_secs(90), AGENT_CLEANUP_GRACE);
        let bds = vec![
            bd("a", true, false),
            bd("b", true, true),
            bd("c", false, false),
        ];
        // Deleted 10 s ago, agent seen 5 s ago: delete what is not deleting yet, by uid; wait.
        let AgentCleanup::Wait { deletes, wait } =
            agent_cleanup_step(&bds, Some(at(95)), Some(at(90)), at(100), offline, grace)
        else {
            panic!("expected a wait");
        };
        assert_eq!(wait, Duration::from_secs(2));
        assert_eq!(deletes.len(), 1, "{deletes:?}");
        assert!(
            matches!(&deletes[0], Op::Delete { key, uid } if key.name == "a" && uid.as_deref() == Some("uid-a"))
        );
        // Near the end of the grace: wait only what is left.
        let AgentCleanup::Wait { wait, .. } =
            agent_cleanup_step(&bds, Some(at(145)), Some(at(90)), at(149), offline, grace)
        else {
            panic!("expected a wait");
        };
        assert_eq!(wait, Duration::from_secs(1));
        for (why, heartbeat, now, bds) in [
            ("the grace has passed", Some(at(150)), at(150), bds.clone()),
            ("the agent is offline", Some(at(0)), at(100), bds.clone()),
            ("no agent ever reported", None, at(100), bds.clone()),
            (
                "nothing holds the agent's finalizer",
                Some(at(95)),
                at(100),
                vec![bd("c", false, false)],
            ),
        ] {
            assert!(
                matches!(
                    agent_cleanup_step(&bds, heartbeat, Some(at(90)), now, offline, grace),
                    AgentCleanup::Proceed
                ),
                "{why}"
            );
        }
    }

    #[test]
    fn a_legacy_long_lived_token_secret_is_deleted_and_never_written() {
        let objects = access_objects(agent_access("ws", "east"), ClusterMode::Pull);
        // Provisioned before decision 0044-expiring-agent-credentials: the token Secret exists
        // next to everything else.
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
}
