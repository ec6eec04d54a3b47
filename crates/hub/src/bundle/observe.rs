//! What a Bundle reconcile reads: the caches, and the few sources whose content it must see.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ObjectMeta};
use kube::runtime::reflector::ObjectRef;
use tender_types::copy::CopyableKind;
use tender_types::{Bundle, BundleDeployment, ClusterGroup, SourceKind, hash, labels, names};

use super::ops::{LiveCopy, SourceObject};
use super::plan::{SourceKey, SourceState};
use crate::context::Ctx;
use crate::{Error, kube_err};

static EMPTY: BTreeMap<String, String> = BTreeMap::new();

/// Whether `meta` was written for Bundle `ns/name` (by its labels).
pub(crate) fn is_bundle(meta: &ObjectMeta, ns: &str, name: &str) -> bool {
    let l = meta.labels.as_ref().unwrap_or(&EMPTY);
    l.get(labels::BUNDLE_NAMESPACE).map(String::as_str) == Some(ns)
        && l.get(labels::BUNDLE_NAME).map(String::as_str) == Some(name)
}

/// The empty label map, for views of objects without labels.
pub(crate) fn no_labels() -> &'static BTreeMap<String, String> {
    &EMPTY
}

/// The ClusterGroups of `ns`, from the cache.
pub(crate) fn groups_in(ctx: &Ctx, ns: &str) -> Vec<Arc<ClusterGroup>> {
    ctx.stores
        .groups
        .state()
        .into_iter()
        .filter(|g| g.namespace().as_deref() == Some(ns))
        .collect()
}

/// The BundleDeployments written for `bundle`, from the cache.
pub(crate) fn deployments_of(ctx: &Ctx, bundle: &Bundle) -> Vec<Arc<BundleDeployment>> {
    let (ns, name) = (bundle.namespace().unwrap_or_default(), bundle.name_any());
    // Looked up where the hub puts them (the namespaces it created for the workspace's
    // Clusters, under the Bundle's name), not found by labels: an agent may patch its
    // BundleDeployments' labels, and must not make another Bundle count or delete one
    // (decision 0073-hub-writes-where-it-derives). A relabelled one is missing here and is written
    // back.
    let bd_name = names::bundle_deployment_name(&name);
    ctx.clusters_in(&ns)
        .iter()
        .filter_map(|c| ctx.owned_namespace(c))
        .filter_map(|cns| {
            ctx.stores
                .bundle_deployments
                .get(&ObjectRef::new(&bd_name).within(&cns))
        })
        .filter(|bd| is_bundle(&bd.metadata, &ns, &name))
        .collect()
}

/// The cached BundleDeployment `namespace/name` as it is now (a reconcile's snapshot may
/// predate our own last write, whose watch event has since cleared its memo entry).
pub(crate) fn live_deployment(
    ctx: &Ctx,
    namespace: &str,
    name: &str,
) -> Option<Arc<BundleDeployment>> {
    ctx.stores
        .bundle_deployments
        .get(&ObjectRef::new(name).within(namespace))
}

/// The cached metadata of one copy.
pub(crate) fn live_copy(
    ctx: &Ctx,
    kind: SourceKind,
    namespace: &str,
    name: &str,
) -> Option<ObjectMeta> {
    match kind {
        SourceKind::Secret => ctx
            .stores
            .copy_secrets
            .get(&ObjectRef::new(name).within(namespace))
            .map(|m| m.metadata.clone()),
        SourceKind::ConfigMap => ctx
            .stores
            .copy_config_maps
            .get(&ObjectRef::new(name).within(namespace))
            .map(|m| m.metadata.clone()),
    }
}

/// This Bundle's copies (not being deleted) by cluster namespace, from the metadata caches:
/// one pass per Bundle reconcile instead of one per cluster.
pub(crate) fn bundle_copies(
    ctx: &Ctx,
    bundle_ns: &str,
    bundle_name: &str,
) -> HashMap<String, Vec<LiveCopy>> {
    let mut out: HashMap<String, Vec<LiveCopy>> = HashMap::new();
    let secrets = ctx.stores.copy_secrets.state();
    let config_maps = ctx.stores.copy_config_maps.state();
    let metas = secrets
        .iter()
        .map(|m| (SourceKind::Secret, &m.metadata))
        .chain(
            config_maps
                .iter()
                .map(|m| (SourceKind::ConfigMap, &m.metadata)),
        );
    for (kind, meta) in metas {
        if meta.deletion_timestamp.is_some() || !is_bundle(meta, bundle_ns, bundle_name) {
            continue;
        }
        if let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) {
            out.entry(ns.clone()).or_default().push(LiveCopy {
                kind,
                name: name.clone(),
                uid: meta.uid.clone(),
            });
        }
    }
    out
}

/// The namespace a source of `kind` is read from: the Bundle's, or none for a cluster-scoped
/// kind (`""`, as in the source index).
pub(crate) fn source_namespace(ctx: &Ctx, bundle_ns: &str, kind: &CopyableKind) -> String {
    match ctx.stores.carried(kind) {
        Some(c) if !c.namespaced => String::new(),
        _ => bundle_ns.to_string(),
    }
}

/// State of one source: existence from the metadata cache, hash from a cache keyed by
/// resourceVersion, and a GET only when the source changed since it was last hashed (the
/// object read then is kept in `fetched` for the copies).
pub(crate) async fn source_state(
    ctx: &Ctx,
    ns: &str,
    key: &SourceKey,
    fetched: &mut HashMap<SourceKey, SourceObject>,
) -> Result<SourceState, Error> {
    let (kind, name) = key;
    let ns = source_namespace(ctx, ns, kind);
    let ns = ns.as_str();
    if kind.source_kind() == Some(SourceKind::Secret) && named_by_cluster(ctx, ns, name) {
        return Ok(SourceState::Refused);
    }
    let rv = match kind.source_kind() {
        Some(SourceKind::Secret) => ctx
            .stores
            .source_secrets
            .get(&ObjectRef::new(name).within(ns))
            .map(|m| m.resource_version()),
        Some(SourceKind::ConfigMap) => ctx
            .stores
            .source_config_maps
            .get(&ObjectRef::new(name).within(ns))
            .map(|m| m.resource_version()),
        None => ctx.stores.carried(kind).and_then(|c| {
            let r = ObjectRef::new_with(name, c.resource.clone());
            let r = if c.namespaced { r.within(ns) } else { r };
            c.store.get(&r).map(|m| m.resource_version())
        }),
    };
    let Some(rv) = rv else {
        return Ok(SourceState::Missing);
    };
    let id = (ns.to_string(), kind.clone(), name.clone());
    if let Some((seen_rv, hash, bytes)) = ctx.source_hashes.lock().expect("lock").get(&id)
        && Some(seen_rv) == rv.as_ref()
    {
        return Ok(SourceState::Found {
            hash: hash.clone(),
            bytes: *bytes,
        });
    }
    let Some((object, hash, rv)) = fetch_source(ctx, ns, kind, name).await? else {
        return Ok(SourceState::Missing);
    };
    if let SourceObject::Secret(s) = &object
        && s.type_.as_deref() == Some(SERVICE_ACCOUNT_TOKEN)
    {
        // Not remembered: a refused source is read again, it is never copied.
        return Ok(SourceState::Refused);
    }
    let bytes = content_bytes(&object);
    ctx.source_hashes
        .lock()
        .expect("lock")
        .insert(id, (rv, hash.clone(), bytes));
    fetched.insert(key.clone(), object);
    Ok(SourceState::Found { hash, bytes })
}

/// Bytes of content a copy of `object` holds: keys and values of a Secret's or ConfigMap's
/// data, the serialised object of any other kind (its carrier's content).
fn content_bytes(object: &SourceObject) -> usize {
    fn entries<V>(
        map: Option<&std::collections::BTreeMap<String, V>>,
        len: fn(&V) -> usize,
    ) -> usize {
        map.into_iter()
            .flatten()
            .map(|(k, v)| k.len() + len(v))
            .sum()
    }
    match object {
        SourceObject::Secret(s) => {
            entries(s.data.as_ref(), |v| v.0.len()) + entries(s.string_data.as_ref(), String::len)
        }
        SourceObject::ConfigMap(c) => {
            entries(c.data.as_ref(), String::len) + entries(c.binary_data.as_ref(), |v| v.0.len())
        }
        SourceObject::Carried(v) => v.to_string().len(),
    }
}

/// The type of the Secrets the token controller fills with a ServiceAccount's token.
const SERVICE_ACCOUNT_TOKEN: &str = "kubernetes.io/service-account-token";

/// Whether a Cluster of workspace `ns` names Secret `name` (its push kubeconfig): a Bundle
/// of the same workspace never copies it anywhere (decision 0075-credentials-never-copied).
fn named_by_cluster(ctx: &Ctx, ns: &str, name: &str) -> bool {
    ctx.stores
        .clusters
        .find(|c| {
            c.namespace().as_deref() == Some(ns)
                && c.spec
                    .kubeconfig_secret_ref
                    .as_ref()
                    .is_some_and(|r| r.name == name)
        })
        .is_some()
}

/// Reads one source in full, with its content hash and resourceVersion (`ns` is already the
/// source's namespace, empty for a cluster-scoped kind).
pub(crate) async fn fetch_source(
    ctx: &Ctx,
    ns: &str,
    kind: &CopyableKind,
    name: &str,
) -> Result<Option<(SourceObject, String, String)>, Error> {
    let action = format!("read {kind} {ns}/{name}");
    Ok(match kind.source_kind() {
        Some(SourceKind::Secret) => Api::<Secret>::namespaced(ctx.client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(action, true, e))?
            .map(|s| {
                let h = hash::secret_hash(&s);
                let rv = s.resource_version().unwrap_or_default();
                (SourceObject::Secret(s), h, rv)
            }),
        Some(SourceKind::ConfigMap) => Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(kube_err(action))?
            .map(|c| {
                let h = hash::config_map_hash(&c);
                let rv = c.resource_version().unwrap_or_default();
                (SourceObject::ConfigMap(c), h, rv)
            }),
        None => {
            let Some(c) = ctx.stores.carried(kind) else {
                return Ok(None);
            };
            let api: Api<DynamicObject> = if c.namespaced {
                Api::namespaced_with(ctx.client.clone(), ns, &c.resource)
            } else {
                Api::all_with(ctx.client.clone(), &c.resource)
            };
            // Any kind may hold credentials: errors are redacted like a Secret's.
            api.get_opt(name)
                .await
                .map_err(|e| Error::kube(action, true, e))?
                .map(|o| {
                    let rv = o.resource_version().unwrap_or_default();
                    let value = serde_json::to_value(&o).unwrap_or_default();
                    let h = hash::carried_hash(&value);
                    (SourceObject::Carried(value), h, rv)
                })
        }
    })
}

/// A source for a copy: the one read this reconcile, else read now and kept for the rest of
/// the reconcile, so a Bundle whose source another Bundle already hashed reads it once, not
/// once per cluster (`None`: gone since planning; its deletion event re-plans the Bundle).
pub(crate) async fn source_for_copy(
    ctx: &Ctx,
    ns: &str,
    key: &SourceKey,
    fetched: &Mutex<HashMap<SourceKey, SourceObject>>,
) -> Result<Option<SourceObject>, Error> {
    if let Some(s) = fetched.lock().expect("lock").get(key) {
        return Ok(Some(s.clone()));
    }
    let ns = source_namespace(ctx, ns, &key.0);
    let source = fetch_source(ctx, &ns, &key.0, &key.1)
        .await?
        .map(|(s, _, _)| s);
    if let Some(s) = &source {
        fetched
            .lock()
            .expect("lock")
            .entry(key.clone())
            .or_insert_with(|| s.clone());
    }
    Ok(source)
}
