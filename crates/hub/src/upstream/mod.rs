//! Reverse sync on the hub (`Bundle.spec.upstreamResources`) as a controller of its own,
//! keyed by Bundle (decision 0114-reverse-sync-controller): per cluster the Bundle has a
//! BundleDeployment in, the placeholders and the agent's access to exactly those names
//! (observe: caches → [`plan`] → executor), then each placeholder's content validated and
//! published in the Bundle's namespace, and everything no longer wanted deleted. Its status
//! lines go to [`UpstreamMemo::lines`](crate::context::UpstreamMemo), and a change wakes the
//! Bundle controller, whose status module writes them (in the shard entry on a shard replica).
//!
//! A placeholder's content is read (one GET) only when its resourceVersion moved since the hub
//! last judged it; the verdict is remembered, never the data.

pub mod plan;

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::channel::mpsc::UnboundedSender;
use kube::runtime::controller::Action;
use tender_runtime::retry;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use tender_runtime::executor::{Apply, Fingerprint, ObjectKey, Op, body_of};
use tender_types::conditions::{TYPE_AGENT_CONNECTED, TYPE_CLUSTER_CONNECTED, find_condition};
use tender_types::{
    Bundle, BundleDeployment, BundleStatus, Cluster, ClusterMode, SourceKind, UpstreamPublication,
    conditions, hash, labels,
};

use crate::context::Ctx;
use crate::{Error, kube_err};
use plan::{Entry, LivePublished, Observed, PlaceholderContent, Reach, Verdict};

const CONTROLLER: &str = "upstream";

/// What the reverse-sync controller shares: the scope's context and the Bundle controller's
/// trigger, pulled when a Bundle's lines changed.
pub(crate) struct UpstreamCtx {
    /// The scope's context.
    pub ctx: Arc<Ctx>,
    /// Wakes the Bundle controller for a Bundle whose status lines changed.
    pub lines_changed: UnboundedSender<ObjectRef<Bundle>>,
}

/// Reverse sync for `bundle`: publishes for every cluster it has a BundleDeployment in, and
/// leaves its status lines for the Bundle controller.
pub(crate) async fn reconcile(bundle: Arc<Bundle>, uc: Arc<UpstreamCtx>) -> Result<Action, Error> {
    let ctx = &uc.ctx;
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    let key = (bundle.namespace().unwrap_or_default(), bundle.name_any());
    if bundle.metadata.deletion_timestamp.is_some() {
        // What it published is owned by the Bundle: the garbage collector removes it.
        ctx.upstream.lines.lock().expect("lines").remove(&key);
        return Ok(Action::await_change());
    }
    // Most Bundles have nothing to do with reverse sync: say so before looking at clusters.
    let bundle_ns = bundle.namespace().unwrap_or_default();
    let published = published_of(ctx, &bundle_ns, &bundle.name_any());
    if bundle.spec.upstream_resources.is_empty() && published.is_empty() && !had_lines(&bundle) {
        return Ok(Action::await_change());
    }
    let clusters = deployed_clusters(ctx, &bundle);
    let lines = publish(ctx, &bundle, &clusters, published).await?;
    let before = ctx
        .upstream
        .lines
        .lock()
        .expect("lines")
        .insert(key, lines.clone());
    if before.as_ref() != Some(&lines) {
        let _ = uc
            .lines_changed
            .unbounded_send(ObjectRef::from_obj(bundle.as_ref()));
    }
    Ok(Action::await_change())
}

pub(crate) fn error_policy(bundle: Arc<Bundle>, error: &Error, uc: Arc<UpstreamCtx>) -> Action {
    retry::error_policy(
        CONTROLLER,
        bundle.as_ref(),
        error,
        &uc.ctx.retries,
        &uc.ctx.metrics,
    )
}

/// The clusters (name, cluster namespace) of this replica where `bundle` has a
/// BundleDeployment not being deleted: where the hub put it (the namespace it created for the
/// Cluster), as the Bundle controller writes it (decision 0073-hub-writes-where-it-derives).
fn deployed_clusters(ctx: &Ctx, bundle: &Bundle) -> Vec<(String, String)> {
    let ns = bundle.namespace().unwrap_or_default();
    let bd_name = tender_types::names::bundle_deployment_name(&bundle.name_any());
    ctx.own_clusters_in(&ns)
        .iter()
        .filter_map(|c| Some((c.name_any(), ctx.owned_namespace(c)?)))
        .filter(|(_, cns)| {
            ctx.stores
                .bundle_deployments
                .get(&ObjectRef::new(&bd_name).within(cns))
                .is_some_and(|bd| bd.metadata.deletion_timestamp.is_none())
        })
        .collect()
}

/// Runs reverse sync of Bundle `bundle` for `clusters` (name, cluster namespace), given what
/// it has `published`, and returns its status lines.
async fn publish(
    ctx: &Ctx,
    bundle: &Bundle,
    clusters: &[(String, String)],
    published: Vec<(SourceKind, ObjectMeta)>,
) -> Result<Vec<UpstreamPublication>, Error> {
    let bundle_ns = bundle.namespace().unwrap_or_default();
    let name = bundle.name_any();
    let spec = &bundle.spec.upstream_resources;
    let bundle_owner = OwnerReference {
        api_version: tender_types::API_GROUP_VERSION.into(),
        kind: "Bundle".into(),
        name: name.clone(),
        uid: bundle.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let now = Time(ctx.clock.now());
    let mut lines = Vec::new();
    let mut wanted_published: BTreeSet<(SourceKind, String)> = BTreeSet::new();
    for (cluster, cns) in clusters {
        let bd = ctx
            .stores
            .bundle_deployments
            .get(&ObjectRef::new(&name).within(cns))
            .filter(|bd| bd.metadata.deletion_timestamp.is_none());
        let Some(bd) = bd else { continue };
        let options = &bd.spec.options;
        let deploy_ns = options
            .target_namespace
            .clone()
            .unwrap_or_else(|| options.default_namespace.clone());
        let entries = plan::entries(&name, cluster, &deploy_ns, spec);
        let cluster_obj = ctx
            .stores
            .clusters
            .get(&ObjectRef::new(cluster).within(&bundle_ns));
        let mut place_labels =
            tender_types::upstream::placeholder_labels(&bundle_ns, &name, cluster);
        if let Some(id) = &ctx.config.shard_id {
            // In this replica's caches of the cluster namespace (decision 0062-hub-shards).
            place_labels.insert(labels::SHARD.into(), id.clone());
        }
        let bd_owner = bd_owner(&bd);
        let mut ops = Vec::new();
        for e in &entries {
            let live = placeholder_meta(ctx, e.kind, cns, &e.placeholder);
            ops.extend(plan::placeholder_op(
                e,
                cns,
                &place_labels,
                &bd_owner,
                live.as_ref(),
            ));
        }
        ops.extend(stale_placeholders(ctx, cns, &name, &entries));
        ctx.exec.execute_in_order(ops).await?;
        let pull = cluster_obj
            .as_ref()
            .is_none_or(|c| c.spec.mode() == ClusterMode::Pull);
        write_access(ctx, cns, &name, &entries, &place_labels, &bd_owner, pull).await?;

        let reach = reach(ctx, cluster_obj.as_deref(), cns);
        for e in &entries {
            wanted_published.insert((e.kind, e.published.clone()));
            let meta = placeholder_meta(ctx, e.kind, cns, &e.placeholder);
            let observed = Observed::of(meta.as_ref());
            let live = published_meta(ctx, e.kind, &bundle_ns, &e.published)
                .map(|m| LivePublished::of(&m, &name, cluster, e));
            let verdict = if observed == Observed::Present {
                let rv = meta.and_then(|m| m.resource_version).unwrap_or_default();
                verdict(ctx, cns, e, &rv, live.as_ref(), |c| {
                    plan::publication_body(
                        c,
                        e,
                        &bundle_ns,
                        &name,
                        cluster,
                        &bundle_owner,
                        ctx.config.upstream_max_bytes,
                        &now,
                    )
                })
                .await?
            } else {
                None
            };
            let (line, ops) = plan::publication(
                &bundle_ns,
                cluster,
                e,
                observed,
                verdict.as_ref(),
                live.as_ref(),
                &reach,
            );
            if !ops.is_empty() {
                tracing::info!(bundle = %name, namespace = %bundle_ns, %cluster, published = %e.published, state = %line.state, "upstream publication changed");
            }
            ctx.exec.execute_in_order(ops).await?;
            lines.push(line);
        }
    }
    // Publications of untargeted clusters and removed entries.
    let stale: Vec<Op> = published
        .into_iter()
        .filter(|(kind, meta)| {
            !wanted_published.contains(&(*kind, meta.name.clone().unwrap_or_default()))
        })
        // Published for a Cluster of another shard: that replica's to keep or remove.
        .filter(|(_, meta)| {
            let cluster = meta.labels.as_ref().and_then(|l| l.get(labels::CLUSTER));
            !cluster.is_some_and(|c| ctx.cluster_served_elsewhere(&bundle_ns, c))
        })
        .map(|(kind, meta)| Op::Delete {
            key: key(kind, &bundle_ns, meta.name.as_deref().unwrap_or_default()),
            uid: meta.uid.clone(),
        })
        .collect();
    ctx.exec.execute_in_order(stale).await?;
    lines.sort_by(|a, b| {
        (&a.cluster, &a.kind, &a.namespace, &a.name).cmp(&(
            &b.cluster,
            &b.kind,
            &b.namespace,
            &b.name,
        ))
    });
    Ok(lines)
}

/// Sets `status.upstream` and the `UpstreamPublished` condition (removed with the last line).
pub(crate) fn set_status(
    status: &mut BundleStatus,
    lines: Vec<UpstreamPublication>,
    generation: Option<i64>,
    now: Time,
) {
    if lines.is_empty() {
        status
            .conditions
            .retain(|c| c.type_ != conditions::TYPE_UPSTREAM_PUBLISHED);
    } else {
        let (ok, reason, message) = plan::condition(&lines);
        conditions::set_condition(
            &mut status.conditions,
            conditions::TYPE_UPSTREAM_PUBLISHED,
            ok,
            reason,
            &message,
            generation,
            now,
        );
    }
    status.upstream = lines;
}

fn had_lines(bundle: &Bundle) -> bool {
    bundle
        .status
        .as_ref()
        .is_some_and(|s| !s.upstream.is_empty())
}

fn key(kind: SourceKind, ns: &str, name: &str) -> ObjectKey {
    match kind {
        SourceKind::Secret => ObjectKey::of::<Secret>(Some(ns), name),
        SourceKind::ConfigMap => ObjectKey::of::<ConfigMap>(Some(ns), name),
    }
}

fn bd_owner(bd: &BundleDeployment) -> OwnerReference {
    OwnerReference {
        api_version: tender_types::API_GROUP_VERSION.into(),
        kind: "BundleDeployment".into(),
        name: bd.name_any(),
        uid: bd.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// Placeholders live in the copy caches (they carry the workspace label).
fn placeholder_meta(ctx: &Ctx, kind: SourceKind, ns: &str, name: &str) -> Option<ObjectMeta> {
    match kind {
        SourceKind::Secret => ctx
            .stores
            .copy_secrets
            .get(&ObjectRef::new(name).within(ns))
            .map(|m| m.metadata.clone()),
        SourceKind::ConfigMap => ctx
            .stores
            .copy_config_maps
            .get(&ObjectRef::new(name).within(ns))
            .map(|m| m.metadata.clone()),
    }
}

/// Published objects live in the source caches (no bundle-name label: they can be sources).
fn published_meta(ctx: &Ctx, kind: SourceKind, ns: &str, name: &str) -> Option<ObjectMeta> {
    match kind {
        SourceKind::Secret => ctx
            .stores
            .source_secrets
            .get(&ObjectRef::new(name).within(ns))
            .map(|m| m.metadata.clone()),
        SourceKind::ConfigMap => ctx
            .stores
            .source_config_maps
            .get(&ObjectRef::new(name).within(ns))
            .map(|m| m.metadata.clone()),
    }
}

fn is_upstream_of(meta: &ObjectMeta, role: &str, bundle: &str) -> bool {
    let l = meta.labels.as_ref();
    meta.deletion_timestamp.is_none()
        && l.and_then(|l| l.get(labels::UPSTREAM)).map(String::as_str) == Some(role)
        && l.and_then(|l| l.get(labels::UPSTREAM_BUNDLE)) == Some(&labels::safe_label_value(bundle))
}

/// This Bundle's published objects in its namespace.
fn published_of(ctx: &Ctx, ns: &str, bundle: &str) -> Vec<(SourceKind, ObjectMeta)> {
    let secrets = ctx.stores.source_secrets.state();
    let cms = ctx.stores.source_config_maps.state();
    secrets
        .iter()
        .map(|m| (SourceKind::Secret, &m.metadata))
        .chain(cms.iter().map(|m| (SourceKind::ConfigMap, &m.metadata)))
        .filter(|(_, m)| m.namespace.as_deref() == Some(ns))
        .filter(|(_, m)| is_upstream_of(m, labels::UPSTREAM_PUBLISHED, bundle))
        .map(|(k, m)| (k, m.clone()))
        .collect()
}

/// Placeholders of this Bundle in `cns` that no entry wants any more.
fn stale_placeholders(ctx: &Ctx, cns: &str, bundle: &str, entries: &[Entry]) -> Vec<Op> {
    let wanted: BTreeSet<(SourceKind, &str)> = entries
        .iter()
        .map(|e| (e.kind, e.placeholder.as_str()))
        .collect();
    let secrets = ctx.stores.copy_secrets.state();
    let cms = ctx.stores.copy_config_maps.state();
    secrets
        .iter()
        .map(|m| (SourceKind::Secret, &m.metadata))
        .chain(cms.iter().map(|m| (SourceKind::ConfigMap, &m.metadata)))
        .filter(|(_, m)| m.namespace.as_deref() == Some(cns))
        .filter(|(_, m)| is_upstream_of(m, labels::UPSTREAM_PLACEHOLDER, bundle))
        .filter(|(k, m)| !wanted.contains(&(*k, m.name.as_deref().unwrap_or_default())))
        .map(|(k, m)| Op::Delete {
            key: key(k, cns, m.name.as_deref().unwrap_or_default()),
            uid: m.uid.clone(),
        })
        .collect()
}

/// The agent's Role/RoleBinding for this Bundle's placeholders in `cns`: applied when they
/// differ from what this process last applied, deleted when no entry is left. Push clusters
/// get the Role but no binding (decision 0036-push-clusters-no-agent-rolebindings: a leftover pull
/// agent cannot act).
async fn write_access(
    ctx: &Ctx,
    cns: &str,
    bundle: &str,
    entries: &[Entry],
    labels: &std::collections::BTreeMap<String, String>,
    owner: &OwnerReference,
    pull: bool,
) -> Result<(), Error> {
    let names_of = |kind: SourceKind| -> Vec<String> {
        let mut v: Vec<String> = entries
            .iter()
            .filter(|e| e.kind == kind)
            .map(|e| e.placeholder.clone())
            .collect();
        v.sort();
        v
    };
    let role_name = tender_types::names::upstream_role(bundle);
    let memo_key = (cns.to_string(), role_name.clone());
    let access = crate::cluster::upstream_access(
        cns,
        bundle,
        &names_of(SourceKind::Secret),
        &names_of(SourceKind::ConfigMap),
        labels,
    );
    let desired = hash::value_hash(&serde_json::json!([
        serde_json::to_value(&access).unwrap_or_default(),
        owner.uid,
        pull
    ]));
    if ctx.upstream.access.lock().expect("memo").get(&memo_key) == Some(&desired) {
        return Ok(());
    }
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let ops = match access {
        None => vec![
            Op::Delete {
                key: ObjectKey::of::<RoleBinding>(Some(cns), &role_name),
                uid: None,
            },
            Op::Delete {
                key: ObjectKey::of::<Role>(Some(cns), &role_name),
                uid: None,
            },
        ],
        Some((mut role, mut binding)) => {
            role.metadata.owner_references = Some(vec![owner.clone()]);
            binding.metadata.owner_references = Some(vec![owner.clone()]);
            let apply = |key: ObjectKey, body| {
                Op::Apply(Apply {
                    key,
                    body,
                    replace_if_immutable: true,
                    fingerprint: None::<Fingerprint>,
                })
            };
            let mut ops = vec![apply(
                ObjectKey::of::<Role>(Some(cns), &role_name),
                body_of(&role),
            )];
            ops.push(if pull {
                apply(
                    ObjectKey::of::<RoleBinding>(Some(cns), &role_name),
                    body_of(&binding),
                )
            } else {
                Op::Delete {
                    key: ObjectKey::of::<RoleBinding>(Some(cns), &role_name),
                    uid: None,
                }
            });
            ops
        }
    };
    ctx.exec.execute_in_order(ops).await?;
    ctx.upstream
        .access
        .lock()
        .expect("memo")
        .insert(memo_key, desired);
    Ok(())
}

/// Whether the cluster's agent (or, in push mode, the cluster) is reachable; since when not.
fn reach(ctx: &Ctx, cluster: Option<&Cluster>, cns: &str) -> Reach {
    let Some(c) = cluster else {
        return Reach {
            online: true,
            since: None,
        };
    };
    let conds = c
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let down = |t: &str| find_condition(conds, t).filter(|c| c.status == "False");
    let offline = down(TYPE_AGENT_CONNECTED).or_else(|| {
        (c.spec.mode() == ClusterMode::Push)
            .then(|| down(TYPE_CLUSTER_CONNECTED))
            .flatten()
    });
    let Some(cond) = offline else {
        return Reach {
            online: true,
            since: None,
        };
    };
    let since = crate::cluster::agent_heartbeat(ctx, c, cns)
        .map(Time)
        .or_else(|| Some(cond.last_transition_time.clone()));
    Reach {
        online: false,
        since,
    }
}

/// The hub's verdict on a placeholder: remembered by resourceVersion; read and judged again
/// only when it moved, or when the publication no longer matches a remembered good verdict
/// (e.g. deleted by hand). `None`: nothing to do.
async fn verdict(
    ctx: &Ctx,
    cns: &str,
    e: &Entry,
    rv: &str,
    live: Option<&LivePublished>,
    judge: impl Fn(&PlaceholderContent) -> Verdict,
) -> Result<Option<Verdict>, Error> {
    let memo_key = (cns.to_string(), e.placeholder.clone());
    let remembered = ctx
        .upstream
        .verdicts
        .lock()
        .expect("memo")
        .get(&memo_key)
        .cloned();
    if let Some((seen, result)) = remembered
        && seen == rv
    {
        match result {
            Err(why) => return Ok(Some(Err(why))),
            Ok(h) if live.is_some_and(|l| l.ours && l.hash.as_deref() == Some(&h)) => {
                return Ok(None);
            }
            Ok(_) => {}
        }
    }
    let action = format!(
        "read upstream placeholder {} {cns}/{}",
        e.kind, e.placeholder
    );
    let content = match e.kind {
        SourceKind::Secret => Api::<Secret>::namespaced(ctx.client.clone(), cns)
            .get_opt(&e.placeholder)
            .await
            .map_err(|err| Error::kube(action, true, err))?
            .map(|s| (PlaceholderContent::from_secret(&s), s.resource_version())),
        SourceKind::ConfigMap => Api::<ConfigMap>::namespaced(ctx.client.clone(), cns)
            .get_opt(&e.placeholder)
            .await
            .map_err(kube_err(action))?
            .map(|c| {
                (
                    PlaceholderContent::from_config_map(&c),
                    c.resource_version(),
                )
            }),
    };
    let Some((content, rv)) = content else {
        return Ok(None);
    };
    let v = judge(&content);
    let remembered = v.as_ref().map(|(_, h)| h.clone()).map_err(Clone::clone);
    ctx.upstream
        .verdicts
        .lock()
        .expect("memo")
        .insert(memo_key, (rv.unwrap_or_default(), remembered));
    Ok(Some(v))
}
