//! The hub in-process for tests: a [`Ctx`] over the fake apiserver
//! ([`tender_runtime::fake`]), caches refreshed from it as the watches would, and a virtual
//! clock that moves with tokio's paused clock (decision 0116-hub-clock-and-fake-apiserver).
//!
//! A test seeds objects ([`TestHub::cluster`], [`TestHub::bundle`], [`TestHub::secret`]),
//! runs a reconciler's entry point ([`TestHub::reconcile_bundle`],
//! [`TestHub::reconcile_cluster`]), which refreshes the caches afterwards, and asserts on the
//! writes the fake recorded ([`TestHub::take_writes`]). Time passes with
//! `tokio::time::advance` under `#[tokio::test(start_paused = true)]`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use base64::Engine;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{ApiResource, PartialObjectMeta};
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tender_runtime::executor::ObjectKey;
use tender_runtime::fake::{FakeApiserver, Recorded};
use tender_runtime::{Executor, Metrics};
use tender_types::{Bundle, BundleDeployment, Cluster, ClusterGroup, HelmOp, labels, names};

use crate::clock::Clock;
use crate::context::{Ctx, Stores};
use crate::sources::SourceIndex;
use crate::{HubConfig, HubMetrics};

/// The workspace every test object lives in.
pub(crate) const WS: &str = "ws";

/// The wall time a test starts at.
pub(crate) const START: &str = "2026-12-01T00:00:00Z";

/// What the watches of one scope would write into its caches.
struct Writers {
    bundles: Writer<Bundle>,
    clusters: Writer<Cluster>,
    groups: Writer<ClusterGroup>,
    helmops: Writer<HelmOp>,
    bundle_deployments: Writer<BundleDeployment>,
    copy_secrets: Writer<PartialObjectMeta<Secret>>,
    copy_config_maps: Writer<PartialObjectMeta<ConfigMap>>,
    source_secrets: Writer<PartialObjectMeta<Secret>>,
    source_config_maps: Writer<PartialObjectMeta<ConfigMap>>,
    namespaces: Writer<PartialObjectMeta<Namespace>>,
    leases: Writer<Lease>,
    rollout_states: Writer<Secret>,
}

/// One scope of the hub (every namespace, unsharded) over a fake apiserver.
pub(crate) struct TestHub {
    pub fake: FakeApiserver,
    pub ctx: Arc<Ctx>,
    writers: Mutex<Writers>,
    /// While set, [`TestHub::sync`] leaves the rollout state cache as it is: its watch is late.
    rollout_cache_lags: std::sync::atomic::AtomicBool,
    /// The poll controller's context: its own executor and field manager (decision
    /// 0113-chart-polling-controller).
    poll: Arc<crate::poll::PollCtx>,
    /// The reverse-sync controller's context (decision 0114-reverse-sync-controller).
    upstream: Arc<crate::upstream::UpstreamCtx>,
    /// What reverse sync sent to wake the Bundle controller (its status lines changed).
    lines_changed: Mutex<futures::channel::mpsc::UnboundedReceiver<ObjectRef<Bundle>>>,
}

/// The configuration tests run with: copying on, everything else as shipped.
pub(crate) fn test_config() -> HubConfig {
    HubConfig {
        copy_resources_downstream: true,
        ..HubConfig::default()
    }
}

impl TestHub {
    /// A hub with [`test_config`]; call inside a tokio runtime (its clock starts there).
    pub(crate) fn new() -> Self {
        Self::with_config(test_config())
    }

    /// A hub with `config`.
    pub(crate) fn with_config(config: HubConfig) -> Self {
        let fake = FakeApiserver::new();
        let clock = Clock::starting_at(START.parse().expect("start time"));
        let fake_clock = clock.clone();
        fake.set_clock(move || fake_clock.now());
        let client = fake.client();
        let mut metrics = Metrics::new();
        let hub = HubMetrics::register(&mut metrics);
        let metrics = Arc::new(metrics);
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: labels::HUB_FIELD_MANAGER.to_string(),
                instance: Some("test".into()),
            },
        );
        let exec = Executor::new(
            client.clone(),
            labels::HUB_FIELD_MANAGER,
            recorder,
            metrics.clone(),
        );
        let (bundles, bundles_w) = reflector::store();
        let (clusters, clusters_w) = reflector::store();
        let (groups, groups_w) = reflector::store();
        let (helmops, helmops_w) = reflector::store();
        let (bundle_deployments, bds_w) = reflector::store();
        let (copy_secrets, copy_secrets_w) = reflector::store();
        let (copy_config_maps, copy_cms_w) = reflector::store();
        let (source_secrets, source_secrets_w) = reflector::store();
        let (source_config_maps, source_cms_w) = reflector::store();
        let (namespaces, namespaces_w) = reflector::store();
        let (leases, leases_w) = reflector::store();
        let (rollout_states, rollout_states_w) = reflector::store();
        let stores = Stores {
            bundles,
            clusters,
            groups,
            helmops,
            bundle_deployments,
            copy_secrets,
            copy_config_maps,
            source_secrets,
            source_config_maps,
            namespaces,
            leases,
            rollout_states,
            carried: Arc::new(Vec::new()),
        };
        let (push_tx, _push_rx) = futures::channel::mpsc::unbounded();
        let push = crate::push::Push::new(
            client.clone(),
            config.push.clone(),
            config.copy_resources_downstream,
            "test".into(),
            push_tx,
        );
        let ctx = Arc::new(Ctx {
            client,
            config: Arc::new(config),
            metrics,
            hub,
            exec,
            stores,
            sources: SourceIndex::default(),
            source_hashes: Mutex::default(),
            provisioned: Mutex::default(),
            push,
            bd_names: Mutex::default(),
            upstream: Default::default(),
            retries: Default::default(),
            summary_due: Mutex::default(),
            shard_exec: None,
            invalid_shards: Mutex::default(),
            poller: crate::helm_poll::Poller::new(),
            keys: std::sync::RwLock::new(Arc::new(crate::signing::test_keys().0)),
            published_chains: Mutex::default(),
            clock,
            rollout_writes: Default::default(),
        });
        let writers = Writers {
            bundles: bundles_w,
            clusters: clusters_w,
            groups: groups_w,
            helmops: helmops_w,
            bundle_deployments: bds_w,
            copy_secrets: copy_secrets_w,
            copy_config_maps: copy_cms_w,
            source_secrets: source_secrets_w,
            source_config_maps: source_cms_w,
            namespaces: namespaces_w,
            leases: leases_w,
            rollout_states: rollout_states_w,
        };
        let poll = Arc::new(crate::poll::PollCtx {
            exec: Executor::new(
                ctx.client.clone(),
                &crate::poll::field_manager(),
                Recorder::new(
                    ctx.client.clone(),
                    Reporter {
                        controller: labels::HUB_FIELD_MANAGER.to_string(),
                        instance: Some("test".into()),
                    },
                ),
                ctx.metrics.clone(),
            ),
            ctx: ctx.clone(),
        });
        let (lines_tx, lines_rx) = futures::channel::mpsc::unbounded();
        let upstream = Arc::new(crate::upstream::UpstreamCtx {
            ctx: ctx.clone(),
            lines_changed: lines_tx,
        });
        let hub = Self {
            fake,
            ctx,
            writers: Mutex::new(writers),
            rollout_cache_lags: Default::default(),
            poll,
            upstream,
            lines_changed: Mutex::new(lines_rx),
        };
        hub.sync();
        hub
    }

    /// The hub's wall time now.
    pub(crate) fn now(&self) -> Timestamp {
        self.ctx.clock.now()
    }

    /// Refreshes every cache from the fake, with the selectors and trimming of the real
    /// watches (crate::caches), keeps the BundleDeployment index and tells the executor's memo
    /// that every object's watch event arrived.
    pub(crate) fn sync(&self) {
        let mut w = self.writers.lock().expect("writers");
        let ours = |l: &BTreeMap<String, String>| {
            l.contains_key(labels::WORKSPACE) && !l.contains_key(labels::SHARD)
        };
        let not_copy = |l: &BTreeMap<String, String>| !l.contains_key(labels::BUNDLE_NAME);
        let agent_lease = |m: &kube::api::ObjectMeta| m.name.as_deref() == Some(names::AGENT_LEASE);
        fill(&self.fake, &mut w.bundles, |_| true, |_| {});
        fill(&self.fake, &mut w.clusters, |_| true, |_| {});
        fill(&self.fake, &mut w.groups, |_| true, |_| {});
        fill(&self.fake, &mut w.helmops, |_| true, |_| {});
        let bds = fill(
            &self.fake,
            &mut w.bundle_deployments,
            |m| labelled(m, ours),
            crate::slim::deployment,
        );
        let copy = |o: &mut PartialObjectMeta<Secret>| crate::slim::copy(&mut o.metadata);
        let copies = fill(&self.fake, &mut w.copy_secrets, |m| labelled(m, ours), copy);
        let copy = |o: &mut PartialObjectMeta<ConfigMap>| crate::slim::copy(&mut o.metadata);
        let cms = fill(
            &self.fake,
            &mut w.copy_config_maps,
            |m| labelled(m, ours),
            copy,
        );
        fill(
            &self.fake,
            &mut w.source_secrets,
            |m| labelled(m, not_copy),
            |_| {},
        );
        fill(
            &self.fake,
            &mut w.source_config_maps,
            |m| labelled(m, not_copy),
            |_| {},
        );
        fill(&self.fake, &mut w.namespaces, |m| labelled(m, ours), |_| {});
        fill(&self.fake, &mut w.leases, agent_lease, |_| {});
        if !self
            .rollout_cache_lags
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            self.sync_rollout_states(&mut w.rollout_states);
        }

        let mut index = self.ctx.bd_names.lock().expect("bd index");
        index.clear();
        for bd in &bds {
            let meta = bd.meta();
            index
                .entry(meta.namespace.clone().unwrap_or_default())
                .or_default()
                .insert(meta.name.clone().unwrap_or_default());
        }
        let memo = self.ctx.exec.memo();
        let keys = bds
            .iter()
            .map(|o| key_of::<BundleDeployment>(o.meta()))
            .chain(copies.iter().map(|o| key_of::<Secret>(&o.metadata)))
            .chain(cms.iter().map(|o| key_of::<ConfigMap>(&o.metadata)))
            .chain(
                self.fake
                    .all::<Bundle>()
                    .iter()
                    .map(|o| key_of::<Bundle>(o.meta())),
            )
            .chain(
                self.fake
                    .all::<Cluster>()
                    .iter()
                    .map(|o| key_of::<Cluster>(o.meta())),
            )
            .collect::<Vec<_>>();
        let poll_memo = self.poll.exec.memo();
        for key in keys {
            memo.forget(&key);
            poll_memo.forget(&key);
        }
    }

    /// The rollout state cache as its watch fills it (the hub's own namespace, its labels),
    /// each event also handed to the memo of the hub's own writes, as the feed does.
    fn sync_rollout_states(&self, writer: &mut Writer<Secret>) {
        let own_ns = self.ctx.config.own_namespace();
        let selected = |m: &kube::api::ObjectMeta| {
            m.namespace.as_deref() == Some(own_ns)
                && labelled(m, |l| {
                    l.get(labels::MANAGED_BY).map(String::as_str) == Some(labels::MANAGED_BY_VALUE)
                        && l.contains_key(labels::BUNDLE_NAME)
                        && l.contains_key(labels::BUNDLE_NAMESPACE)
                })
        };
        let objects: Vec<Secret> = self
            .fake
            .all::<Secret>()
            .into_iter()
            .filter(|o| selected(&o.metadata))
            .map(|mut o| {
                o.metadata.managed_fields = None;
                o
            })
            .collect();
        let events = std::iter::once(watcher::Event::Init)
            .chain(objects.into_iter().map(watcher::Event::InitApply))
            .chain(std::iter::once(watcher::Event::InitDone));
        for event in events {
            writer.apply_watcher_event(&event);
            self.ctx.rollout_writes.seen(&event);
        }
    }

    /// From now on the rollout state cache lags: [`TestHub::sync`] no longer refreshes it
    /// (`false` lets it catch up at the next sync).
    pub(crate) fn lag_rollout_cache(&self, lags: bool) {
        self.rollout_cache_lags
            .store(lags, std::sync::atomic::Ordering::SeqCst);
    }

    // --- seeding ---

    /// A Cluster `name` in [`WS`] with `labels`, registered: its namespace created by the hub
    /// (its uid recorded on the Cluster) and its cleanup finalizer in place.
    pub(crate) fn cluster(&self, name: &str, cluster_labels: &[(&str, &str)]) -> Cluster {
        let cns = names::cluster_namespace(WS, name);
        let namespace = self.fake.insert(
            &ApiResource::erase::<Namespace>(&()),
            json!({"metadata": {"name": cns, "labels": {
                labels::MANAGED_BY: labels::MANAGED_BY_VALUE,
                labels::WORKSPACE: WS,
                labels::CLUSTER: labels::safe_label_value(name),
            }}}),
        );
        let uid = namespace["metadata"]["uid"].clone();
        let cluster = self.put::<Cluster>(json!({
            "metadata": {
                "name": name,
                "namespace": WS,
                "labels": map(cluster_labels),
                "annotations": {labels::NAMESPACE_UID: uid},
                "finalizers": [labels::CLUSTER_CLEANUP_FINALIZER],
            },
            "spec": {},
        }));
        self.sync();
        cluster
    }

    /// A Bundle in [`WS`] (`spec` as JSON) with its cleanup finalizer in place.
    pub(crate) fn bundle(&self, name: &str, spec: Value) -> Bundle {
        let bundle = self.put::<Bundle>(json!({
            "metadata": {
                "name": name,
                "namespace": WS,
                "finalizers": [labels::bundle_cleanup_finalizer(None)],
            },
            "spec": spec,
        }));
        self.sync();
        bundle
    }

    /// A source Secret in [`WS`] (values given as text), replacing any of that name.
    pub(crate) fn secret(&self, name: &str, data: &[(&str, &str)]) {
        let b64 = base64::engine::general_purpose::STANDARD;
        let data: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| (k.to_string(), b64.encode(v).into()))
            .collect();
        let resource = ApiResource::erase::<Secret>(&());
        let value = json!({"metadata": {"name": name, "namespace": WS}, "data": data});
        if !self.fake.edit(&resource, Some(WS), name, |s| {
            s["data"] = value["data"].clone()
        }) {
            self.fake.insert(&resource, value);
        }
        self.sync();
    }

    /// A HelmOp in [`WS`] (`spec` as JSON) with its cleanup finalizer in place.
    pub(crate) fn helmop(&self, name: &str, spec: Value) -> HelmOp {
        let helmop = self.put::<HelmOp>(json!({
            "metadata": {
                "name": name,
                "namespace": WS,
                "finalizers": [labels::HELMOP_CLEANUP_FINALIZER],
            },
            "spec": spec,
        }));
        self.sync();
        helmop
    }

    /// A ClusterGroup in [`WS`] selecting Clusters by `selector` (a label selector as JSON).
    pub(crate) fn group(&self, name: &str, selector: Value) -> ClusterGroup {
        let group = self.put::<ClusterGroup>(json!({
            "metadata": {"name": name, "namespace": WS},
            "spec": {"selector": selector},
        }));
        self.sync();
        group
    }

    /// Changes a stored object as someone else would (a user, the agent), then syncs.
    pub(crate) fn edit<K: Resource<DynamicType = ()>>(
        &self,
        namespace: Option<&str>,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) {
        let resource = ApiResource::erase::<K>(&());
        assert!(
            self.fake.edit(&resource, namespace, name, change),
            "no {} {namespace:?}/{name} to edit",
            resource.kind
        );
        self.sync();
    }

    /// Stores `object` as it is (no sync).
    pub(crate) fn put<K: Resource<DynamicType = ()> + DeserializeOwned>(&self, object: Value) -> K {
        let stored = self.fake.insert(&ApiResource::erase::<K>(&()), object);
        serde_json::from_value(stored).expect("a stored object of its type")
    }

    /// The agent's report on `cluster`'s BundleDeployment of `bundle`: applied what the hub
    /// expects now (its deploymentID and copies), and `Ready` (or failing to apply).
    pub(crate) fn report(&self, cluster: &str, bundle: &str, ready: bool) {
        let cns = names::cluster_namespace(WS, cluster);
        let bd_name = names::bundle_deployment_name(bundle);
        let cached = self
            .ctx
            .stores
            .bundle_deployments
            .get(&ObjectRef::new(&bd_name).within(&cns))
            .expect("a BundleDeployment to report on");
        let applied = self.ctx.expected_deployment_id(&cached);
        let at = self.now().to_string();
        let conditions = if ready {
            json!([{"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": at}])
        } else {
            json!([
                {"type": "Deployed", "status": "False", "reason": "ApplyFailed", "message": "", "lastTransitionTime": at},
                {"type": "Ready", "status": "False", "reason": "ApplyFailed", "message": "", "lastTransitionTime": at},
            ])
        };
        self.edit::<BundleDeployment>(Some(&cns), &bd_name, |bd| {
            bd["status"] = json!({
                "appliedDeploymentID": applied,
                "appliedCopiesID": applied,
                "conditions": conditions,
            });
        });
    }

    // --- running ---

    /// Runs the Bundle controller's reconcile of `name` on the cached Bundle, as the
    /// controller would, then refreshes the caches.
    pub(crate) async fn reconcile_bundle(&self, name: &str) -> Action {
        let bundle = cached(&self.ctx.stores.bundles, name);
        self.settle(crate::bundle::reconcile(bundle, self.ctx.clone()).await)
    }

    /// Runs the Cluster controller's reconcile of `name` on the cached Cluster, then refreshes
    /// the caches.
    pub(crate) async fn reconcile_cluster(&self, name: &str) -> Action {
        let cluster = cached(&self.ctx.stores.clusters, name);
        self.settle(crate::cluster::reconcile(cluster, self.ctx.clone()).await)
    }

    /// Runs the poll controller's reconcile of Bundle `name` (a look at its chart repository
    /// when one is due, the outcome recorded in status), then refreshes the caches.
    pub(crate) async fn reconcile_poll(&self, name: &str) -> Action {
        let bundle = cached(&self.ctx.stores.bundles, name);
        self.settle(crate::poll::reconcile(bundle, self.poll.clone()).await)
    }

    /// Runs the reverse-sync controller's reconcile of Bundle `name`, then refreshes the
    /// caches.
    pub(crate) async fn reconcile_upstream(&self, name: &str) -> Action {
        let bundle = cached(&self.ctx.stores.bundles, name);
        self.settle(crate::upstream::reconcile(bundle, self.upstream.clone()).await)
    }

    /// Runs the HelmOp controller's reconcile of `name`, then refreshes the caches.
    pub(crate) async fn reconcile_helmop(&self, name: &str) -> Action {
        let helmop = cached(&self.ctx.stores.helmops, name);
        self.settle(crate::helmop::reconcile(helmop, self.ctx.clone()).await)
    }

    /// Runs the ClusterGroup controller's reconcile of `name`, then refreshes the caches.
    pub(crate) async fn reconcile_group(&self, name: &str) -> Action {
        let group = cached(&self.ctx.stores.groups, name);
        self.settle(crate::group::reconcile(group, self.ctx.clone()).await)
    }

    /// A reconcile's outcome, which must be a success, after the caches were refreshed.
    fn settle(&self, outcome: Result<Action, crate::Error>) -> Action {
        let action = outcome.unwrap_or_else(|e| panic!("the reconcile failed: {e:?}"));
        self.sync();
        action
    }

    /// The Bundles reverse sync woke the Bundle controller for since the last call (their
    /// status lines changed), by name.
    pub(crate) fn take_lines_changed(&self) -> Vec<String> {
        let mut rx = self.lines_changed.lock().expect("lines receiver");
        let mut woken = Vec::new();
        while let Ok(r) = rx.try_recv() {
            woken.push(r.name);
        }
        woken
    }

    // --- reading ---

    /// The writes recorded since the last call, events left out, as `verb resource ns/name`
    /// lines (see [`describe`]).
    pub(crate) fn take_writes(&self) -> Vec<String> {
        self.fake
            .take_writes()
            .iter()
            .filter(|r| !r.path.ends_with("/events") && !r.path.contains("/events/"))
            .map(describe)
            .collect()
    }

    /// A stored object.
    pub(crate) fn get<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<K> {
        self.fake.get_as::<K>(namespace, name)
    }
}

/// `verb resource[/subresource] namespace/name` of a recorded write, e.g.
/// `apply bundledeployments ws-one/app`, `status bundles ws/app`, `delete secrets ws-one/x`.
pub(crate) fn describe(r: &Recorded) -> String {
    let segments: Vec<&str> = r.path.trim_matches('/').split('/').collect();
    let rest = match segments.first() {
        Some(&"api") => &segments[2..],
        _ => &segments[3.min(segments.len())..],
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(*ns), tail),
        other => (None, other),
    };
    let verb = match (r.method.as_str(), rest.get(2)) {
        ("PATCH", Some(&"status")) => "status",
        ("PATCH", _) if r.is_apply() => "apply",
        ("PATCH", _) => "patch",
        ("POST", _) => "create",
        ("PUT", _) => "replace",
        ("DELETE", _) => "delete",
        (other, _) => other,
    };
    let resource = rest.first().copied().unwrap_or_default();
    // A create names its object in the body.
    let name = rest
        .get(1)
        .copied()
        .or_else(|| r.body["metadata"]["name"].as_str())
        .unwrap_or_default();
    match ns {
        Some(ns) => format!("{verb} {resource} {ns}/{name}"),
        None => format!("{verb} {resource} {name}"),
    }
}

/// The cached object `name` in [`WS`] (a reconcile's trigger).
fn cached<K>(store: &kube::runtime::reflector::Store<K>, name: &str) -> Arc<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .get(&ObjectRef::new(name).within(WS))
        .unwrap_or_else(|| panic!("a cached {} {name}", K::kind(&())))
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn labelled(
    meta: &kube::api::ObjectMeta,
    test: impl Fn(&BTreeMap<String, String>) -> bool,
) -> bool {
    test(meta.labels.as_ref().unwrap_or(&BTreeMap::new()))
}

fn key_of<K: Resource<DynamicType = ()>>(meta: &kube::api::ObjectMeta) -> ObjectKey {
    ObjectKey::of::<K>(
        meta.namespace.as_deref(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// Replaces `writer`'s contents with the fake's objects of `K` that `select` keeps, trimmed
/// by `trim` as the watch stream trims them; returns what it stored.
fn fill<K>(
    fake: &FakeApiserver,
    writer: &mut Writer<K>,
    select: impl Fn(&kube::api::ObjectMeta) -> bool,
    trim: impl Fn(&mut K),
) -> Vec<K>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + 'static,
{
    let objects: Vec<K> = fake
        .all::<K>()
        .into_iter()
        .filter(|o| select(o.meta()))
        .map(|mut o| {
            o.meta_mut().managed_fields = None;
            trim(&mut o);
            o
        })
        .collect();
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in &objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(o.clone()));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    objects
}

#[cfg(test)]
mod bundle_tests;

#[cfg(test)]
mod cluster_tests;

#[cfg(test)]
mod group_tests;

#[cfg(test)]
mod helmop_tests;

#[cfg(test)]
mod metrics_tests;

#[cfg(test)]
mod poll_tests;

#[cfg(test)]
mod upstream_tests;
