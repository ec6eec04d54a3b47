//! Bundle controller: resolve targets, write one BundleDeployment per targeted cluster and the
//! copies it needs, remove what is no longer wanted, and fold it all into the Bundle's status.
//!
//! Deciding is pure ([`plan`], [`status`]); this module reads the caches, calls the plan and
//! writes only the difference.

pub mod plan;
pub mod status;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tender_types::conditions::{TYPE_READY, TYPE_RESOURCES_COPIED, find_condition, reason};
use tender_types::targeting::GroupInfo;
use tender_types::{
    API_GROUP_VERSION, Bundle, BundleDeployment, BundleDeploymentSpec, SourceKind, hash, labels,
    names,
};

use crate::context::Ctx;
use crate::{Error, kube_err};
use plan::{ClusterView, DesiredCopy, SourceKey, SourceState};
use status::{BundleFacts, bundle_status, summarize};

const CONTROLLER: &str = "bundle";
/// BundleDeployments and copies written concurrently per Bundle.
const FANOUT_CONCURRENCY: usize = 16;

static EMPTY: BTreeMap<String, String> = BTreeMap::new();

/// A source read in full for this reconcile (only when a copy must be written).
#[derive(Clone)]
enum SourceObject {
    Secret(Secret),
    ConfigMap(ConfigMap),
}

pub(crate) async fn reconcile(bundle: Arc<Bundle>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    let ns = bundle.namespace().unwrap_or_default();
    let object = format!("Bundle {ns}/{}", bundle.name_any());
    let api: Api<Bundle> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(
        &api,
        labels::BUNDLE_CLEANUP_FINALIZER,
        bundle,
        |event| async {
            match event {
                Finalizer::Apply(b) => apply(&b, &ctx).await,
                Finalizer::Cleanup(b) => cleanup(&b, &ctx).await,
            }
        },
    )
    .await
    .map_err(|source| Error::Finalizer {
        object,
        source: Box::new(source),
    })
}

pub(crate) fn error_policy(bundle: Arc<Bundle>, error: &Error, ctx: Arc<Ctx>) -> Action {
    ctx.metrics.reconcile_error(CONTROLLER, error.reason());
    tracing::warn!(bundle = %bundle.name_any(), namespace = ?bundle.namespace(), %error, "bundle reconcile failed; retrying");
    Action::requeue(Duration::from_secs(3))
}

fn is_bundle(meta: &ObjectMeta, ns: &str, name: &str) -> bool {
    let l = meta.labels.as_ref().unwrap_or(&EMPTY);
    l.get(labels::BUNDLE_NAMESPACE).map(String::as_str) == Some(ns)
        && l.get(labels::BUNDLE_NAME).map(String::as_str) == Some(name)
}

/// Labels of everything the hub writes for Bundle `ns/name` in `cluster`'s namespace.
fn owned_labels(ns: &str, name: &str, cluster: &str, cluster_ns: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into()),
        (labels::BUNDLE_NAMESPACE.into(), ns.into()),
        (labels::BUNDLE_NAME.into(), labels::safe_label_value(name)),
        (labels::CLUSTER.into(), labels::safe_label_value(cluster)),
        (labels::CLUSTER_NAMESPACE.into(), cluster_ns.into()),
        (labels::WORKSPACE.into(), ns.into()),
    ])
}

impl Ctx {
    /// State of one source: existence from the metadata cache, hash from a cache keyed by
    /// resourceVersion, and a GET only when the source changed since it was last hashed.
    async fn source_state(
        &self,
        ns: &str,
        key: &SourceKey,
        fetched: &mut HashMap<SourceKey, SourceObject>,
    ) -> Result<SourceState, Error> {
        let (kind, name) = key;
        let rv = match kind {
            SourceKind::Secret => self
                .stores
                .source_secrets
                .get(&ObjectRef::new(name).within(ns))
                .map(|m| m.resource_version()),
            SourceKind::ConfigMap => self
                .stores
                .source_config_maps
                .get(&ObjectRef::new(name).within(ns))
                .map(|m| m.resource_version()),
        };
        let Some(rv) = rv else {
            return Ok(SourceState::Missing);
        };
        let id = (ns.to_string(), *kind, name.clone());
        if let Some((seen_rv, hash)) = self.source_hashes.lock().expect("lock").get(&id)
            && Some(seen_rv) == rv.as_ref()
        {
            return Ok(SourceState::Found { hash: hash.clone() });
        }
        let Some((object, hash, rv)) = self.fetch_source(ns, *kind, name).await? else {
            return Ok(SourceState::Missing);
        };
        self.source_hashes
            .lock()
            .expect("lock")
            .insert(id, (rv, hash.clone()));
        fetched.insert(key.clone(), object);
        Ok(SourceState::Found { hash })
    }

    async fn fetch_source(
        &self,
        ns: &str,
        kind: SourceKind,
        name: &str,
    ) -> Result<Option<(SourceObject, String, String)>, Error> {
        let action = || format!("read {kind} {ns}/{name}");
        Ok(match kind {
            SourceKind::Secret => Api::<Secret>::namespaced(self.client.clone(), ns)
                .get_opt(name)
                .await
                .map_err(kube_err(action()))?
                .map(|s| {
                    let h = hash::secret_hash(&s);
                    let rv = s.resource_version().unwrap_or_default();
                    (SourceObject::Secret(s), h, rv)
                }),
            SourceKind::ConfigMap => Api::<ConfigMap>::namespaced(self.client.clone(), ns)
                .get_opt(name)
                .await
                .map_err(kube_err(action()))?
                .map(|c| {
                    let h = hash::config_map_hash(&c);
                    let rv = c.resource_version().unwrap_or_default();
                    (SourceObject::ConfigMap(c), h, rv)
                }),
        })
    }
}

/// Counts of what one reconcile wrote, for events and logs.
#[derive(Default)]
struct Written {
    created: usize,
    updated: usize,
    copies: usize,
    deleted: Vec<String>,
}

async fn apply(bundle: &Bundle, ctx: &Ctx) -> Result<Action, Error> {
    let ns = bundle.namespace().unwrap_or_default();
    let name = bundle.name_any();
    let copy_enabled = ctx.config.copy_resources_downstream;

    // Index first, then read: a source change after this point always reaches us again.
    let refs = if copy_enabled {
        plan::referenced_sources(&bundle.spec)
    } else {
        BTreeSet::new()
    };
    ctx.sources.set(
        &(ns.clone(), name.clone()),
        refs.iter()
            .map(|(kind, source)| (ns.clone(), *kind, source.clone()))
            .collect(),
    );
    let mut fetched = HashMap::new();
    let mut sources = BTreeMap::new();
    for key in &refs {
        let state = ctx.source_state(&ns, key, &mut fetched).await?;
        sources.insert(key.clone(), state);
    }

    let clusters = ctx.clusters_in(&ns);
    let views: Vec<ClusterView<'_>> = clusters
        .iter()
        .map(|c| ClusterView {
            name: c.metadata.name.as_deref().unwrap_or_default(),
            labels: c.metadata.labels.as_ref().unwrap_or(&EMPTY),
            namespace: c.status.as_ref().and_then(|s| s.namespace.as_deref()),
            paused: c.spec.paused,
        })
        .collect();
    let groups: Vec<_> = ctx
        .stores
        .groups
        .state()
        .into_iter()
        .filter(|g| g.namespace().as_deref() == Some(ns.as_str()))
        .collect();
    let group_infos: Vec<GroupInfo<'_>> = groups
        .iter()
        .map(|g| GroupInfo {
            name: g.metadata.name.as_deref().unwrap_or_default(),
            labels: g.metadata.labels.as_ref().unwrap_or(&EMPTY),
            selector: &g.spec.selector,
        })
        .collect();

    let existing: Vec<Arc<BundleDeployment>> = ctx
        .stores
        .bundle_deployments
        .state()
        .into_iter()
        .filter(|bd| is_bundle(&bd.metadata, &ns, &name))
        .collect();

    let mut facts = BundleFacts {
        paused: bundle.spec.paused,
        ..Default::default()
    };
    let mut written = Written::default();
    let started = Instant::now();
    match plan::plan(
        &name,
        &bundle.spec,
        &views,
        &group_infos,
        &sources,
        copy_enabled,
    ) {
        // Never untarget on a selector we cannot evaluate: leave everything as it is.
        Err(error) => facts.targeting_error = Some(error.to_string()),
        Ok(plan) => {
            let by_ns: HashMap<String, Arc<BundleDeployment>> = existing
                .iter()
                .map(|bd| (bd.namespace().unwrap_or_default(), bd.clone()))
                .collect();
            let copies_by_ns = bundle_copies(ctx, &ns, &name);
            // Futures collected first: a closure inside the stream type trips async Send checks.
            let writes: Vec<_> = plan
                .deployments
                .iter()
                .map(|d| {
                    let copies = copies_by_ns.get(&d.namespace).map(Vec::as_slice);
                    write_deployment(ctx, bundle, d, by_ns.get(&d.namespace), copies, &fetched)
                })
                .collect();
            let results: Vec<Result<Option<(bool, usize)>, Error>> = stream::iter(writes)
                .buffer_unordered(FANOUT_CONCURRENCY)
                .collect()
                .await;
            for result in results {
                if let Some((created, copies)) = result? {
                    if created {
                        written.created += 1;
                    } else {
                        written.updated += 1;
                    }
                    written.copies += copies;
                }
            }
            let matched_ns: BTreeSet<String> = plan
                .matched
                .iter()
                .map(|c| names::cluster_namespace(&ns, c))
                .collect();
            for bd in &existing {
                let bd_ns = bd.namespace().unwrap_or_default();
                if matched_ns.contains(&bd_ns) || bd.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                delete_deployment(ctx, &bd_ns, &bd.name_any()).await?;
                written
                    .deleted
                    .push(bd.labels().get(labels::CLUSTER).cloned().unwrap_or(bd_ns));
            }
            let current: Vec<&BundleDeployment> = existing
                .iter()
                .filter(|bd| matched_ns.contains(&bd.namespace().unwrap_or_default()))
                .filter(|bd| bd.metadata.deletion_timestamp.is_none())
                .map(AsRef::as_ref)
                .collect();
            facts.matched = plan.matched.len();
            facts.summary = summarize(plan.matched.len(), current);
            facts.missing = plan.missing.into_iter().collect();
            facts.unsupported = plan.unsupported.into_iter().collect();
            facts.copy_disabled = plan.copy_disabled;
            facts.copies = plan.copies;
        }
    }
    let wrote = written.created > 0
        || written.updated > 0
        || written.copies > 0
        || !written.deleted.is_empty();
    if wrote {
        let elapsed = started.elapsed();
        ctx.hub.fanout_duration.observe(elapsed.as_secs_f64());
        tracing::info!(
            bundle = %name, namespace = %ns,
            created = written.created, updated = written.updated,
            copies = written.copies, deleted = written.deleted.len(),
            elapsed_ms = elapsed.as_millis() as u64,
            "bundle fanned out"
        );
    }

    write_status(bundle, ctx, &facts, &written).await?;
    Ok(Action::await_change())
}

async fn write_status(
    bundle: &Bundle,
    ctx: &Ctx,
    facts: &BundleFacts,
    written: &Written,
) -> Result<(), Error> {
    let ns = bundle.namespace().unwrap_or_default();
    let name = bundle.name_any();
    let old = bundle.status.as_ref();
    let new = bundle_status(
        old,
        facts,
        bundle.metadata.generation,
        Time(Timestamp::now()),
    );
    let reference = bundle.object_ref(&());
    if written.created > 0 {
        ctx.event(
            &reference,
            EventType::Normal,
            "BundleDeploymentsCreated",
            "Target",
            format!("created BundleDeployments for {} clusters", written.created),
        )
        .await;
    }
    if !written.deleted.is_empty() {
        ctx.event(
            &reference,
            EventType::Normal,
            "BundleDeploymentsDeleted",
            "Untarget",
            format!(
                "deleted BundleDeployments of {} clusters no longer targeted",
                written.deleted.len()
            ),
        )
        .await;
    }
    let recent_key = format!("status/Bundle/{ns}/{name}");
    let desired_key = hash::value_hash(&serde_json::to_value(&new).unwrap_or_default());
    let live_rv = bundle.resource_version();
    if old == Some(&new)
        || ctx
            .recent
            .get(&recent_key, live_rv.as_deref(), &desired_key)
            .is_some()
    {
        return Ok(());
    }
    // Events for transitions into a problem state only (the status itself says the rest).
    let reason_of = |s: Option<&tender_types::BundleStatus>, t: &str| {
        s.and_then(|s| find_condition(&s.conditions, t))
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    for t in [TYPE_RESOURCES_COPIED, TYPE_READY] {
        let before = reason_of(old, t).map(|(r, _)| r);
        let Some((after, message)) = reason_of(Some(&new), t) else {
            continue;
        };
        let problem = [
            reason::SOURCE_NOT_FOUND,
            reason::COPY_FEATURE_DISABLED,
            reason::UNSUPPORTED_KIND,
            reason::INVALID_SELECTOR,
            reason::NO_CLUSTERS_MATCHED,
        ];
        // Source problems show on both conditions: report them once, from ResourcesCopied.
        let duplicate = t == TYPE_READY
            && (after == reason::SOURCE_NOT_FOUND || after == reason::UNSUPPORTED_KIND);
        if before.as_deref() != Some(after.as_str())
            && problem.contains(&after.as_str())
            && !duplicate
        {
            ctx.event(&reference, EventType::Warning, &after, "Reconcile", message)
                .await;
        }
    }
    ctx.apply_status::<Bundle>(&ns, &name, &new, (recent_key, live_rv, desired_key))
        .await?;
    Ok(())
}

/// Writes one cluster's BundleDeployment and copies when they differ from the desired ones.
/// Returns `None` when nothing could be written (blocked or terminating), else whether the
/// BundleDeployment was created and how many copies were written.
async fn write_deployment(
    ctx: &Ctx,
    bundle: &Bundle,
    desired: &plan::DesiredDeployment,
    existing: Option<&Arc<BundleDeployment>>,
    existing_copies: Option<&[(SourceKind, String)]>,
    fetched: &HashMap<SourceKey, SourceObject>,
) -> Result<Option<(bool, usize)>, Error> {
    let Some(spec) = &desired.spec else {
        // A source is missing: keep what is there, copies included.
        return Ok(None);
    };
    let ns = bundle.namespace().unwrap_or_default();
    let name = names::bundle_deployment_name(&bundle.name_any());
    let bd_labels = owned_labels(
        &ns,
        &bundle.name_any(),
        &desired.cluster,
        &desired.namespace,
    );
    // Decide on the cache as it is now, not on the reconcile's snapshot: the snapshot may
    // predate our own last write, whose watch event has since cleared its memo entry.
    let live = ctx
        .stores
        .bundle_deployments
        .get(&ObjectRef::new(&name).within(&desired.namespace));
    let existing = live.as_ref().or(existing);
    if existing.is_some_and(|bd| bd.metadata.deletion_timestamp.is_some()) {
        // Recreated once the agent has finished cleaning up (its deletion event brings us back).
        return Ok(None);
    }
    let current = existing.filter(|bd| {
        &bd.spec == spec
            && bd
                .finalizers()
                .iter()
                .any(|f| f == labels::AGENT_CLEANUP_FINALIZER)
            && bd_labels.iter().all(|(k, v)| bd.labels().get(k) == Some(v))
    });
    let recent_key = format!("bd/{}/{name}", desired.namespace);
    let desired_key = hash::value_hash(&serde_json::to_value(spec).unwrap_or_default());
    let live_rv = existing.and_then(|bd| bd.resource_version());
    let recent = ctx
        .recent
        .get(&recent_key, live_rv.as_deref(), &desired_key);
    let (uid, wrote_bd) = match (current, recent) {
        (Some(bd), _) => {
            ctx.hub.bundle_deployments_skipped.inc();
            (bd.uid().unwrap_or_default(), false)
        }
        (None, Some(uid)) => {
            ctx.hub.bundle_deployments_skipped.inc();
            (uid, false)
        }
        (None, None) => {
            let bd =
                apply_deployment(ctx, &desired.namespace, &name, spec, bd_labels.clone()).await?;
            ctx.hub.bundle_deployments_written.inc();
            let uid = bd.uid().unwrap_or_default();
            ctx.recent
                .record(recent_key, live_rv, desired_key, uid.clone());
            (uid, true)
        }
    };
    let owner = OwnerReference {
        api_version: API_GROUP_VERSION.into(),
        kind: "BundleDeployment".into(),
        name: name.clone(),
        uid,
        controller: Some(true),
        block_owner_deletion: None,
    };
    let mut copies = 0;
    let mut wanted = BTreeSet::new();
    for copy in &desired.copies {
        wanted.insert((copy.kind, copy.copy_name.clone()));
        if write_copy(ctx, bundle, desired, copy, &owner, &bd_labels, fetched).await? {
            copies += 1;
        }
    }
    // Copies of this Bundle in this namespace that no entry wants any more.
    let stale = existing_copies
        .unwrap_or_default()
        .iter()
        .filter(|k| !wanted.contains(*k))
        .cloned();
    for (kind, copy_name) in stale {
        let dp = DeleteParams::background();
        let result = match kind {
            SourceKind::Secret => Api::<Secret>::namespaced(ctx.client.clone(), &desired.namespace)
                .delete(&copy_name, &dp)
                .await
                .map(|_| ()),
            SourceKind::ConfigMap => {
                Api::<ConfigMap>::namespaced(ctx.client.clone(), &desired.namespace)
                    .delete(&copy_name, &dp)
                    .await
                    .map(|_| ())
            }
        };
        match result {
            Ok(()) => ctx.hub.copies_deleted.inc(),
            Err(kube::Error::Api(s)) if s.code == 404 => 0,
            Err(e) => {
                return Err(kube_err(format!(
                    "delete copy {kind} {}/{copy_name}",
                    desired.namespace
                ))(e));
            }
        };
    }
    let created = wrote_bd && existing.is_none();
    if wrote_bd || copies > 0 {
        Ok(Some((created, copies)))
    } else {
        Ok(None)
    }
}

/// This Bundle's copies (not being deleted) by cluster namespace, from the metadata caches:
/// one pass per Bundle reconcile instead of one per cluster.
fn bundle_copies(
    ctx: &Ctx,
    bundle_ns: &str,
    bundle_name: &str,
) -> HashMap<String, Vec<(SourceKind, String)>> {
    let mut out: HashMap<String, Vec<(SourceKind, String)>> = HashMap::new();
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
            out.entry(ns.clone())
                .or_default()
                .push((kind, name.clone()));
        }
    }
    out
}

async fn apply_deployment(
    ctx: &Ctx,
    namespace: &str,
    name: &str,
    spec: &BundleDeploymentSpec,
    labels: BTreeMap<String, String>,
) -> Result<BundleDeployment, Error> {
    let mut bd = BundleDeployment::new(name, spec.clone());
    bd.metadata.namespace = Some(namespace.to_string());
    bd.metadata.labels = Some(labels);
    bd.metadata.finalizers = Some(vec![labels::AGENT_CLEANUP_FINALIZER.to_string()]);
    Api::<BundleDeployment>::namespaced(ctx.client.clone(), namespace)
        .patch(
            name,
            &PatchParams::apply(labels::HUB_FIELD_MANAGER).force(),
            &Patch::Apply(&bd),
        )
        .await
        .map_err(kube_err(format!(
            "apply BundleDeployment {namespace}/{name}"
        )))
}

async fn delete_deployment(ctx: &Ctx, namespace: &str, name: &str) -> Result<(), Error> {
    match Api::<BundleDeployment>::namespaced(ctx.client.clone(), namespace)
        .delete(name, &DeleteParams::background())
        .await
    {
        Ok(_) => {
            ctx.hub.bundle_deployments_deleted.inc();
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(kube_err(format!(
            "delete BundleDeployment {namespace}/{name}"
        ))(e)),
    }
}

/// Writes one copy unless the live copy already has this content hash and owner.
async fn write_copy(
    ctx: &Ctx,
    bundle: &Bundle,
    desired: &plan::DesiredDeployment,
    copy: &DesiredCopy,
    owner: &OwnerReference,
    bd_labels: &BTreeMap<String, String>,
    fetched: &HashMap<SourceKey, SourceObject>,
) -> Result<bool, Error> {
    let (copy_name, copy_ns) = (copy.copy_name.as_str(), desired.namespace.as_str());
    let recent_key = format!("{}/{copy_ns}/{copy_name}", copy.kind);
    let desired_key = format!("{}/{}", copy.hash, owner.uid);
    let live = match copy.kind {
        SourceKind::Secret => ctx
            .stores
            .copy_secrets
            .get(&ObjectRef::new(copy_name).within(copy_ns))
            .map(|m| m.metadata.clone()),
        SourceKind::ConfigMap => ctx
            .stores
            .copy_config_maps
            .get(&ObjectRef::new(copy_name).within(copy_ns))
            .map(|m| m.metadata.clone()),
    };
    let live_rv = live.as_ref().and_then(|m| m.resource_version.clone());
    // Someone else wrote the copy's content: its hash annotation can no longer be trusted, and
    // fields another manager owns would survive an apply, so the copy is recreated.
    let tampered = live.as_ref().is_some_and(plan::edited_by_others);
    let current = !tampered
        && live.is_some_and(|m| {
            m.annotations
                .as_ref()
                .and_then(|a| a.get(labels::CONTENT_HASH))
                == Some(&copy.hash)
                && m.owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == owner.uid)
        });
    let recent = !tampered
        && ctx
            .recent
            .get(&recent_key, live_rv.as_deref(), &desired_key)
            .is_some();
    if current || recent {
        ctx.hub.copies_skipped.inc();
        return Ok(false);
    }
    let ns = bundle.namespace().unwrap_or_default();
    let key = (copy.kind, copy.source.clone());
    let source = match fetched.get(&key) {
        Some(s) => s.clone(),
        None => match ctx.fetch_source(&ns, copy.kind, &copy.source).await? {
            Some((s, _, _)) => s,
            // Gone since planning: its deletion event re-plans this Bundle.
            None => return Ok(false),
        },
    };
    let copy_meta = |src: &ObjectMeta, hash: String| {
        let mut labels: BTreeMap<String, String> = src
            .labels
            .iter()
            .flatten()
            .filter(|(k, _)| labels::is_copied_metadata_key(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.extend(bd_labels.clone());
        let mut annotations: BTreeMap<String, String> = src
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| labels::is_copied_metadata_key(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        annotations.insert(labels::CONTENT_HASH.into(), hash);
        annotations.insert(labels::COPY_OF.into(), format!("{ns}/{}", copy.source));
        ObjectMeta {
            name: Some(copy.copy_name.clone()),
            namespace: Some(desired.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        }
    };
    let action = format!(
        "write copy {} {}/{}",
        copy.kind, desired.namespace, copy.copy_name
    );
    if tampered {
        tracing::info!(copy = %copy.copy_name, namespace = %desired.namespace, "copy edited by another field manager; recreating it");
        let dp = DeleteParams::background();
        let deleted = match copy.kind {
            SourceKind::Secret => Api::<Secret>::namespaced(ctx.client.clone(), &desired.namespace)
                .delete(&copy.copy_name, &dp)
                .await
                .map(|_| ()),
            SourceKind::ConfigMap => {
                Api::<ConfigMap>::namespaced(ctx.client.clone(), &desired.namespace)
                    .delete(&copy.copy_name, &dp)
                    .await
                    .map(|_| ())
            }
        };
        match deleted {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(kube_err(action)(e)),
        }
    }
    match source {
        SourceObject::Secret(s) => {
            let obj = Secret {
                metadata: copy_meta(&s.metadata, hash::secret_hash(&s)),
                type_: s.type_.clone(),
                data: s.data.clone(),
                immutable: s.immutable,
                string_data: None,
            };
            apply_or_recreate(
                Api::<Secret>::namespaced(ctx.client.clone(), &desired.namespace),
                &obj,
                action,
            )
            .await?;
        }
        SourceObject::ConfigMap(c) => {
            let obj = ConfigMap {
                metadata: copy_meta(&c.metadata, hash::config_map_hash(&c)),
                data: c.data.clone(),
                binary_data: c.binary_data.clone(),
                immutable: c.immutable,
            };
            apply_or_recreate(
                Api::<ConfigMap>::namespaced(ctx.client.clone(), &desired.namespace),
                &obj,
                action,
            )
            .await?;
        }
    }
    ctx.hub.copies_written.inc();
    ctx.recent
        .record(recent_key, live_rv, desired_key, String::new());
    Ok(true)
}

/// Server-side applies `obj`; an immutable copy or a changed Secret type cannot be updated in
/// place (422), so the copy is deleted and created again.
async fn apply_or_recreate<K>(api: Api<K>, obj: &K, action: String) -> Result<(), Error>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    let pp = PatchParams::apply(labels::HUB_FIELD_MANAGER).force();
    match api.patch(&name, &pp, &Patch::Apply(obj)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 422 => {
            tracing::info!(copy = %name, "copy cannot be updated in place (immutable or type change); recreating");
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(kube_err(action)(e)),
            }
            api.patch(&name, &pp, &Patch::Apply(obj))
                .await
                .map(|_| ())
                .map_err(kube_err(action))
        }
        Err(e) => Err(kube_err(action)(e)),
    }
}

/// Deletes every BundleDeployment of the Bundle; the agent's finalizer then cleans up
/// downstream, and the garbage collector removes the copies with their BundleDeployment.
async fn cleanup(bundle: &Bundle, ctx: &Ctx) -> Result<Action, Error> {
    let ns = bundle.namespace().unwrap_or_default();
    let name = bundle.name_any();
    ctx.sources.remove(&(ns.clone(), name.clone()));
    for bd in ctx.stores.bundle_deployments.state() {
        if is_bundle(&bd.metadata, &ns, &name) && bd.metadata.deletion_timestamp.is_none() {
            delete_deployment(ctx, &bd.namespace().unwrap_or_default(), &bd.name_any()).await?;
        }
    }
    Ok(Action::await_change())
}
