//! What moved in the hub's Cluster statuses during a window: when the idle check counts a
//! Cluster status write, the bench prints which fields that write changed, so an idle failure
//! names its cause instead of only its count. Cluster status holds no Secret data.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt::Debug;
use tender_types::{BundleDeployment, Cluster};
use tokio::task::JoinHandle;

/// The leaf paths where `old` and `new` differ, as `path: old -> new`. Arrays of objects with
/// a `type` (conditions) are matched by it; other arrays compare whole.
pub(crate) fn json_diff(old: &Value, new: &Value, path: &str, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let fields = |m: &'_ serde_json::Map<String, Value>| -> BTreeMap<String, Value> {
                m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
            };
            diff_keyed(&fields(a), &fields(b), |k| format!("{path}.{k}"), out);
        }
        (Value::Array(a), Value::Array(b)) if typed(a) && typed(b) => {
            let by_type = |v: &[Value]| -> BTreeMap<String, Value> {
                v.iter()
                    .map(|c| (c["type"].as_str().unwrap_or("").to_string(), c.clone()))
                    .collect()
            };
            diff_keyed(&by_type(a), &by_type(b), |t| format!("{path}[{t}]"), out);
        }
        _ if old != new => out.push(format!("{path}: {old} -> {new}")),
        _ => {}
    }
}

/// [`json_diff`] of the entries of two keyed collections (a missing entry is `null`).
fn diff_keyed(
    a: &BTreeMap<String, Value>,
    b: &BTreeMap<String, Value>,
    path: impl Fn(&str) -> String,
    out: &mut Vec<String>,
) {
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for k in keys {
        let (x, y) = (
            a.get(k).unwrap_or(&Value::Null),
            b.get(k).unwrap_or(&Value::Null),
        );
        json_diff(x, y, &path(k), out);
    }
}

fn typed(v: &[Value]) -> bool {
    !v.is_empty()
        && v.iter()
            .all(|c| c.get("type").is_some_and(Value::is_string))
}

/// `namespace/name` of a watched object.
fn key<K: kube::Resource>(k: &K) -> String {
    let m = k.meta();
    format!(
        "{}/{}",
        m.namespace.as_deref().unwrap_or(""),
        m.name.as_deref().unwrap_or("")
    )
}

/// How many status changes moved each set of fields (values and condition times left out),
/// most frequent first, with one full example each: what the writes beyond one per rotation
/// changed.
pub(crate) fn shapes(moves: &[String]) -> Vec<(usize, String, String)> {
    let mut by_shape: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for m in moves {
        let fields = m.split_once(": ").map_or(m.as_str(), |(_, f)| f);
        let paths: BTreeSet<&str> = fields
            .split("; ")
            .map(|d| d.split_once(": ").map_or(d, |(path, _)| path))
            .collect();
        let shape = paths.into_iter().collect::<Vec<_>>().join(", ");
        let entry = by_shape.entry(shape).or_insert((0, m.clone()));
        entry.0 += 1;
    }
    let mut out: Vec<_> = by_shape
        .into_iter()
        .map(|(shape, (n, example))| (n, shape, example))
        .collect();
    out.sort_by_key(|b| std::cmp::Reverse(b.0));
    out
}

/// A Cluster's status as the hub owns it (the agent's `status.agent` left out).
fn hub_status(c: &Cluster) -> Value {
    let mut v = serde_json::to_value(&c.status).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.remove("agent");
    }
    v
}

/// Records every change of a Cluster's hub-owned status seen by a watch, once the watch's
/// initial list is done (`ready` then turns true); each change as `cluster: path: old -> new; …`.
pub(crate) struct StatusMoves {
    pub moves: Arc<Mutex<Vec<String>>>,
    pub ready: Arc<std::sync::atomic::AtomicBool>,
    task: JoinHandle<()>,
}

impl StatusMoves {
    pub(crate) fn watch(api: Api<Cluster>) -> Self {
        Self::watch_status(api, hub_status)
    }

    /// The status moves of every BundleDeployment `api` sees (written by the agents; it holds
    /// object states and ids, no Secret data).
    pub(crate) fn watch_bundle_deployments(api: Api<BundleDeployment>) -> Self {
        Self::watch_status(api, |bd: &BundleDeployment| {
            serde_json::to_value(&bd.status).unwrap_or(Value::Null)
        })
    }

    fn watch_status<K>(api: Api<K>, status: fn(&K) -> Value) -> Self
    where
        K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
        K::DynamicType: Default,
    {
        let moves: Arc<Mutex<Vec<String>>> = Arc::default();
        let ready: Arc<std::sync::atomic::AtomicBool> = Arc::default();
        let (m, r) = (moves.clone(), ready.clone());
        let task = tokio::spawn(async move {
            let mut last: HashMap<String, Value> = HashMap::new();
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::InitApply(c)) => {
                        last.insert(key(&c), status(&c));
                    }
                    Ok(watcher::Event::InitDone) => {
                        r.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    Ok(watcher::Event::Apply(c)) => {
                        let name = key(&c);
                        let now = status(&c);
                        let mut diff = Vec::new();
                        if let Some(old) = last.get(&name) {
                            json_diff(old, &now, "status", &mut diff);
                        }
                        if !diff.is_empty() {
                            m.lock()
                                .expect("lock")
                                .push(format!("{name}: {}", diff.join("; ")));
                        }
                        last.insert(name, now);
                    }
                    _ => {}
                }
            }
        });
        Self { moves, ready, task }
    }

    pub(crate) async fn until_ready(&self) {
        while !self.ready.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// The changes seen so far; stops the watch.
    pub(crate) fn finish(self) -> Vec<String> {
        self.task.abort();
        std::mem::take(&mut *self.moves.lock().expect("lock"))
    }
}

/// Heartbeats as a watch of the hub's agent Leases sees them: the longest gap between two
/// renewals of one Lease (the agent did not renew) and the longest lag from a renewal's
/// `renewTime` (set when the agent sends it) to the watch event (the write took that long).
#[derive(Clone, Debug, Default)]
pub(crate) struct Heartbeats {
    pub renewals: u64,
    pub longest_gap_s: f64,
    pub gap_namespace: String,
    pub longest_lag_s: f64,
    pub lag_namespace: String,
}

pub(crate) struct LeaseGaps {
    seen: Arc<Mutex<Heartbeats>>,
    task: JoinHandle<()>,
}

impl LeaseGaps {
    pub(crate) fn watch(client: kube::Client) -> Self {
        use k8s_openapi::api::coordination::v1::Lease;
        let seen: Arc<Mutex<Heartbeats>> = Arc::default();
        let w = seen.clone();
        let task = tokio::spawn(async move {
            let config = watcher::Config::default().fields(&format!(
                "metadata.name={}",
                tender_types::names::AGENT_LEASE
            ));
            let mut last: HashMap<String, i64> = HashMap::new();
            let mut events = watcher(Api::<Lease>::all(client), config).boxed();
            while let Some(event) = events.next().await {
                let (Ok(watcher::Event::Apply(l)) | Ok(watcher::Event::InitApply(l))) = event
                else {
                    continue;
                };
                let ns = l.metadata.namespace.clone().unwrap_or_default();
                let Some(renewed) = l.spec.and_then(|s| s.renew_time).map(|t| t.0) else {
                    continue;
                };
                let ms = renewed.as_millisecond();
                let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
                let lag = (now - ms) as f64 / 1e3;
                let mut w = w.lock().expect("lock");
                w.renewals += 1;
                if let Some(prev) = last.insert(ns.clone(), ms) {
                    let gap = (ms - prev) as f64 / 1e3;
                    if gap > w.longest_gap_s {
                        (w.longest_gap_s, w.gap_namespace) = (gap, ns.clone());
                    }
                }
                if lag > w.longest_lag_s {
                    (w.longest_lag_s, w.lag_namespace) = (lag, ns);
                }
            }
        });
        Self { seen, task }
    }

    /// What the watch saw; stops it.
    pub(crate) fn finish(self) -> Heartbeats {
        self.task.abort();
        self.seen.lock().expect("lock").clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shapes_count_the_fields_moved_without_their_values() {
        let moves = [
            "ns/a: status.x: 1 -> 2; status.y: \"p\" -> \"q\"".to_string(),
            "ns/b: status.y: \"q\" -> \"r\"; status.x: 2 -> 3".to_string(),
            "ns/c: status.z: null -> true".to_string(),
        ];
        let shapes = shapes(&moves);
        assert_eq!(
            shapes
                .iter()
                .map(|(n, s, _)| (*n, s.as_str()))
                .collect::<Vec<_>>(),
            [(2, "status.x, status.y"), (1, "status.z")]
        );
        assert_eq!(
            shapes[0].2, moves[0],
            "the first change of a shape is its example"
        );
    }

    #[test]
    fn conditions_are_matched_by_type_and_only_moved_leaves_are_named() {
        let old = json!({"summary": {"ready": 0, "desiredReady": 1},
            "conditions": [{"type": "Ready", "status": "False", "reason": "NotReady"},
                           {"type": "AgentConnected", "status": "True"}]});
        let new = json!({"summary": {"ready": 1, "desiredReady": 1},
            "conditions": [{"type": "AgentConnected", "status": "True"},
                           {"type": "Ready", "status": "True", "reason": "Ready"}]});
        let mut out = Vec::new();
        json_diff(&old, &new, "status", &mut out);
        assert_eq!(
            out,
            vec![
                "status.conditions[Ready].reason: \"NotReady\" -> \"Ready\"",
                "status.conditions[Ready].status: \"False\" -> \"True\"",
                "status.summary.ready: 0 -> 1",
            ]
        );
        let mut none = Vec::new();
        json_diff(&old, &old, "status", &mut none);
        assert!(none.is_empty());
    }
}
