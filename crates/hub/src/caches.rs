//! The caches of one scope: one reflector per kind, shared by every reconciler and trigger.
//!
//! Every cache is a reflector we own; its events reach triggers (and the controllers' own
//! trigger streams) only after the cache has applied them, so a reconciler never reads a
//! cache older than its trigger. Deletions are seen too (shared subscriber streams drop them,
//! which is why we do not use them).

use std::fmt::Debug;
use std::hash::Hash;

use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::Client;
use kube::Resource;
use kube::api::{Api, DynamicObject, GroupVersionKind, PartialObjectMeta};
use kube::discovery::ApiResource;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tender_types::copy::CopyableKind;
use tender_types::{Bundle, BundleDeployment, Cluster, ClusterGroup, HelmOp, labels, names};

use crate::Error;
use crate::context::{CarriedKind, Scope, Stores};

/// A cache's events, after the cache applied them.
pub(crate) type Events<K> = BoxStream<'static, watcher::Event<K>>;

/// The event streams of one scope's caches, one per kind, consumed by `triggers`.
pub(crate) struct CacheEvents {
    pub bundles: Events<Bundle>,
    pub clusters: Events<Cluster>,
    pub groups: Events<ClusterGroup>,
    pub helmops: Events<HelmOp>,
    pub bundle_deployments: Events<BundleDeployment>,
    pub copy_secrets: Events<PartialObjectMeta<Secret>>,
    pub copy_config_maps: Events<PartialObjectMeta<ConfigMap>>,
    pub source_secrets: Events<PartialObjectMeta<Secret>>,
    pub source_config_maps: Events<PartialObjectMeta<ConfigMap>>,
    pub namespaces: Events<PartialObjectMeta<Namespace>>,
    pub leases: Events<Lease>,
    pub rollout_states: Events<Secret>,
    /// Sources of the other allowed kinds, one stream per kind.
    pub carried: Vec<(CopyableKind, Events<PartialObjectMeta<DynamicObject>>)>,
}

/// An allowed kind other than Secret/ConfigMap as discovery found it on the hub.
#[derive(Clone, Debug)]
pub(crate) struct DiscoveredKind {
    pub kind: CopyableKind,
    pub resource: ApiResource,
    pub namespaced: bool,
}

/// Finds the allowed kinds other than Secret/ConfigMap on the hub. A kind the hub does not
/// serve is logged and left out: its sources are then reported missing (`SourceNotFound`).
pub(crate) async fn discover(client: &Client, kinds: &[CopyableKind]) -> Vec<DiscoveredKind> {
    let mut out = Vec::new();
    for kind in kinds.iter().filter(|k| !k.is_secret_or_config_map()) {
        let (group, version) = match kind.api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", kind.api_version.as_str()),
        };
        let gvk = GroupVersionKind::gvk(group, version, &kind.kind);
        match kube::discovery::pinned_kind(client, &gvk).await {
            Ok((resource, caps)) => out.push(DiscoveredKind {
                kind: kind.clone(),
                resource,
                namespaced: caps.scope == kube::discovery::Scope::Namespaced,
            }),
            Err(error) => {
                tracing::warn!(%kind, %error, "copyable kind is not served by the hub; its sources count as missing (restart the hub after installing it)");
            }
        }
    }
    out
}

fn reflect_dynamic(
    what: String,
    api: Api<PartialObjectMeta<DynamicObject>>,
    config: watcher::Config,
    resource: &ApiResource,
) -> (
    Store<PartialObjectMeta<DynamicObject>>,
    Events<PartialObjectMeta<DynamicObject>>,
) {
    let writer = reflector::store::Writer::new(resource.clone());
    let reader = writer.as_reader();
    let stream = tender_runtime::watch::watcher(api, config)
        .default_backoff()
        .modify(without_managed_fields);
    let events = reflector::reflector(writer, stream)
    .filter_map(move |event| {
        let what = what.clone();
        async move {
            match event {
                Ok(event) => Some(event),
                Err(error) => {
                    tracing::warn!(%error, watch = %what, "watch failed; retrying with backoff");
                    None
                }
            }
        }
    })
    .boxed();
    (reader, events)
}

/// Drops `managedFields`: no cache but the copies' reads them
/// (decision 0054-caches-drop-managed-fields).
fn without_managed_fields<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// Keeps only what the hub reads of a copy's metadata (decision 0060-slim-caches).
fn copy_fields<K: Resource>(obj: &mut K) {
    crate::slim::copy(obj.meta_mut());
}

fn reflect<K>(what: &'static str, api: Api<K>, config: watcher::Config) -> (Store<K>, Events<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    reflect_trimmed(what, api, config, without_managed_fields)
}

fn reflect_trimmed<K>(
    what: &'static str,
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
) -> (Store<K>, Events<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let stream = tender_runtime::watch::watcher(api, config)
        .default_backoff()
        .modify(trim);
    let events = reflector::reflector(writer, stream)
        .filter_map(move |event| async move {
            match event {
                Ok(event) => Some(event),
                Err(error) => {
                    tracing::warn!(%error, watch = what, "watch failed; retrying with backoff");
                    None
                }
            }
        })
        .boxed();
    (reader, events)
}

/// Starts (lazily: nothing runs until the event streams are polled) the caches of `scope`.
pub(crate) fn caches(
    scope: &Scope,
    shard: Option<&str>,
    own_ns: &str,
    client: &Client,
    discovered: &[DiscoveredKind],
) -> (Stores, CacheEvents) {
    let all = watcher::Config::default();
    // What the hub writes into cluster namespaces carries the workspace label and this
    // replica's shard label (decision 0062-hub-shards). Clusters are cached whole: leaving the
    // shard is a label change here, not a deletion.
    let in_workspaces = watcher::Config::default().labels(&scope.shard_selector(shard));
    // Sources: metadata only, never copies (which carry the bundle-name label).
    let not_copies = watcher::Config::default().labels(&format!("!{}", labels::BUNDLE_NAME));

    let (bundles, bundle_events) = reflect("bundles", scope.api::<Bundle>(client), all.clone());
    let (clusters, cluster_events) = reflect("clusters", scope.api::<Cluster>(client), all.clone());
    let (groups, group_events) = reflect(
        "clustergroups",
        scope.api::<ClusterGroup>(client),
        all.clone(),
    );
    let (helmops, helmop_events) = reflect("helmops", scope.api::<HelmOp>(client), all.clone());
    let (bundle_deployments, bd_events) = reflect_trimmed(
        "bundledeployments",
        Api::<BundleDeployment>::all(client.clone()),
        in_workspaces.clone(),
        crate::slim::deployment,
    );
    let (copy_secrets, copy_secret_events) = reflect_trimmed(
        "copied secrets",
        Api::<PartialObjectMeta<Secret>>::all(client.clone()),
        in_workspaces.clone(),
        copy_fields,
    );
    let (copy_config_maps, copy_cm_events) = reflect_trimmed(
        "copied configmaps",
        Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()),
        in_workspaces.clone(),
        copy_fields,
    );
    let (source_secrets, source_secret_events) = reflect(
        "source secrets",
        scope.api::<PartialObjectMeta<Secret>>(client),
        not_copies.clone(),
    );
    let (source_config_maps, source_cm_events) = reflect(
        "source configmaps",
        scope.api::<PartialObjectMeta<ConfigMap>>(client),
        not_copies,
    );
    let (namespaces, ns_events) = reflect(
        "cluster namespaces",
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        in_workspaces,
    );
    let (leases, lease_events) = reflect(
        "agent leases",
        Api::<Lease>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", names::AGENT_LEASE)),
    );
    // The rollout state of this scope's Bundles, in the hub's own namespace, whole: the
    // Bundle reconcile reads it here instead of a GET (decision 0121).
    let (rollout_states, rollout_state_events) = reflect(
        "rollout states",
        Api::<Secret>::namespaced(client.clone(), own_ns),
        watcher::Config::default().labels(&rollout_state_selector(scope)),
    );
    // Sources of other kinds: metadata only (never their content in memory), in the scope's
    // namespace for namespaced kinds, cluster-wide for cluster-scoped ones.
    let mut carried = Vec::new();
    let mut carried_events = Vec::new();
    for d in discovered {
        let api = match scope {
            Scope::Namespace(ns) if d.namespaced => {
                Api::namespaced_with(client.clone(), ns, &d.resource)
            }
            _ => Api::all_with(client.clone(), &d.resource),
        };
        let (store, events) = reflect_dynamic(
            format!("source {}", d.kind),
            api,
            watcher::Config::default(),
            &d.resource,
        );
        carried.push(CarriedKind {
            kind: d.kind.clone(),
            resource: d.resource.clone(),
            namespaced: d.namespaced,
            store,
        });
        carried_events.push((d.kind.clone(), events));
    }
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
        carried: std::sync::Arc::new(carried),
    };
    let events = CacheEvents {
        bundles: bundle_events,
        clusters: cluster_events,
        groups: group_events,
        helmops: helmop_events,
        bundle_deployments: bd_events,
        copy_secrets: copy_secret_events,
        copy_config_maps: copy_cm_events,
        source_secrets: source_secret_events,
        source_config_maps: source_cm_events,
        namespaces: ns_events,
        leases: lease_events,
        rollout_states: rollout_state_events,
        carried: carried_events,
    };
    (stores, events)
}

/// The labels every rollout state Secret of `scope` carries since it moved to the hub's own
/// namespace ([`crate::bundle`]'s `revisions::write_op`, decision 0112), so no Secret the
/// hub kept there is left out.
pub(crate) fn rollout_state_selector(scope: &Scope) -> String {
    let namespace = match scope {
        Scope::All => labels::BUNDLE_NAMESPACE.to_string(),
        Scope::Namespace(ns) => format!("{}={ns}", labels::BUNDLE_NAMESPACE),
    };
    format!(
        "{}={},{},{namespace}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE,
        labels::BUNDLE_NAME
    )
}

/// Resolves once every cache has its first full list.
pub(crate) async fn synced(s: Stores) -> Result<(), Error> {
    macro_rules! wait {
        ($store:expr, $what:literal) => {
            $store
                .wait_until_ready()
                .await
                .map_err(|_| Error::CacheSync($what))?
        };
    }
    wait!(s.bundles, "bundles");
    wait!(s.clusters, "clusters");
    wait!(s.groups, "clustergroups");
    wait!(s.helmops, "helmops");
    wait!(s.bundle_deployments, "bundledeployments");
    wait!(s.copy_secrets, "copied secrets");
    wait!(s.copy_config_maps, "copied configmaps");
    wait!(s.source_secrets, "source secrets");
    wait!(s.source_config_maps, "source configmaps");
    wait!(s.namespaces, "cluster namespaces");
    wait!(s.leases, "agent leases");
    wait!(s.rollout_states, "rollout states");
    for c in s.carried.iter() {
        c.store
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheSync("sources of a copyable kind"))?;
    }
    Ok(())
}
