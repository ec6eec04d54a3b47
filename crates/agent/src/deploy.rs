//! The BundleDeployment controller: copy → apply → prune → status, plus start-up wiring.

// A failed plan step carries its ObjectStatus; it is built once per object per reconcile.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions,
};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::{self, ObjectRef as KubeRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use tender_runtime::Health;
use tender_types::ObjectState;
use tender_types::labels::{self, AGENT_CLEANUP_FINALIZER, AGENT_FIELD_MANAGER};
use tender_types::{
    BundleDeployment, BundleDeploymentStatus, CopiedResource, ObjectRef, ObjectStatus, hash,
    namespaces,
};

use crate::downstream::Downstream;
use crate::drift::DriftWatches;
use crate::inventory::Inventory;
use crate::plan::{self, Desired, Owner};
use crate::status::{self, Outcome, describe};
use crate::{AgentConfig, AgentMetrics, Error, Result, ShutdownSignal, cleanup, heartbeat};

const CONTROLLER: &str = "bundledeployment";
/// Re-check of objects somebody else owns: their deletion does not reach our label-filtered watches.
const CONFLICT_RECHECK: Duration = Duration::from_secs(30);
/// The hub's copy is behind the BundleDeployment; its watch normally triggers us first.
const COPY_WAIT: Duration = Duration::from_secs(2);

/// Everything a reconcile needs, shared by `Arc`.
pub(crate) struct Context {
    pub(crate) bds: Api<BundleDeployment>,
    pub(crate) hub: Client,
    pub(crate) down: Downstream,
    pub(crate) inventory: Inventory,
    pub(crate) config: AgentConfig,
    pub(crate) metrics: AgentMetrics,
    secrets: Store<Secret>,
    config_maps: Store<ConfigMap>,
    drift: DriftWatches,
    recorder: Recorder,
    failures: Mutex<HashMap<String, u32>>,
}

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
    let (secrets, secret_writer) = reflector::store::<Secret>();
    let (config_maps, config_map_writer) = reflector::store::<ConfigMap>();
    let ctx = Arc::new(Context {
        bds: Api::namespaced(hub.clone(), &ns),
        hub: hub.clone(),
        down: Downstream::new(downstream.clone()),
        inventory: Inventory::new(downstream.clone(), &config.agent_namespace),
        drift: DriftWatches::new(downstream.clone(), &ns, trigger.clone()),
        recorder: Recorder::new(
            hub.clone(),
            Reporter {
                controller: "tender-agent".into(),
                instance: Some(config.identity.clone()),
            },
        ),
        config: config.clone(),
        metrics: metrics.clone(),
        secrets,
        config_maps,
        failures: Mutex::new(HashMap::new()),
    });
    let mut background = tokio::task::JoinSet::new();
    background.spawn(heartbeat::run(
        hub.clone(),
        config.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));

    // Nothing is deployed (or swept) before the agent namespace exists and the sweep ran.
    let mut delay = Duration::from_millis(500);
    loop {
        match startup(&ctx).await {
            Ok(()) => break,
            Err(error) => {
                tracing::warn!(%error, retry_in = ?delay, "agent start-up (namespace, hub list, sweep) failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown.clone() => return Ok(()),
                }
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }

    let controller = Controller::new(ctx.bds.clone(), watcher::Config::default())
        .with_config(ControllerConfig::default().concurrency(ctx.config.concurrency))
        .reconcile_on(triggers)
        .graceful_shutdown_on(shutdown.clone());
    let store = controller.store();

    // Copies on the hub: keep them in memory (only this namespace), map changes to their BD.
    background.spawn(watch_copies(
        Api::<Secret>::namespaced(hub.clone(), &ns),
        secret_writer,
        store.clone(),
        trigger.clone(),
        "Secret",
    ));
    background.spawn(watch_copies(
        Api::<ConfigMap>::namespaced(hub.clone(), &ns),
        config_map_writer,
        store.clone(),
        trigger.clone(),
        "ConfigMap",
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

/// Agent namespace downstream, then a successful hub list, then the sweep.
async fn startup(ctx: &Context) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(ctx.down.client.clone());
    let agent_ns = &ctx.config.agent_namespace;
    if namespaces
        .get_opt(agent_ns)
        .await
        .map_err(|e| Error::kube(format!("reading agent namespace {agent_ns} downstream"), e))?
        .is_none()
    {
        create_namespace(&namespaces, agent_ns).await.map_err(|e| {
            Error::kube(format!("creating agent namespace {agent_ns} downstream"), e)
        })?;
    }
    let list = ctx.bds.list(&ListParams::default()).await.map_err(|e| {
        Error::kube(
            format!(
                "listing BundleDeployments in {} on the hub",
                ctx.config.cluster_namespace
            ),
            e,
        )
    })?;
    let existing: BTreeSet<String> = list.items.iter().map(|bd| bd.name_any()).collect();
    cleanup::sweep(ctx, &existing).await
}

async fn create_namespace(api: &Api<Namespace>, name: &str) -> Result<(), kube::Error> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [(
                    labels::MANAGED_BY.to_string(),
                    labels::MANAGED_BY_VALUE.to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Reflects the copies of one kind and triggers the BundleDeployments that reference them
/// (by ownerReference, and by `copyName` in case the owner reference is missing).
async fn watch_copies<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    bds: Store<BundleDeployment>,
    trigger: mpsc::UnboundedSender<KubeRef<BundleDeployment>>,
    kind: &'static str,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let mut stream =
        reflector::reflector(writer, watcher::watcher(api, watcher::Config::default()))
            .default_backoff()
            .touched_objects()
            .boxed();
    while let Some(item) = stream.next().await {
        let obj = match item {
            Ok(o) => o,
            Err(error) => {
                tracing::warn!(%kind, %error, "watching copies on the hub failed; retrying with backoff");
                continue;
            }
        };
        let name = obj.name_any();
        let ns = obj.namespace().unwrap_or_default();
        let mut owners: BTreeSet<String> = obj
            .owner_references()
            .iter()
            .filter(|o| o.kind == "BundleDeployment")
            .map(|o| o.name.clone())
            .collect();
        for bd in bds.state() {
            if bd
                .spec
                .options
                .downstream_resources
                .iter()
                .any(|r| r.kind == kind && r.copy_name == name)
            {
                owners.insert(bd.name_any());
            }
        }
        for owner in owners {
            let _ = trigger.unbounded_send(KubeRef::new(&owner).within(&ns));
        }
    }
}

async fn reconcile(bd: Arc<BundleDeployment>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.base().reconcile(CONTROLLER);
    let name = bd.name_any();
    let action = finalizer(&ctx.bds, AGENT_CLEANUP_FINALIZER, bd, |event| async {
        match event {
            FinalizerEvent::Apply(bd) => deploy(&bd, &ctx).await,
            FinalizerEvent::Cleanup(bd) => cleanup::finalize(&bd, &ctx).await,
        }
    })
    .await
    .map_err(|source| Error::Finalizer {
        name: name.clone(),
        source: Box::new(source),
    })?;
    ctx.failures.lock().expect("failures").remove(&name);
    Ok(action)
}

fn error_policy(bd: Arc<BundleDeployment>, error: &Error, ctx: Arc<Context>) -> Action {
    let name = bd.name_any();
    let attempt = {
        let mut failures = ctx.failures.lock().expect("failures");
        let n = failures.entry(name.clone()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    ctx.metrics
        .base()
        .reconcile_error(CONTROLLER, error.reason());
    let delay = Duration::from_millis(500 * 2u64.saturating_pow(attempt.min(7)))
        .min(Duration::from_secs(60));
    tracing::warn!(bundle_deployment = %name, %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// A summary of a client error that is safe for status and logs: for Secrets only the reason
/// and code (an apiserver message could quote a value), otherwise the message.
pub(crate) fn error_text(error: &kube::Error, secret: bool) -> String {
    match error {
        kube::Error::Api(s) if secret => format!("{} ({})", s.reason, s.code),
        kube::Error::Api(s) => format!("{}: {}", s.reason, s.message),
        other => other.to_string(),
    }
}

fn object_status(key: &ObjectRef, state: ObjectState, message: Option<String>) -> ObjectStatus {
    ObjectStatus {
        api_version: key.api_version.clone(),
        kind: key.kind.clone(),
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        state,
        message,
    }
}

/// One planned object: what to write, or why it cannot be (already a status).
type Planned = std::result::Result<Desired, ObjectStatus>;

async fn plan_copy(
    ctx: &Context,
    entry: &CopiedResource,
    copies_ns: &str,
    owner: &Owner,
    keep: bool,
) -> Planned {
    let key = plan::key("v1", &entry.kind, Some(copies_ns), &entry.name);
    let ns = &ctx.config.cluster_namespace;
    let fail = |msg: String| Err(object_status(&key, ObjectState::Missing, Some(msg)));
    match entry.kind.as_str() {
        "Secret" => match hub_copy(
            &ctx.secrets,
            Api::namespaced(ctx.hub.clone(), ns),
            entry,
            hash::secret_hash,
        )
        .await
        {
            Ok(c) => Ok(plan::secret_copy(&c, entry, copies_ns, owner, keep)),
            Err(msg) => fail(msg),
        },
        "ConfigMap" => match hub_copy(
            &ctx.config_maps,
            Api::namespaced(ctx.hub.clone(), ns),
            entry,
            hash::config_map_hash,
        )
        .await
        {
            Ok(c) => Ok(plan::config_map_copy(&c, entry, copies_ns, owner, keep)),
            Err(msg) => fail(msg),
        },
        other => Err(object_status(
            &key,
            ObjectState::Error,
            Some(format!(
                "kind {other} cannot be copied (only Secret and ConfigMap)"
            )),
        )),
    }
}

/// The copy on the hub whose content hashes to `entry.hash` (which only the hub writes, in the
/// BundleDeployment spec): from the watch cache, else fetched. Content is verified, not the
/// annotation, so a copy edited on the hub by anyone else is never deployed.
async fn hub_copy<K>(
    store: &Store<K>,
    api: Api<K>,
    entry: &CopiedResource,
    content_hash: fn(&K) -> String,
) -> std::result::Result<K, String>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let matches = |k: &K| content_hash(k) == entry.hash;
    let ns = api.namespace().map(str::to_string);
    let mut key = KubeRef::<K>::new(&entry.copy_name);
    if let Some(ns) = &ns {
        key = key.within(ns);
    }
    if let Some(cached) = store.get(&key).filter(|k| matches(k)) {
        return Ok((*cached).clone());
    }
    match api.get_opt(&entry.copy_name).await {
        Ok(Some(k)) if matches(&k) => Ok(k),
        Ok(Some(_)) => Err(format!(
            "copy {} on the hub does not match this deployment yet",
            entry.copy_name
        )),
        Ok(None) => Err(format!(
            "copy {} not found in the cluster namespace on the hub",
            entry.copy_name
        )),
        Err(e) => Err(format!(
            "cannot read copy {} on the hub: {}",
            entry.copy_name,
            error_text(&e, entry.kind == "Secret")
        )),
    }
}

async fn deploy(bd: &BundleDeployment, ctx: &Context) -> Result<Action> {
    let name = bd.name_any();
    let owner = Owner::new(&ctx.config.cluster_namespace, &name);
    let spec = &bd.spec;
    let opts = &spec.options;
    let prev = bd.status.as_ref();
    let prev_applied = prev.and_then(|s| s.applied_deployment_id.clone());
    let pending = prev_applied.as_deref() != Some(spec.deployment_id.as_str());
    let mut outcome = Outcome {
        deployment_id: spec.deployment_id.clone(),
        generation: bd.metadata.generation,
        applied_id: prev_applied,
        ..Default::default()
    };
    if spec.paused && pending {
        outcome.paused = true;
        outcome.manifests = prev.map(|p| p.resources.clone()).unwrap_or_default();
        write_status(ctx, bd, &outcome).await?;
        return Ok(Action::await_change());
    }

    // Plan.
    let default_ns = Some(opts.default_namespace.as_str()).filter(|d| !d.is_empty());
    let copies_ns =
        namespaces::copies_namespace(opts.target_namespace.as_deref(), default_ns).to_string();
    outcome.copy_feature_disabled =
        !ctx.config.copy_resources_downstream && !opts.downstream_resources.is_empty();
    let mut copies: Vec<Planned> = Vec::new();
    if !outcome.copy_feature_disabled {
        for entry in &opts.downstream_resources {
            copies.push(plan_copy(ctx, entry, &copies_ns, &owner, opts.keep_resources).await);
        }
    }
    let mut manifests: Vec<Planned> = Vec::new();
    for m in &spec.resources {
        manifests.push(plan_manifest(ctx, m, opts, &owner).await);
    }
    let desired_keys: Vec<ObjectRef> = copies
        .iter()
        .chain(&manifests)
        .filter_map(|p| p.as_ref().ok().map(|d| d.key.clone()))
        .collect();

    // Record what may be created before creating it, so a crash leaves nothing unknown.
    let prev_inventory = ctx.inventory.read(&owner).await?;
    let recorded = plan::union(prev_inventory.as_deref().unwrap_or_default(), &desired_keys);
    ctx.inventory
        .write(&owner, prev_inventory.as_deref(), &recorded)
        .await?;

    // Namespace manifests first, then the other namespaces, then copies, then the rest.
    let is_ns = |p: &Planned| {
        p.as_ref().is_ok_and(|d| {
            d.key.kind == "Namespace" && plan::group_of(&d.key.api_version).is_empty()
        })
    };
    let own_namespaces: BTreeSet<String> = manifests
        .iter()
        .filter(|p| is_ns(p))
        .filter_map(|p| p.as_ref().ok().map(|d| d.key.name.clone()))
        .collect();
    let mut manifest_states: Vec<Option<ObjectStatus>> = vec![None; manifests.len()];
    let sync = SyncMode {
        pending,
        correct: opts.correct_drift,
        take: opts.take_ownership,
    };
    for (i, p) in manifests.iter().enumerate() {
        if let Ok(d) = p
            && is_ns(p)
        {
            manifest_states[i] =
                Some(sync_object(ctx, d, &owner, sync, &mut outcome.corrected).await);
        }
    }
    let mut needed: BTreeSet<String> = manifests
        .iter()
        .filter_map(|p| p.as_ref().ok().and_then(|d| d.key.namespace.clone()))
        .collect();
    if copies.iter().any(|c| c.is_ok()) {
        needed.insert(copies_ns.clone());
    }
    let mut namespace_errors: HashMap<String, String> = HashMap::new();
    for ns in needed.difference(&own_namespaces) {
        if let Err(msg) = ensure_namespace(ctx, ns).await {
            namespace_errors.insert(ns.clone(), msg);
        }
    }
    let ns_error = |d: &Desired| {
        d.key
            .namespace
            .as_ref()
            .and_then(|ns| namespace_errors.get(ns))
            .map(|msg| object_status(&d.key, ObjectState::Error, Some(msg.clone())))
    };

    for p in &copies {
        let s = match p {
            Err(s) => s.clone(),
            Ok(d) => match ns_error(d) {
                Some(s) => s,
                None => sync_object(ctx, d, &owner, sync, &mut outcome.corrected).await,
            },
        };
        outcome.copies.push(s);
    }
    let healthy =
        |s: &ObjectStatus| s.state == ObjectState::Ready || s.state == ObjectState::NotReady;
    let copies_in_place = outcome.copies.iter().all(healthy);
    for (i, p) in manifests.iter().enumerate() {
        let s = match (manifest_states[i].take(), p) {
            (Some(s), _) => s,
            (None, Err(s)) => s.clone(),
            (None, Ok(d)) if pending && !copies_in_place => object_status(
                &d.key,
                ObjectState::Missing,
                Some("waiting for every copy to be in place".into()),
            ),
            (None, Ok(d)) => match ns_error(d) {
                Some(s) => s,
                None => sync_object(ctx, d, &owner, sync, &mut outcome.corrected).await,
            },
        };
        outcome.manifests.push(s);
    }

    // Prune and narrow the inventory only when everything desired is in place.
    let all_in_place = outcome.copies.iter().chain(&outcome.manifests).all(healthy);
    if all_in_place {
        let stale = plan::prune_set(&recorded, &desired_keys);
        cleanup::remove_objects(ctx, &owner, &stale, opts.keep_resources).await?;
        ctx.inventory
            .write(&owner, Some(&recorded), &desired_keys)
            .await?;
        if pending {
            outcome.applied_id = Some(spec.deployment_id.clone());
            ctx.metrics.deployed();
            tracing::info!(bundle_deployment = %name, deployment_id = %spec.deployment_id, "deployment applied");
        }
    }
    let blocked = outcome.copies.iter().chain(&outcome.manifests).any(|s| {
        s.state == ObjectState::Conflict
            || s.state == ObjectState::Error
            || s.state == ObjectState::Missing
    });
    write_status(ctx, bd, &outcome).await?;
    Ok(if !blocked {
        Action::await_change()
    } else if outcome
        .copies
        .iter()
        .any(|s| s.state == ObjectState::Missing)
    {
        Action::requeue(COPY_WAIT)
    } else {
        Action::requeue(CONFLICT_RECHECK)
    })
}

async fn plan_manifest(
    ctx: &Context,
    m: &tender_types::Manifest,
    opts: &tender_types::BundleDeploymentOptions,
    owner: &Owner,
) -> Planned {
    let key = plan::key(
        m.api_version().unwrap_or_default(),
        m.kind().unwrap_or_default(),
        m.namespace(),
        m.name().unwrap_or_default(),
    );
    let (resource, namespaced) = ctx
        .down
        .resolve(&key.api_version, &key.kind)
        .await
        .map_err(|e| {
            object_status(
                &key,
                ObjectState::Error,
                Some(format!("unknown kind downstream: {e}")),
            )
        })?;
    ctx.drift.ensure(&resource);
    plan::manifest(m, namespaced, opts, owner)
        .map_err(|msg| object_status(&key, ObjectState::Error, Some(msg)))
}

async fn ensure_namespace(ctx: &Context, ns: &str) -> std::result::Result<(), String> {
    let api: Api<Namespace> = Api::all(ctx.down.client.clone());
    match api.get_opt(ns).await {
        Ok(Some(n)) if n.metadata.deletion_timestamp.is_some() => {
            Err(format!("namespace {ns} is being deleted downstream"))
        }
        Ok(Some(_)) => Ok(()),
        Ok(None) => {
            ctx.metrics.written("apply", "Namespace");
            create_namespace(&api, ns)
                .await
                .map_err(|e| format!("cannot create namespace {ns}: {}", error_text(&e, false)))
        }
        Err(e) => Err(format!(
            "cannot read namespace {ns}: {}",
            error_text(&e, false)
        )),
    }
}

#[derive(Clone, Copy)]
struct SyncMode {
    pending: bool,
    correct: bool,
    take: bool,
}

/// Brings one object in line with `d` (or reports why not) and returns its state.
async fn sync_object(
    ctx: &Context,
    d: &Desired,
    owner: &Owner,
    mode: SyncMode,
    corrected: &mut Vec<ObjectRef>,
) -> ObjectStatus {
    let secret = d.key.kind == "Secret" && d.key.api_version == "v1";
    let error = |msg: String| object_status(&d.key, ObjectState::Error, Some(msg));
    let (api, resource) = match ctx.down.api(&d.key).await {
        Ok(x) => x,
        Err(e) => return error(e.to_string()),
    };
    let existing = match api.get_opt(&d.key.name).await {
        Ok(e) => e,
        Err(e) => return error(format!("cannot read: {}", error_text(&e, secret))),
    };
    let write = match &existing {
        None if mode.pending || mode.correct => true,
        None => {
            ctx.metrics.drift(false);
            return object_status(
                &d.key,
                ObjectState::Missing,
                Some("deleted downstream; correctDrift is off".into()),
            );
        }
        Some(obj) => {
            let adopt = match plan::may_write(
                &plan::ownership(obj.metadata.annotations.as_ref(), owner),
                mode.take,
            ) {
                Ok(adopt) => adopt,
                Err(msg) => {
                    ctx.metrics.conflict();
                    return object_status(&d.key, ObjectState::Conflict, Some(msg));
                }
            };
            let value = serde_json::to_value(obj).unwrap_or_default();
            if !adopt && plan::in_sync(d, &value) {
                return ready_status(&d.key, &value);
            }
            if !(mode.pending || mode.correct || adopt) {
                ctx.metrics.drift(false);
                return object_status(
                    &d.key,
                    ObjectState::Modified,
                    Some("changed downstream; correctDrift is off".into()),
                );
            }
            if plan::needs_recreate(d, &value) {
                let uid = obj.metadata.uid.clone();
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid,
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                if let Err(e) = api.delete(&d.key.name, &dp).await
                    && !matches!(&e, kube::Error::Api(s) if s.code == 404)
                {
                    return error(format!("cannot replace: {}", error_text(&e, secret)));
                }
                ctx.metrics.written("recreate", &d.key.kind);
                if let Err(msg) = wait_gone(&api, &d.key.name).await {
                    return error(msg);
                }
            }
            true
        }
    };
    debug_assert!(write);
    let drifted = existing.is_some() || !mode.pending;
    match apply(&api, d).await {
        Ok(applied) => {
            ctx.metrics.written("apply", &d.key.kind);
            let mut value = serde_json::to_value(&applied).unwrap_or_default();
            // Server-side apply keeps keys other managers added to a copy's data; drop them.
            if d.copy
                && let Some(patch) = extra_data_patch(d, &value)
            {
                match api
                    .patch(&d.key.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(o) => value = serde_json::to_value(&o).unwrap_or_default(),
                    Err(e) => {
                        return error(format!(
                            "cannot remove extra keys: {}",
                            error_text(&e, secret)
                        ));
                    }
                }
            }
            if !mode.pending && drifted {
                ctx.metrics.drift(true);
                corrected.push(d.key.clone());
                tracing::info!(object = %describe(&d.key), "restored after downstream drift");
            }
            ctx.drift.ensure(&resource);
            ready_status(&d.key, &value)
        }
        Err(e) => error(format!("apply failed: {}", error_text(&e, secret))),
    }
}

async fn apply(
    api: &Api<kube::api::DynamicObject>,
    d: &Desired,
) -> Result<kube::api::DynamicObject, kube::Error> {
    api.patch(
        &d.key.name,
        &PatchParams::apply(AGENT_FIELD_MANAGER).force(),
        &Patch::Apply(&d.body),
    )
    .await
}

/// Waits (bounded) until a deleted object is gone, so the recreate does not hit its tombstone.
async fn wait_gone(
    api: &Api<kube::api::DynamicObject>,
    name: &str,
) -> std::result::Result<(), String> {
    for _ in 0..50 {
        match api.get_opt(name).await {
            Ok(None) => return Ok(()),
            Ok(Some(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => {
                return Err(format!(
                    "cannot read while replacing: {}",
                    error_text(&e, false)
                ));
            }
        }
    }
    Err("object still present 5s after deleting it for replacement".into())
}

/// Merge patch removing data/binaryData keys a copy has downstream but not on the hub.
fn extra_data_patch(d: &Desired, existing: &Value) -> Option<Value> {
    let mut patch = Map::new();
    for field in ["data", "binaryData"] {
        let wanted = d.body.get(field).and_then(Value::as_object);
        let extra: Map<String, Value> = existing
            .get(field)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter(|(k, _)| wanted.is_none_or(|w| !w.contains_key(*k)))
            .map(|(k, _)| (k.clone(), Value::Null))
            .collect();
        if !extra.is_empty() {
            patch.insert(field.into(), Value::Object(extra));
        }
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

fn ready_status(key: &ObjectRef, value: &Value) -> ObjectStatus {
    match plan::readiness(value) {
        Ok(()) => object_status(key, ObjectState::Ready, None),
        Err(msg) => object_status(key, ObjectState::NotReady, Some(msg)),
    }
}

/// Writes the computed status if it differs from the current one, and publishes events for
/// notable transitions.
async fn write_status(ctx: &Context, bd: &BundleDeployment, outcome: &Outcome) -> Result<()> {
    let prev = bd.status.as_ref();
    let new = status::compute(prev, outcome, Time(Timestamp::now()));
    if prev == Some(&new) {
        return Ok(());
    }
    let name = bd.name_any();
    let body = json!({
        "apiVersion": tender_types::API_GROUP_VERSION,
        "kind": "BundleDeployment",
        "metadata": { "name": name },
        "status": new,
    });
    ctx.bds
        .patch_status(
            &name,
            &PatchParams::apply(AGENT_FIELD_MANAGER).force(),
            &Patch::Apply(body),
        )
        .await
        .map_err(|e| {
            Error::kube(
                format!(
                    "writing status of BundleDeployment {}/{name}",
                    ctx.config.cluster_namespace
                ),
                e,
            )
        })?;
    publish_events(ctx, bd, prev, &new, outcome).await;
    Ok(())
}

async fn publish_events(
    ctx: &Context,
    bd: &BundleDeployment,
    prev: Option<&BundleDeploymentStatus>,
    new: &BundleDeploymentStatus,
    outcome: &Outcome,
) {
    let mut events = Vec::new();
    if new.applied_deployment_id != prev.and_then(|p| p.applied_deployment_id.clone()) {
        events.push((
            EventType::Normal,
            "Deployed",
            format!("deployment {} applied downstream", outcome.deployment_id),
        ));
    }
    if !outcome.corrected.is_empty() {
        let what: Vec<String> = outcome.corrected.iter().map(describe).collect();
        events.push((
            EventType::Normal,
            "DriftCorrected",
            format!("restored after downstream drift: {}", what.join(", ")),
        ));
    }
    let conflicts = |s: &BundleDeploymentStatus| {
        s.resources
            .iter()
            .filter(|r| r.state == ObjectState::Conflict)
            .count()
    };
    if conflicts(new) > prev.map_or(0, conflicts) {
        let what: Vec<String> = new
            .resources
            .iter()
            .filter(|r| r.state == ObjectState::Conflict)
            .map(|r| describe(&status::object_ref(r)))
            .collect();
        events.push((
            EventType::Warning,
            "Conflict",
            format!("left untouched, owned by someone else: {}", what.join(", ")),
        ));
    }
    let reference = bd.object_ref(&());
    for (type_, reason, note) in events {
        let event = KubeEvent {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Deploy".into(),
            secondary: None,
        };
        if let Err(error) = ctx.recorder.publish(&event, &reference).await {
            tracing::debug!(%error, "cannot publish event on the hub");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_copy_keys_are_removed() {
        let d = Desired {
            key: plan::key("v1", "Secret", Some("a"), "s"),
            body: json!({"data": {"k": "dg=="}}),
            hash: "h".into(),
            copy: true,
        };
        assert_eq!(extra_data_patch(&d, &json!({"data": {"k": "dg=="}})), None);
        assert_eq!(
            extra_data_patch(
                &d,
                &json!({"data": {"k": "dg==", "x": "eA=="}, "binaryData": {"b": "AA=="}})
            ),
            Some(json!({"data": {"x": null}, "binaryData": {"b": null}}))
        );
    }

    #[test]
    fn secret_errors_never_quote_the_server_message() {
        let e = kube::Error::Api(
            kube::core::Status {
                message: "data[k]: Invalid value: \"hunter2\"".into(),
                reason: "Invalid".into(),
                code: 422,
                ..Default::default()
            }
            .boxed(),
        );
        assert_eq!(error_text(&e, true), "Invalid (422)");
        assert!(error_text(&e, false).contains("hunter2"));
    }
}
