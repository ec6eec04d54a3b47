//! Reverse sync on the agent: every placeholder the hub created for this cluster (found in the
//! copy reflectors of the cluster namespace by label) names a downstream Secret/ConfigMap; the
//! agent watches exactly that object (a field-selected watch per name) and copies its content
//! into the placeholder, or marks it `Absent`, with its own field manager
//! (`tender-agent-upstream`), then reports `status.upstream` on the BundleDeployment.
//!
//! Level-triggered: any placeholder or watched-object event queues one pass over all
//! placeholders; a pass writes only what differs ([`placeholder_body`] vs the cached
//! placeholder), so an idle agent makes no writes. Nothing here deletes anything.
//!
//! Only what the owner's policy lets a Bundle read is watched and published
//! (decision 0077-reads-for-a-bundle-obey-the-owner): never the agent's own namespace, never a
//! service-account token, only the readable namespaces; a refused entry is an `Error` line
//! starting with `ReadRefusedByPolicy`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef as KubeRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tender_runtime::executor::{Apply, ObjectKey, Op, body_of};
use tender_runtime::{Executor, Metrics};
use tender_types::upstream::{self, Observed, UpstreamObjectStatus, UpstreamState};
use tender_types::{BundleDeployment, copy, hash, labels};
use tokio::task::AbortHandle;

use crate::config::ShutdownSignal;
use crate::policy::{Policy, Reads};

/// A downstream object named by a placeholder: (kind, namespace, name).
type Source = (String, String, String);

/// What the agent knows about a watched downstream object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Seen {
    /// Its watch has not listed yet.
    Unknown,
    /// It does not exist.
    Absent,
    /// It exists: its content for the placeholder, and its content hash.
    Present(Box<Content>, String),
}

/// Downstream content as written into a placeholder.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Content {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub secret_type: Option<String>,
    pub bytes: BTreeMap<String, ByteString>,
    pub strings: BTreeMap<String, String>,
}

impl Content {
    fn of_secret(s: &Secret) -> Self {
        Self {
            labels: copy::copied_metadata(s.metadata.labels.as_ref()),
            annotations: copy::copied_metadata(s.metadata.annotations.as_ref()),
            secret_type: Some(s.type_.clone().unwrap_or_else(|| "Opaque".into())),
            bytes: copy::secret_data(s),
            strings: BTreeMap::new(),
        }
    }

    fn of_config_map(c: &ConfigMap) -> Self {
        Self {
            labels: copy::copied_metadata(c.metadata.labels.as_ref()),
            annotations: copy::copied_metadata(c.metadata.annotations.as_ref()),
            secret_type: None,
            bytes: c.binary_data.clone().unwrap_or_default(),
            strings: c.data.clone().unwrap_or_default(),
        }
    }
}

/// The placeholder body the agent applies for `seen` (`None`: not known yet, nothing to write).
pub(crate) fn placeholder_body(kind: &str, ns: &str, name: &str, seen: &Seen) -> Option<Value> {
    let (observed, content) = match seen {
        Seen::Unknown => return None,
        Seen::Absent => (Observed::Absent, Content::default()),
        Seen::Present(c, _) => (Observed::Present, (**c).clone()),
    };
    let mut annotations = content.annotations.clone();
    annotations.insert(
        labels::UPSTREAM_OBSERVED.into(),
        observed.as_str()?.to_string(),
    );
    if let Some(t) = &content.secret_type {
        annotations.insert(labels::UPSTREAM_TYPE.into(), t.clone());
    }
    let meta = ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        labels: Some(content.labels.clone()),
        annotations: Some(annotations),
        ..Default::default()
    };
    Some(match kind {
        "Secret" => body_of(&Secret {
            metadata: meta,
            data: Some(content.bytes),
            ..Default::default()
        }),
        _ => body_of(&ConfigMap {
            metadata: meta,
            data: Some(content.strings),
            binary_data: Some(content.bytes),
            ..Default::default()
        }),
    })
}

/// Whether the cached placeholder already holds `body` (data exact; our labels/annotations
/// present with the same values).
pub(crate) fn in_sync(body: &Value, live: &Value) -> bool {
    let same = |path: &str| {
        let want = &body[path];
        let have = &live[path];
        let empty = |v: &Value| v.is_null() || v.as_object().is_some_and(|m| m.is_empty());
        want == have || (empty(want) && empty(have))
    };
    let subset = |field: &str| {
        body["metadata"][field]
            .as_object()
            .into_iter()
            .flatten()
            .all(|(k, v)| live["metadata"][field].get(k) == Some(v))
    };
    same("data") && same("binaryData") && subset("labels") && subset("annotations")
}

struct Watches {
    secrets: HashMap<(String, String), (Store<Secret>, AbortHandle)>,
    config_maps: HashMap<(String, String), (Store<ConfigMap>, AbortHandle)>,
}

fn watch<K>(
    client: &Client,
    ns: &str,
    name: &str,
    ping: UnboundedSender<()>,
) -> (Store<K>, AbortHandle)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store::<K>();
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let what = format!("{} {ns}/{name}", K::kind(&()));
    let task = tokio::spawn(async move {
        let mut events = reflector::reflector(writer, tender_runtime::watch::watcher(api, config))
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(_) => {
                    let _ = ping.unbounded_send(());
                }
                Err(error) => {
                    tracing::warn!(%error, object = %what, "watching an upstream object failed; retrying with backoff")
                }
            }
        }
    });
    (reader, task.abort_handle())
}

fn seen_in<K: Resource<DynamicType = ()> + Clone>(
    store: &Store<K>,
    ns: &str,
    name: &str,
    content: fn(&K) -> (Content, String),
) -> Seen {
    if store.wait_until_ready().now_or_never_ready() {
        match store.get(&KubeRef::new(name).within(ns)) {
            Some(obj) => {
                let (c, h) = content(&obj);
                Seen::Present(Box::new(c), h)
            }
            None => Seen::Absent,
        }
    } else {
        Seen::Unknown
    }
}

/// `Store::wait_until_ready` as a non-blocking check.
trait ReadyNow {
    fn now_or_never_ready(self) -> bool;
}
impl<F: std::future::Future<Output = Result<(), E>>, E> ReadyNow for F {
    fn now_or_never_ready(self) -> bool {
        matches!(futures::FutureExt::now_or_never(self), Some(Ok(())))
    }
}

/// Runs the agent's reverse sync until `shutdown`: a burst of events within `coalesce` is one
/// pass; a failed pass is tried again after `retry`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    hub: Client,
    downstream: Client,
    cluster_ns: String,
    identity: String,
    (policy, agent_namespace): (Policy, String),
    (coalesce, retry): (Duration, Duration),
    metrics: Arc<Metrics>,
    placeholders: (Store<Secret>, Store<ConfigMap>),
    bds: Store<BundleDeployment>,
    ping: UnboundedSender<()>,
    mut pings: UnboundedReceiver<()>,
    shutdown: ShutdownSignal,
) {
    let exec = Executor::new(
        hub.clone(),
        labels::AGENT_UPSTREAM_FIELD_MANAGER,
        Recorder::new(
            hub.clone(),
            Reporter {
                controller: "tender-agent".into(),
                instance: Some(identity),
            },
        ),
        metrics,
    );
    let mut watches = Watches {
        secrets: HashMap::new(),
        config_maps: HashMap::new(),
    };
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            next = pings.next() => if next.is_none() { break },
            () = &mut shutdown => break,
        }
        // Coalesce a burst of events into one pass.
        tokio::time::sleep(coalesce).await;
        while pings.try_recv().is_ok() {}
        let failed = pass(
            &exec,
            &downstream,
            &cluster_ns,
            policy.reads(&agent_namespace),
            &placeholders,
            &bds,
            &mut watches,
            &ping,
        )
        .await;
        if failed {
            let ping = ping.clone();
            tokio::spawn(async move {
                tokio::time::sleep(retry).await;
                let _ = ping.unbounded_send(());
            });
        }
    }
    for (_, (_, h)) in watches.secrets.drain() {
        h.abort();
    }
    for (_, (_, h)) in watches.config_maps.drain() {
        h.abort();
    }
}

/// The placeholders of cluster namespace `cluster_ns` in the caches: (metadata, live JSON).
fn placeholders(
    cluster_ns: &str,
    secrets: &Store<Secret>,
    config_maps: &Store<ConfigMap>,
) -> Vec<(ObjectMeta, Value)> {
    let is_placeholder =
        |m: &ObjectMeta| m.namespace.as_deref() == Some(cluster_ns) && upstream::is_placeholder(m);
    // (placeholder meta, live placeholder JSON)
    let mut found: Vec<(ObjectMeta, Value)> = Vec::new();
    for s in secrets.state() {
        if is_placeholder(&s.metadata) {
            found.push((
                s.metadata.clone(),
                serde_json::to_value(s.as_ref()).unwrap_or_default(),
            ));
        }
    }
    for c in config_maps.state() {
        if is_placeholder(&c.metadata) {
            found.push((
                c.metadata.clone(),
                serde_json::to_value(c.as_ref()).unwrap_or_default(),
            ));
        }
    }
    found
}

/// Stops the watches of objects no placeholder names any more.
fn unwatch(watches: &mut Watches, wanted: &[Source]) {
    watches.secrets.retain(|(ns, name), (_, h)| {
        let keep = wanted.contains(&("Secret".into(), ns.clone(), name.clone()));
        if !keep {
            h.abort();
        }
        keep
    });
    watches.config_maps.retain(|(ns, name), (_, h)| {
        let keep = wanted.contains(&("ConfigMap".into(), ns.clone(), name.clone()));
        if !keep {
            h.abort();
        }
        keep
    });
}

/// Writes each BundleDeployment's `status.upstream` that changed; whether a write failed.
async fn write_reports(
    exec: &Executor,
    cluster_ns: &str,
    bds: &Store<BundleDeployment>,
    reports: BTreeMap<String, Vec<UpstreamObjectStatus>>,
) -> bool {
    let mut failed = false;
    for (bd_name, mut lines) in reports {
        lines.sort_by(|a, b| {
            (&a.kind, &a.namespace, &a.name).cmp(&(&b.kind, &b.namespace, &b.name))
        });
        let Some(bd) = bds.get(&KubeRef::new(&bd_name).within(cluster_ns)) else {
            continue;
        };
        let old = bd
            .status
            .as_ref()
            .map(|s| s.upstream.clone())
            .unwrap_or_default();
        if old == lines {
            continue;
        }
        let op = Op::ApplyStatus(Apply {
            key: ObjectKey::of::<BundleDeployment>(Some(cluster_ns), &bd_name),
            body: json!({
                "apiVersion": tender_types::API_GROUP_VERSION,
                "kind": "BundleDeployment",
                "metadata": { "name": bd_name },
                "status": { "upstream": lines },
            }),
            replace_if_immutable: false,
            fingerprint: None,
        });
        if let Err(error) = exec.execute(op).await {
            failed = true;
            tracing::warn!(%error, bundle_deployment = %bd_name, "writing status.upstream failed; retrying");
        }
    }
    failed
}

/// One pass over every placeholder; returns whether something failed (retried shortly).
#[allow(clippy::too_many_arguments)]
async fn pass(
    exec: &Executor,
    downstream: &Client,
    cluster_ns: &str,
    reads: Reads<'_>,
    (secrets, config_maps): &(Store<Secret>, Store<ConfigMap>),
    bds: &Store<BundleDeployment>,
    watches: &mut Watches,
    ping: &UnboundedSender<()>,
) -> bool {
    let found = placeholders(cluster_ns, secrets, config_maps);
    let mut wanted: Vec<Source> = Vec::new();
    let mut failed = false;
    let mut reports: BTreeMap<String, Vec<UpstreamObjectStatus>> = BTreeMap::new();
    for bd in bds.state() {
        if bd.metadata.deletion_timestamp.is_none() {
            reports.entry(bd.name_any()).or_default();
        }
    }
    let now = Time(Timestamp::now());
    for (meta, live) in &found {
        let Some((kind, ns, name)) = upstream::placeholder_source(meta) else {
            continue;
        };
        let placeholder = meta.name.clone().unwrap_or_default();
        let owner = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "BundleDeployment")
            .map(|o| o.name.clone());
        let mut line = UpstreamObjectStatus {
            kind: kind.into(),
            namespace: ns.into(),
            name: name.into(),
            placeholder: placeholder.clone(),
            ..Default::default()
        };
        // Refused by namespace: not even watched (nor kept in memory).
        if matches!(kind, "Secret" | "ConfigMap")
            && let Some(why) = reads.refusal_message(kind, ns, name, None)
        {
            line.state = UpstreamState::Error;
            line.message = Some(why);
            if let Some(owner) = owner {
                reports.entry(owner).or_default().push(line);
            }
            continue;
        }
        let seen = match kind {
            "Secret" => {
                let (store, _) = watches
                    .secrets
                    .entry((ns.into(), name.into()))
                    .or_insert_with(|| watch(downstream, ns, name, ping.clone()));
                seen_in(store, ns, name, |s| {
                    (Content::of_secret(s), hash::secret_hash(s))
                })
            }
            "ConfigMap" => {
                let (store, _) = watches
                    .config_maps
                    .entry((ns.into(), name.into()))
                    .or_insert_with(|| watch(downstream, ns, name, ping.clone()));
                seen_in(store, ns, name, |c| {
                    (Content::of_config_map(c), hash::config_map_hash(c))
                })
            }
            _ => continue,
        };
        wanted.push((kind.into(), ns.into(), name.into()));
        let previous = owner
            .as_ref()
            .and_then(|o| bds.get(&KubeRef::new(o).within(cluster_ns)))
            .and_then(|bd| bd.status.as_ref().map(|s| s.upstream.clone()))
            .unwrap_or_default()
            .into_iter()
            .find(|p| p.placeholder == placeholder);
        // Refused by what it is (a service-account token): its content never leaves.
        let refused = match &seen {
            Seen::Present(c, _) => reads.refusal_message(kind, ns, name, c.secret_type.as_deref()),
            _ => None,
        };
        match placeholder_body(kind, cluster_ns, &placeholder, &seen) {
            _ if refused.is_some() => {
                line.state = UpstreamState::Error;
                line.message = refused;
            }
            None => line.state = UpstreamState::Pending,
            Some(body) => {
                let mut wrote = false;
                if !in_sync(&body, live) {
                    let key = match kind {
                        "Secret" => ObjectKey::of::<Secret>(Some(cluster_ns), &placeholder),
                        _ => ObjectKey::of::<ConfigMap>(Some(cluster_ns), &placeholder),
                    };
                    let op = Op::Apply(Apply {
                        key,
                        body,
                        replace_if_immutable: false,
                        fingerprint: None,
                    });
                    match exec.execute(op).await {
                        Ok(o) => wrote = o.wrote,
                        Err(error) => {
                            failed = true;
                            line.state = UpstreamState::Error;
                            line.message = Some(format!(
                                "cannot write placeholder {placeholder} on the hub: {}",
                                redacted(&error, kind == "Secret")
                            ));
                        }
                    }
                }
                if line.state != UpstreamState::Error {
                    match &seen {
                        Seen::Present(_, h) => {
                            line.state = UpstreamState::Published;
                            line.hash = Some(h.clone());
                            line.last_published = previous
                                .filter(|p| p.hash.as_ref() == Some(h) && !wrote)
                                .and_then(|p| p.last_published)
                                .or_else(|| Some(now.clone()));
                        }
                        _ => {
                            line.state = UpstreamState::Missing;
                            line.message = Some(format!("{kind} {ns}/{name} not found"));
                        }
                    }
                }
            }
        }
        if let Some(owner) = owner {
            reports.entry(owner).or_default().push(line);
        }
    }
    // Stop watching objects no placeholder names any more.
    unwatch(watches, &wanted);
    failed |= write_reports(exec, cluster_ns, bds, reports).await;
    failed
}

/// The executor's errors about Secrets carry only reason and code (decision 0028-one-error-shape).
fn redacted(error: &tender_runtime::ReconcileError, _secret: bool) -> String {
    error.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn present(value: &str) -> Seen {
        let s = Secret {
            metadata: ObjectMeta {
                labels: Some(BTreeMap::from([("team".into(), "net".into())])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                "id".into(),
                ByteString(value.as_bytes().to_vec()),
            )])),
            ..Default::default()
        };
        Seen::Present(Box::new(Content::of_secret(&s)), hash::secret_hash(&s))
    }

    #[test]
    fn unknown_writes_nothing() {
        assert_eq!(placeholder_body("Secret", "cns", "p", &Seen::Unknown), None);
    }

    #[test]
    fn present_content_goes_into_the_placeholder_without_a_type_change() {
        let body = placeholder_body("Secret", "cns", "p", &present("pcx-1")).unwrap();
        assert!(body.get("type").is_none(), "placeholders stay Opaque");
        assert_eq!(
            body["metadata"]["annotations"][labels::UPSTREAM_OBSERVED],
            "Present"
        );
        assert_eq!(
            body["metadata"]["annotations"][labels::UPSTREAM_TYPE],
            "Opaque"
        );
        assert_eq!(body["metadata"]["labels"]["team"], "net");
        assert!(body["data"]["id"].is_string());
    }

    #[test]
    fn nothing_changed_means_no_write() {
        let body = placeholder_body("Secret", "cns", "p", &present("pcx-1")).unwrap();
        let mut live = body.clone();
        live["metadata"]["labels"][labels::UPSTREAM] = "placeholder".into();
        live["type"] = "Opaque".into();
        assert!(in_sync(&body, &live));
        let changed = placeholder_body("Secret", "cns", "p", &present("pcx-2")).unwrap();
        assert!(!in_sync(&changed, &live));
        let absent = placeholder_body("Secret", "cns", "p", &Seen::Absent).unwrap();
        assert!(!in_sync(&absent, &live));
    }
}
