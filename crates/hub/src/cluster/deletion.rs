//! What a deleted Cluster leaves behind: its agent's cleanup downstream is awaited while the
//! agent reports in (decision 0068-deleted-cluster-waits-for-agent), then the BundleDeployments'
//! agent finalizers, the cluster namespace (only the hub's own,
//! decision 0074-cluster-namespaces-provably-the-hubs) and the workspace RBAC go.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use tender_runtime::executor::{ObjectKey, Op};
use tender_types::ownership::Ownership;
use tender_types::{BundleDeployment, Cluster, labels, names};

use super::namespace::namespace_ownership;
use super::{agent_heartbeat, release};
use crate::context::Ctx;
use crate::{Error, kube_err};

/// How long after a Cluster's deletion the hub waits, at most, for its agent to clean up what
/// it deployed before stripping the agent's finalizers
/// (decision 0068-deleted-cluster-waits-for-agent).
pub const AGENT_CLEANUP_GRACE: Duration = Duration::from_secs(60);

/// Where a deleted Cluster's cleanup stands with its agent.
#[derive(Debug)]
pub(super) enum AgentCleanup {
    /// Go on with [`cleanup`]: nothing holds the agent's finalizer, the agent does not report
    /// in (nothing will answer; what it deployed stays), or the grace has passed.
    Proceed,
    /// The agent reports in and still holds BundleDeployments: delete those not yet deleting
    /// and look again after `wait`.
    Wait { deletes: Vec<Op>, wait: Duration },
}

/// The step of a deleted Cluster's cleanup given its BundleDeployments (read fresh), the
/// agent's last heartbeat and when the Cluster was deleted. Pure.
pub(super) fn agent_cleanup_step(
    bds: &[BundleDeployment],
    heartbeat: Option<Timestamp>,
    deleted_at: Option<Timestamp>,
    now: Timestamp,
    offline_after: Duration,
    grace: Duration,
) -> AgentCleanup {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let holding: Vec<&BundleDeployment> = bds
        .iter()
        .filter(|bd| {
            bd.finalizers()
                .iter()
                .any(|f| f == labels::AGENT_CLEANUP_FINALIZER)
        })
        .collect();
    let reports_in =
        heartbeat.is_some_and(|h| now.as_millisecond() - h.as_millisecond() < ms(offline_after));
    let waited = deleted_at.map(|t| now.as_millisecond() - t.as_millisecond());
    let Some(waited) = waited.filter(|w| *w < ms(grace)) else {
        return AgentCleanup::Proceed;
    };
    if holding.is_empty() || !reports_in {
        return AgentCleanup::Proceed;
    }
    let deletes = holding
        .iter()
        .filter(|bd| bd.metadata.deletion_timestamp.is_none())
        .map(|bd| Op::Delete {
            key: ObjectKey::of::<BundleDeployment>(bd.namespace().as_deref(), &bd.name_any()),
            uid: bd.uid(),
        })
        .collect();
    let left = Duration::from_millis(u64::try_from(ms(grace) - waited).unwrap_or(0));
    AgentCleanup::Wait {
        deletes,
        wait: left.min(Duration::from_secs(2)),
    }
}

/// Deletes a deleted Cluster's BundleDeployments and says how long to wait while its agent,
/// still reporting in, cleans up downstream; `None`: go on with [`cleanup`].
pub(super) async fn await_agent_cleanup(
    cluster: &Cluster,
    ctx: &Ctx,
) -> Result<Option<Duration>, Error> {
    let workspace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let ns_name = names::cluster_namespace(&workspace, &name);
    if !matches!(
        namespace_ownership(ctx, cluster, &ns_name).await?.0,
        Ownership::Ours | Ownership::Claimed
    ) {
        return Ok(None);
    }
    // Read fresh, not from the cache: the agent's finalizer removals are what we wait for.
    let bds = list_fresh(ctx, &ns_name).await?;
    let step = agent_cleanup_step(
        &bds,
        agent_heartbeat(ctx, cluster, &ns_name),
        cluster.metadata.deletion_timestamp.as_ref().map(|t| t.0),
        ctx.clock.now(),
        ctx.config.agent_offline_after,
        AGENT_CLEANUP_GRACE,
    );
    match step {
        AgentCleanup::Proceed => Ok(None),
        AgentCleanup::Wait { deletes, wait } => {
            if !deletes.is_empty() {
                tracing::info!(cluster = %name, namespace = %ns_name, deployments = deletes.len(), "cluster deleted: waiting for its agent to clean up downstream");
            }
            for result in ctx.exec.execute_all(deletes, 16).await {
                result?;
            }
            Ok(Some(wait))
        }
    }
}

/// What the hub removes when a Cluster goes, in order: the agent's finalizer on each of the
/// cluster's BundleDeployments (nobody else would remove it), the namespace (and with it
/// BundleDeployments and copies), then the workspace RBAC. Pure.
pub(super) fn cleanup_ops(
    workspace: &str,
    cluster: &str,
    namespace_uid: Option<String>,
    bds: &[BundleDeployment],
) -> Vec<Op> {
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
        uid: namespace_uid,
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

/// The BundleDeployments in cluster namespace `ns`, read from the apiserver (none when the
/// namespace is gone).
async fn list_fresh(ctx: &Ctx, ns: &str) -> Result<Vec<BundleDeployment>, Error> {
    let api: Api<BundleDeployment> = Api::namespaced(ctx.client.clone(), ns);
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(e) if tender_runtime::reconcile::is_not_found(&e) => Ok(Vec::new()),
        Err(e) => Err(kube_err(format!("list BundleDeployments in {ns}"))(e)),
    }
}

/// Works without an agent: see [`cleanup_ops`].
pub(super) async fn cleanup(cluster: &Cluster, ctx: &Ctx) -> Result<Action, Error> {
    let workspace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let ns_name = names::cluster_namespace(&workspace, &name);
    release(cluster, ctx);
    // Only a namespace the hub created for this Cluster is emptied and deleted, that very
    // one (uid precondition); somebody else's is left as it is
    // (decision 0074-cluster-namespaces-provably-the-hubs).
    let (owner, uid) = namespace_ownership(ctx, cluster, &ns_name).await?;
    if !matches!(owner, Ownership::Ours | Ownership::Claimed) {
        tracing::info!(cluster = %name, namespace = %ns_name, "cluster deleted: its namespace is not tender's, left alone");
        return Ok(Action::await_change());
    }
    // Read fresh, not from the cache: a finalizer added a moment ago must not be missed.
    let list = list_fresh(ctx, &ns_name).await?;
    ctx.exec
        .execute_in_order(cleanup_ops(&workspace, &name, uid, &list))
        .await?;
    tracing::info!(cluster = %name, namespace = %ns_name, "cluster deleted: namespace and agent access removed");
    Ok(Action::await_change())
}
