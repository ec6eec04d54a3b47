//! Wiring of one hub process: per scope, the caches, the trigger feeds and the four
//! controllers, which run only once every cache has synced.

use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, FutureExt};
use futures::stream::StreamExt;
use kube::Client;
use kube::runtime::Controller;
use kube::runtime::events::{Recorder, Reporter};
use tender_runtime::{Executor, Health, Metrics};
use tender_types::labels;

use crate::caches::{caches, synced};
use crate::context::{Ctx, Scope};
use crate::sources::SourceIndex;
use crate::triggers::{ControllerInputs, feeds};
use crate::{Error, HubConfig, HubMetrics, bundle, cluster, group, helmop, poll, upstream};

/// Builds caches and controllers for every configured scope and runs them.
pub(crate) async fn run_controllers(
    client: Client,
    config: Arc<HubConfig>,
    metrics: Arc<Metrics>,
    hub: HubMetrics,
    health: Health,
) -> Result<(), Error> {
    let scopes: Vec<Scope> = if config.workspace_namespaces.is_empty() {
        vec![Scope::All]
    } else {
        config
            .workspace_namespaces
            .iter()
            .map(|ns| Scope::Namespace(ns.clone()))
            .collect()
    };
    let discovered = crate::caches::discover(&client, &config.copyable_kinds).await;
    // The leader's keys: created if absent before anything is signed.
    let keys = Arc::new(crate::signing::load_or_create(&client, &config.signing).await?);
    let mut ready = Vec::new();
    let mut running = Vec::new();
    for scope in scopes {
        let (synced, run) = scope_controllers(
            scope,
            &discovered,
            client.clone(),
            config.clone(),
            metrics.clone(),
            hub.clone(),
            keys.clone(),
        );
        ready.push(synced);
        running.push(run);
    }
    let readiness = async move {
        for synced in ready {
            synced.await?;
        }
        health.set_ready(true);
        tracing::info!("caches synced; hub ready");
        // Keep this arm pending: readiness is not a reason to stop.
        futures::future::pending::<Result<(), Error>>().await
    };
    tokio::select! {
        result = readiness => result,
        () = async { futures::future::select_all(running).await; } => {
            tracing::warn!("a controller stopped");
            Ok(())
        }
    }
}

/// One scope: returns a future resolving when its caches have synced, and the future that
/// runs its caches and controllers.
fn scope_controllers(
    scope: Scope,
    discovered: &[crate::caches::DiscoveredKind],
    client: Client,
    config: Arc<HubConfig>,
    metrics: Arc<Metrics>,
    hub: HubMetrics,
    keys: Arc<crate::signing::HubKeys>,
) -> (
    BoxFuture<'static, Result<(), Error>>,
    BoxFuture<'static, ()>,
) {
    let (stores, events) = caches(
        &scope,
        config.shard_id.as_deref(),
        config.own_namespace(),
        &client,
        discovered,
    );
    // Counted on scrape while this scope runs (the guard leaves with the `run` future).
    let attached = hub.state.attach(
        config
            .shard_id
            .is_none()
            .then(|| (stores.clusters.clone(), stores.bundles.clone())),
        stores.bundle_deployments.clone(),
    );
    // Push tasks report state changes here; the Cluster controller writes them to status.
    let (push_tx, push_rx) = futures::channel::mpsc::unbounded();
    let mut push = crate::push::Push::new(
        client.clone(),
        config.push.clone(),
        config.copy_resources_downstream,
        config.instance.clone(),
        push_tx,
    );
    push.signing_keys = keys.public_keys.clone();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: labels::HUB_FIELD_MANAGER.to_string(),
            instance: Some(config.instance.clone()),
        },
    );
    let exec = Executor::new(
        client.clone(),
        labels::HUB_FIELD_MANAGER,
        recorder,
        metrics.clone(),
    );
    let shard_exec = config
        .shard_id
        .as_deref()
        .map(|id| executor(&client, &config, &metrics, &labels::shard_field_manager(id)));
    let ctx = Arc::new(Ctx {
        client,
        config,
        metrics,
        hub,
        exec,
        stores: stores.clone(),
        sources: SourceIndex::default(),
        source_hashes: Mutex::default(),
        provisioned: Mutex::default(),
        push,
        bd_names: Default::default(),
        upstream: Default::default(),
        retries: Default::default(),
        summary_due: Mutex::default(),
        shard_exec,
        invalid_shards: Mutex::default(),
        poller: crate::helm_poll::Poller::new(),
        keys: std::sync::RwLock::new(keys),
        published_chains: Mutex::default(),
        clock: crate::clock::Clock::System,
        rollout_writes: Default::default(),
    });
    let (feeds, inputs) = feeds(&ctx, events);

    let (synced_tx, synced_rx) = futures::channel::oneshot::channel::<Result<(), String>>();
    let scope_name = scope.describe();
    let controllers = async move {
        // Reconcilers plan against the caches: never start them on a partial view (an empty
        // cluster cache would untarget everything).
        let result = synced(stores.clone()).await;
        let failed = result.as_ref().err().map(ToString::to_string);
        let _ = synced_tx.send(result.map_err(|e| e.to_string()));
        if let Some(error) = failed {
            tracing::error!(%error, scope = %scope_name, "caches did not sync");
            return;
        }
        tracing::info!(scope = %scope_name, "caches synced; starting controllers");
        run(ctx, inputs, push_rx).await;
    };

    let run = async move {
        let _attached = attached;
        tokio::select! {
            _ = futures::future::join_all(feeds) => tracing::warn!("a watch ended"),
            () = controllers => tracing::warn!("controllers ended"),
        }
    }
    .boxed();
    let synced = async move {
        match synced_rx.await {
            Ok(Ok(())) => Ok(()),
            _ => Err(Error::CacheSync("hub caches")),
        }
    }
    .boxed();
    (synced, run)
}

/// An executor writing with field manager `manager` (a writer of its own part of a status).
fn executor(
    client: &Client,
    config: &HubConfig,
    metrics: &Arc<Metrics>,
    manager: &str,
) -> Executor {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: labels::HUB_FIELD_MANAGER.to_string(),
            instance: Some(config.instance.clone()),
        },
    );
    Executor::new(client.clone(), manager, recorder, metrics.clone())
}

/// The controllers, each driven by the shared cache of its kind (no watch of its own).
async fn run(
    ctx: Arc<Ctx>,
    inputs: ControllerInputs,
    push_states: futures::channel::mpsc::UnboundedReceiver<
        kube::runtime::reflector::ObjectRef<tender_types::Cluster>,
    >,
) {
    let ControllerInputs {
        bundles,
        polls,
        upstreams,
        upstream,
        all_upstreams,
        bundle,
        all_bundles,
        clusters,
        cluster,
        groups,
        group,
        helmops,
        helmop,
    } = inputs;
    let s = ctx.stores.clone();
    let cluster_controller = Controller::for_shared_stream(clusters, s.clusters)
        .reconcile_on(cluster)
        .reconcile_on(push_states)
        .run(cluster::reconcile, cluster::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    // Reverse sync (decision 0114-reverse-sync-controller): woken by what wakes the Bundle
    // controller; wakes it in turn when a Bundle's status lines changed.
    let (lines_tx, lines_changed) = futures::channel::mpsc::unbounded();
    let upstream_ctx = Arc::new(upstream::UpstreamCtx {
        ctx: ctx.clone(),
        lines_changed: lines_tx,
    });
    let upstream_controller = Controller::for_shared_stream(upstreams, s.bundles.clone())
        .reconcile_all_on(all_upstreams)
        .reconcile_on(upstream)
        .run(upstream::reconcile, upstream::error_policy, upstream_ctx)
        .for_each(|_| futures::future::ready(()));
    let bundle_controller = Controller::for_shared_stream(bundles, s.bundles.clone())
        .reconcile_all_on(all_bundles)
        .reconcile_on(bundle)
        .reconcile_on(lines_changed)
        .run(bundle::reconcile, bundle::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    // ClusterGroup counts (every replica caches every Cluster) and HelmOps (their Bundle and
    // the folded Bundle status) are the unsharded replica's alone (decision 0062-hub-shards); a
    // shard replica drops their trigger streams, so nothing queues up for them.
    if ctx.config.shard_id.is_some() {
        drop((groups, group, helmops, helmop, polls));
        tokio::join!(cluster_controller, bundle_controller, upstream_controller);
        return;
    }
    let group_controller = Controller::for_shared_stream(groups, s.groups)
        .reconcile_on(group)
        .run(group::reconcile, group::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    // Chart polling (decision 0113-chart-polling-controller): the unsharded replica looks
    // and records the version in Bundle status, which every replica's Bundle reconcile reads.
    let poll_ctx = Arc::new(poll::PollCtx {
        exec: executor(
            &ctx.client,
            &ctx.config,
            &ctx.metrics,
            &poll::field_manager(),
        ),
        ctx: ctx.clone(),
    });
    let poll_controller = Controller::for_shared_stream(polls, s.bundles)
        .run(poll::reconcile, poll::error_policy, poll_ctx)
        .for_each(|_| futures::future::ready(()));
    let helmop_controller = Controller::for_shared_stream(helmops, s.helmops)
        .reconcile_on(helmop)
        .run(helmop::reconcile, helmop::error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    tokio::join!(
        cluster_controller,
        group_controller,
        bundle_controller,
        upstream_controller,
        poll_controller,
        helmop_controller
    );
}
