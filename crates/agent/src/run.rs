//! Start-up and wiring: the context, the heartbeat, the start-up sweep (retried with kube's
//! default backoff), the copy reflectors, the drift watches and the BundleDeployment controller.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube::runtime::PredicateConfig;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef as KubeRef};
use kube::runtime::watcher::{self, DefaultBackoff};
use kube::{Client, ResourceExt};
use tender_runtime::Health;
use tender_types::BundleDeployment;
use tender_types::conditions::reason;

use crate::config::{AgentConfig, ShutdownSignal};
use crate::context::Context;
use crate::plan;
use crate::reconcile::{error_policy, reconcile};
use crate::{AgentMetrics, Error, Result, cleanup, copies, heartbeat, namespaces, upstream};

pub(crate) async fn run(
    hub: Client,
    downstream: Client,
    config: AgentConfig,
    metrics: AgentMetrics,
    health: Health,
    shutdown: ShutdownSignal,
) -> Result<()> {
    let ns = config.cluster_namespace.clone();
    let (trigger, triggers) = mpsc::unbounded::<KubeRef<BundleDeployment>>();
    let registered = tender_types::signing::TrustedKeys::parse(&config.hub_signing_keys)
        .map_err(|e| Error::Config(format!("--hub-signing-keys: {e}")))?;
    if registered.is_empty() {
        tracing::warn!(
            "no hub signing key configured (--hub-signing-keys): every copy will be refused (HubKeyUnknown)"
        );
    }
    let (hub_copies, mut copy_feeds) = copies::stores(hub.clone(), &ns, registered);
    let (upstream_ping, upstream_pings) = mpsc::unbounded::<()>();
    copy_feeds.upstream = Some(upstream_ping.clone());
    let upstream_clients = (hub.clone(), downstream.clone());
    let (namespaces, namespace_writer) = namespaces::store();
    let ctx = Arc::new(Context::new(
        hub,
        downstream.clone(),
        config,
        metrics,
        hub_copies,
        namespaces.clone(),
        trigger.clone(),
    ));
    let mut background = tokio::task::JoinSet::new();
    background.spawn(heartbeat::run(
        ctx.hub_writer.clone(),
        ctx.config.clone(),
        ctx.metrics.clone(),
        shutdown.clone(),
    ));

    // Nothing is deployed (or swept) before the agent namespace exists and the sweep ran.
    let mut backoff = DefaultBackoff::default();
    while let Err(failure) = startup(&ctx).await {
        let delay = backoff.next().unwrap_or(std::time::Duration::from_secs(30));
        report_startup_failure(&ctx, &failure, delay);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.clone() => return Ok(()),
        }
    }
    ctx.metrics.hub_access(false);

    let (bd_store, bd_writer) = reflector::store();
    let bd_stream = reflector::reflector(
        bd_writer,
        tender_runtime::watch::watcher(ctx.bds.clone(), watcher::Config::default()),
    )
    .applied_objects()
    .predicate_filter(beyond_status, PredicateConfig::default());
    let controller = Controller::for_stream(bd_stream, bd_store)
        .with_config(ControllerConfig::default().concurrency(ctx.config.concurrency))
        .reconcile_on(triggers)
        .graceful_shutdown_on(shutdown.clone());
    let store = controller.store();

    // Downstream namespaces, for fan-out: listed before the first deploy (an empty cache
    // would prune every selected namespace), then followed so copies arrive in a namespace
    // that starts to match and go from one that stops.
    background.spawn(namespaces::feed(
        downstream,
        namespace_writer,
        store.clone(),
        trigger.clone(),
    ));
    tokio::select! {
        _ = namespaces.wait_until_ready() => {}
        () = shutdown.clone() => return Ok(()),
    }

    // Copies on the hub: keep them in memory (only this namespace), map changes to their BD.
    copy_feeds.spawn(store.clone(), trigger, &mut background);
    // Reverse sync: placeholders of this cluster namespace → their downstream objects.
    background.spawn(upstream::run(
        upstream_clients.0,
        upstream_clients.1,
        ns.clone(),
        ctx.config.identity.clone(),
        (
            ctx.config.policy.clone(),
            ctx.config.agent_namespace.clone(),
        ),
        (ctx.config.upstream_coalesce, ctx.config.upstream_retry),
        ctx.metrics.shared(),
        ctx.copies.stores(),
        store.clone(),
        upstream_ping,
        upstream_pings,
        shutdown.clone(),
    ));
    for kind in ["Secret", "ConfigMap"] {
        if let Ok((resource, _)) = ctx.down.resolve("v1", kind).await {
            ctx.drift.ensure(&resource);
        }
    }
    // Readiness is awaited in the controller's own task, not a spawned one: the store's
    // readiness signal keeps only the waker of the last poller, and the controller polls it
    // too (it holds reconciles until the store is ready), so a second task waiting on it is
    // never woken and the agent never reported ready.
    let ready = {
        let health = health.clone();
        async move {
            if store.wait_until_ready().await.is_ok() {
                health.set_ready(true);
            }
        }
    };
    tracing::info!(cluster_namespace = %ns, "agent running");
    let mut controller = std::pin::pin!(
        controller
            .run(reconcile, error_policy, ctx.clone())
            .for_each(|result| async move {
                if let Err(error) = result {
                    tracing::debug!(%error, "controller event");
                }
            })
    );
    tokio::select! {
        () = &mut controller => {}
        () = ready => controller.await,
    }
    health.set_ready(false);
    background.shutdown().await;
    Ok(())
}

/// Why start-up failed, and whether it is the hub refusing this agent (or its Cluster gone).
pub(crate) struct Failure {
    error: Error,
    hub_access_lost: bool,
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Self {
            error,
            hub_access_lost: false,
        }
    }
}

/// A hub request's error, marked as a lost access when the hub refuses the identity.
fn hub_failure(error: Error) -> Failure {
    let hub_access_lost = cleanup::access_lost(error.reason());
    Failure {
        error,
        hub_access_lost,
    }
}

/// Agent namespace downstream, then a successful hub list, then the sweep — only while the
/// agent's Cluster exists and is not being deleted
/// (decision 0081-an-agent-sweeps-only-for-a-live-cluster).
async fn startup(ctx: &Context) -> std::result::Result<(), Failure> {
    let agent_ns = &ctx.config.agent_namespace;
    let namespaces: Api<Namespace> = Api::all(ctx.down.client.clone());
    let existing = namespaces.get_opt(agent_ns).await.map_err(|e| {
        Error::kube(
            format!("read agent namespace {agent_ns} downstream"),
            false,
            e,
        )
    })?;
    if existing.is_none() {
        ctx.down_writer
            .execute(plan::namespace_op(agent_ns, plan::NamespaceMeta::default()))
            .await?;
    }
    let ns = &ctx.config.cluster_namespace;
    let list = ctx.bds.list(&ListParams::default()).await.map_err(|e| {
        hub_failure(Error::kube(
            format!("list BundleDeployments in {ns} on the hub"),
            false,
            e,
        ))
    })?;
    // An empty list is only meaningful while the Cluster exists: with an identity that still
    // authenticates (push mode, a client certificate) the list of a deleted cluster namespace
    // is empty, and sweeping it would delete everything. Read after the list.
    let name = &ctx.config.cluster_name;
    let ws = &ctx.config.workspace_namespace;
    let cluster = ctx.clusters.get_opt(name).await.map_err(|e| {
        hub_failure(Error::kube(
            format!("read Cluster {ws}/{name} on the hub"),
            false,
            e,
        ))
    })?;
    match cleanup::sweep_gate(cluster.as_ref()) {
        cleanup::SweepGate::Sweep => {}
        cleanup::SweepGate::SkipDeleting => {
            tracing::info!(cluster = %name, "the Cluster is being deleted on the hub: start-up sweep skipped");
            return Ok(());
        }
        cleanup::SweepGate::ClusterGone => {
            return Err(Failure {
                error: cluster_gone(ws, name),
                hub_access_lost: true,
            });
        }
    }
    let existing: BTreeSet<String> = list.items.iter().map(|bd| bd.name_any()).collect();
    Ok(cleanup::sweep(ctx, &existing).await?)
}

/// The start-up error of an agent whose Cluster does not exist on the hub.
fn cluster_gone(ws: &str, name: &str) -> Error {
    let status = kube::core::Status {
        code: 404,
        reason: "NotFound".into(),
        message: format!("Cluster {ws}/{name} does not exist"),
        ..Default::default()
    };
    Error::kube(
        format!("find Cluster {ws}/{name} on the hub (nothing is swept or deleted downstream)"),
        false,
        kube::Error::Api(status.boxed()),
    )
}

/// Logs a failed start-up and keeps the hub-access gauge: the hub refusing the identity or
/// the Cluster missing is an error (`HubAccessLost`) an operator must act on; anything else a
/// warning that retrying fixes.
fn report_startup_failure(ctx: &Context, failure: &Failure, retry_in: std::time::Duration) {
    let Failure {
        error,
        hub_access_lost,
    } = failure;
    ctx.metrics.hub_access(*hub_access_lost);
    if *hub_access_lost {
        tracing::error!(%error, reason = reason::HUB_ACCESS_LOST, cause = error.reason(), cluster = %ctx.config.cluster_name, ?retry_in, "the hub does not accept this agent (its Cluster was deleted, its access revoked or its token expired): nothing is deleted downstream; register the cluster again (tender cluster add) and replace the hub kubeconfig");
    } else {
        tracing::warn!(%error, reason = error.reason(), ?retry_in, "agent start-up (namespace, hub list, sweep) failed; retrying");
    }
}

/// What wakes the BundleDeployment controller: anything but the status and the bookkeeping
/// every write moves. The status is this agent's own report (and the upstream reporter's
/// entries): its echo would only run a reconcile that finds nothing to do, once per cluster
/// and rotation.
pub(crate) fn beyond_status(bd: &BundleDeployment) -> Option<u64> {
    let mut meta = bd.metadata.clone();
    meta.resource_version = None;
    meta.managed_fields = None;
    let json = serde_json::to_vec(&(&meta, &bd.spec)).ok()?;
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&json, &mut hasher);
    Some(std::hash::Hasher::finish(&hasher))
}

#[cfg(test)]
mod tests {
    use super::beyond_status;
    use tender_types::{BundleDeployment, BundleDeploymentSpec, BundleDeploymentStatus};

    #[test]
    fn only_a_status_write_leaves_the_controller_asleep() {
        let mut bd = BundleDeployment::new("app", BundleDeploymentSpec::default());
        bd.metadata.resource_version = Some("1".into());
        let before = beyond_status(&bd);
        // The agent's own report: a new status, a new resourceVersion, new managed fields.
        let mut reported = bd.clone();
        reported.status = Some(BundleDeploymentStatus {
            applied_copies_id: Some("x".into()),
            ..Default::default()
        });
        reported.metadata.resource_version = Some("2".into());
        reported.metadata.managed_fields = Some(Vec::new());
        assert_eq!(beyond_status(&reported), before);
        // The hub's spec, a label, or the deletion: each wakes it.
        let mut spec = bd.clone();
        spec.spec.deployment_id = "d2".into();
        assert_ne!(beyond_status(&spec), before);
        let mut labelled = bd.clone();
        labelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        assert_ne!(beyond_status(&labelled), before);
        let mut deleted = bd.clone();
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_ne!(beyond_status(&deleted), before);
    }
}
