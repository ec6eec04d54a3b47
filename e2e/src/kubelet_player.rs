//! The test plays the controllers the test clusters do not run: their kube-controller-manager
//! runs only garbage collection, namespaces, ServiceAccounts and ClusterRole aggregation
//! (`env.rs`), and there is no kubelet. So no job controller or Deployment controller writes a
//! status that could fight the player's.
//!
//! [`Player`] watches one namespace of a downstream apiserver and, by rule, writes the status
//! their controllers would: Deployments, StatefulSets and DaemonSets become available; a Job
//! completes (or fails, when a rule says so) after its optional per-Job *effect* ran (what the
//! Job's container would have done, e.g. create a Secret); a hook Pod (annotation
//! `helm.sh/hook`) succeeds or fails the same way.
//!
//! [`Recorder`] records the order in which objects were created, changed and deleted, from a
//! watch per kind ordered by resourceVersion: one apiserver's resourceVersions are revisions
//! of its etcd, comparable across kinds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use futures::StreamExt;
use futures::future::BoxFuture;
use kube::api::{
    Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, WatchEvent, WatchParams,
};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// The field manager of the player's status writes.
const MANAGER: &str = "e2e-kubelet-player";

/// What a Job's container would have done before exiting 0; an error fails the Job.
pub type Effect =
    Arc<dyn Fn(kube::Client, DynamicObject) -> BoxFuture<'static, Result<()>> + Send + Sync>;

#[derive(Default)]
struct Rules {
    /// Names of Jobs and hook Pods that fail.
    failing: BTreeSet<String>,
    /// Names of Jobs and hook Pods left running (neither finished) until released.
    held: BTreeSet<String>,
    /// (name suffix, effect) of Jobs.
    effects: Vec<(String, Effect)>,
    /// Jobs/Pods already finished by the player, by uid.
    finished: BTreeSet<String>,
}

/// Plays the job controller, the Deployment/StatefulSet/DaemonSet controllers and the kubelet
/// in one namespace. Stops when dropped.
pub struct Player {
    client: kube::Client,
    ns: String,
    rules: Arc<Mutex<Rules>>,
    log: Arc<Mutex<Vec<String>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Player {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

impl Player {
    /// Starts playing in namespace `ns` of the cluster `client` reaches.
    pub fn start(client: kube::Client, ns: &str) -> Player {
        let rules = Arc::new(Mutex::new(Rules::default()));
        let log = Arc::new(Mutex::new(Vec::new()));
        let kinds = [
            resource("batch", "v1", "Job", "jobs"),
            resource("", "v1", "Pod", "pods"),
            resource("apps", "v1", "Deployment", "deployments"),
            resource("apps", "v1", "StatefulSet", "statefulsets"),
            resource("apps", "v1", "DaemonSet", "daemonsets"),
        ];
        let tasks = kinds
            .into_iter()
            .map(|ar| {
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
                let (client, rules, log) = (client.clone(), rules.clone(), log.clone());
                let kind = ar.kind.clone();
                tokio::spawn(watch_forever(api, None, move |event| {
                    let _ = &ar;
                    let (client, rules, log, kind) =
                        (client.clone(), rules.clone(), log.clone(), kind.clone());
                    async move {
                        let obj = match event {
                            Seen::Existing(o) | Seen::Added(o) | Seen::Modified(o) => o,
                            Seen::Deleted(_) => return,
                        };
                        if let Err(e) = play(&client, &kind, &ar_of(&kind), obj, &rules).await {
                            log.lock().unwrap().push(format!("{kind}: {e:#}"));
                        }
                    }
                }))
            })
            .collect();
        Player {
            client,
            ns: ns.to_string(),
            rules,
            log,
            tasks,
        }
    }

    /// Jobs and hook Pods named `name` fail from now on (those not finished yet).
    pub fn fail(&self, name: &str) {
        self.rules.lock().unwrap().failing.insert(name.to_string());
    }

    /// Jobs named `name` keep running (no status) until [`release`](Self::release)d.
    pub fn hold(&self, name: &str) {
        self.rules.lock().unwrap().held.insert(name.to_string());
    }

    /// Releases held Job `name`: it finishes now (fails when `fail` is set, from now on).
    pub async fn release(&self, name: &str, fail: bool) -> Result<()> {
        {
            let mut r = self.rules.lock().unwrap();
            r.held.remove(name);
            if fail {
                r.failing.insert(name.to_string());
            }
        }
        let ar = ar_of("Job");
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.ns, &ar);
        if let Some(job) = api.get_opt(name).await? {
            play(&self.client, "Job", &ar, job, &self.rules).await?;
        }
        Ok(())
    }

    /// Jobs and hook Pods named `name` succeed again from now on.
    pub fn succeed(&self, name: &str) {
        self.rules.lock().unwrap().failing.remove(name);
    }

    /// Before a Job whose name ends with `suffix` completes, `effect` runs (an error fails
    /// the Job).
    pub fn effect(&self, suffix: &str, effect: Effect) {
        self.rules
            .lock()
            .unwrap()
            .effects
            .push((suffix.to_string(), effect));
    }

    /// What went wrong while playing (a refused status write, a failed effect).
    pub fn errors(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

fn ar_of(kind: &str) -> ApiResource {
    match kind {
        "Job" => resource("batch", "v1", "Job", "jobs"),
        "Pod" => resource("", "v1", "Pod", "pods"),
        "StatefulSet" => resource("apps", "v1", "StatefulSet", "statefulsets"),
        "DaemonSet" => resource("apps", "v1", "DaemonSet", "daemonsets"),
        _ => resource("apps", "v1", "Deployment", "deployments"),
    }
}

/// One watch event, or an object found by the initial list.
#[derive(Debug, Clone)]
pub enum Seen {
    /// Listed when the watch started.
    Existing(DynamicObject),
    /// Created.
    Added(DynamicObject),
    /// Changed (also: deletion started).
    Modified(DynamicObject),
    /// Gone.
    Deleted(DynamicObject),
}

/// Lists `api` and watches it from the list's resourceVersion, forever (re-watching from the
/// last resourceVersion seen, re-listing after 410 Gone), calling `f` for every event in order.
async fn watch_forever<F, Fut>(
    api: Api<DynamicObject>,
    mut listed: Option<tokio::sync::oneshot::Sender<()>>,
    mut f: F,
) where
    F: FnMut(Seen) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut rv = String::new();
    loop {
        if rv.is_empty() {
            match api.list(&ListParams::default()).await {
                Ok(list) => {
                    rv = list.metadata.resource_version.clone().unwrap_or_default();
                    for o in list.items {
                        f(Seen::Existing(o)).await;
                    }
                    if let Some(tx) = listed.take() {
                        let _ = tx.send(());
                    }
                }
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    continue;
                }
            }
        }
        let stream = match api.watch(&WatchParams::default().timeout(120), &rv).await {
            Ok(s) => s,
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
        };
        let mut stream = stream.boxed();
        while let Some(event) = stream.next().await {
            let seen = match event {
                Ok(WatchEvent::Added(o)) => Seen::Added(o),
                Ok(WatchEvent::Modified(o)) => Seen::Modified(o),
                Ok(WatchEvent::Deleted(o)) => Seen::Deleted(o),
                Ok(WatchEvent::Bookmark(b)) => {
                    rv = b.metadata.resource_version;
                    continue;
                }
                Ok(WatchEvent::Error(e)) => {
                    if e.code == 410 {
                        rv.clear();
                    }
                    break;
                }
                Err(_) => break,
            };
            if let Some(v) = seen_obj(&seen).metadata.resource_version.clone() {
                rv = v;
            }
            f(seen).await;
        }
    }
}

fn seen_obj(seen: &Seen) -> &DynamicObject {
    match seen {
        Seen::Existing(o) | Seen::Added(o) | Seen::Modified(o) | Seen::Deleted(o) => o,
    }
}

fn condition_true(obj: &Value, type_: &str) -> bool {
    obj["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == type_ && c["status"] == "True")
    })
}

/// Whether a Job has finished (`Some(failed)`).
pub fn job_finished(job: &Value) -> Option<bool> {
    if condition_true(job, "Complete") {
        Some(false)
    } else if condition_true(job, "Failed") {
        Some(true)
    } else {
        None
    }
}

/// The status the job controller writes for a finished Job, as the apiserver's validation
/// wants it: a start time, a terminal condition preceded by its interim one
/// (`SuccessCriteriaMet`/`FailureTarget`), a completion time only when complete.
pub fn job_status(failed: bool, now: &str) -> Value {
    let cond = |type_: &str, reason: &str, message: &str| {
        json!({"type": type_, "status": "True", "reason": reason, "message": message,
               "lastProbeTime": now, "lastTransitionTime": now})
    };
    if failed {
        json!({"status": {
            "startTime": now, "active": 0, "ready": 0, "failed": 1,
            "conditions": [
                cond("FailureTarget", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
                cond("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
            ]
        }})
    } else {
        json!({"status": {
            "startTime": now, "completionTime": now, "active": 0, "ready": 0, "succeeded": 1,
            "conditions": [
                cond("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods"),
                cond("Complete", "CompletionsReached", "Reached expected number of succeeded pods"),
            ]
        }})
    }
}

/// The status a workload controller writes once `kind`'s pods are all available, or `None`
/// when `obj` already has it.
pub fn workload_status(kind: &str, obj: &Value) -> Option<Value> {
    let generation = obj["metadata"]["generation"].as_i64().unwrap_or(1);
    let status = &obj["status"];
    let int = |k: &str| status[k].as_i64().unwrap_or(0);
    let observed = status["observedGeneration"].as_i64() == Some(generation);
    match kind {
        "DaemonSet" => {
            if observed && int("numberAvailable") == 1 {
                return None;
            }
            Some(json!({"status": {
                "observedGeneration": generation, "currentNumberScheduled": 1,
                "desiredNumberScheduled": 1, "numberMisscheduled": 0, "numberReady": 1,
                "numberAvailable": 1, "updatedNumberScheduled": 1
            }}))
        }
        _ => {
            let n = obj["spec"]["replicas"].as_i64().unwrap_or(1);
            if observed && int("availableReplicas") == n && int("replicas") == n {
                return None;
            }
            let mut s = json!({
                "observedGeneration": generation, "replicas": n, "updatedReplicas": n,
                "readyReplicas": n, "availableReplicas": n
            });
            if kind == "StatefulSet" {
                s["currentReplicas"] = json!(n);
            } else {
                s["conditions"] = json!([
                    {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                     "message": "Deployment has minimum availability."},
                    {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                     "message": "ReplicaSet has successfully progressed."}
                ]);
            }
            Some(json!({ "status": s }))
        }
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Plays one object's controller.
async fn play(
    client: &kube::Client,
    kind: &str,
    ar: &ApiResource,
    obj: DynamicObject,
    rules: &Arc<Mutex<Rules>>,
) -> Result<()> {
    let ns = obj.metadata.namespace.clone().unwrap_or_default();
    let name = obj.metadata.name.clone().unwrap_or_default();
    let uid = obj.metadata.uid.clone().unwrap_or_default();
    if obj.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, ar);
    let value = serde_json::to_value(&obj)?;
    let status = match kind {
        "Job" | "Pod" => {
            let is_hook_pod = kind == "Pod"
                && obj
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("helm.sh/hook"));
            let finished = match kind {
                "Job" => job_finished(&value).is_some(),
                _ => matches!(
                    value["status"]["phase"].as_str(),
                    Some("Succeeded" | "Failed")
                ),
            };
            if finished || (kind == "Pod" && !is_hook_pod) {
                return Ok(());
            }
            let (mut failed, effect) = {
                let mut r = rules.lock().unwrap();
                if r.held.contains(&name) || !r.finished.insert(uid.clone()) {
                    return Ok(());
                }
                let effect = r
                    .effects
                    .iter()
                    .find(|(suffix, _)| name.ends_with(suffix.as_str()))
                    .map(|(_, e)| e.clone());
                (r.failing.contains(&name), effect)
            };
            if !failed
                && kind == "Job"
                && let Some(effect) = effect
            {
                let result = effect(client.clone(), obj.clone()).await;
                if let Err(e) = result {
                    failed = true;
                    eprintln!("kubelet player: the effect of Job {ns}/{name} failed: {e:#}");
                }
            }
            if kind == "Job" {
                job_status(failed, &now())
            } else {
                json!({"status": {"phase": if failed { "Failed" } else { "Succeeded" }}})
            }
        }
        _ => match workload_status(kind, &value) {
            Some(s) => s,
            None => return Ok(()),
        },
    };
    let result = api
        .patch_status(&name, &PatchParams::apply(MANAGER), &Patch::Merge(&status))
        .await;
    if let Err(e) = result {
        if kind == "Job" || kind == "Pod" {
            rules.lock().unwrap().finished.remove(&uid);
        }
        return Err(e).with_context(|| format!("status of {kind} {ns}/{name}"));
    }
    Ok(())
}

/// What happened to an object, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum What {
    /// It was there when recording started.
    Existing,
    /// Created.
    Created,
    /// Changed (not its deletion, not a Job finishing).
    Modified,
    /// A Job (or hook Pod) finished: complete/succeeded.
    Succeeded,
    /// A Job (or hook Pod) finished: failed.
    Failed,
    /// Its deletion started (deletionTimestamp set).
    Deleting,
    /// Gone.
    Deleted,
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The resourceVersion of the event (an etcd revision).
    pub rv: u64,
    /// The object's kind.
    pub kind: String,
    /// Its namespace (None: cluster-scoped).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// Its uid (tells a re-created object from the one before).
    pub uid: String,
    /// What happened.
    pub what: What,
}

/// Records what happens to the objects of some kinds, in one namespace (namespaced kinds)
/// or with given names (cluster-scoped kinds). Stops when dropped.
pub struct Recorder {
    events: Arc<Mutex<Vec<Recorded>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn finished_of(kind: &str, v: &Value) -> Option<bool> {
    match kind {
        "Job" => job_finished(v),
        "Pod" => match v["status"]["phase"].as_str() {
            Some("Succeeded") => Some(false),
            Some("Failed") => Some(true),
            _ => None,
        },
        _ => None,
    }
}

impl Recorder {
    /// Starts recording every kind of `kinds` (`apiVersion`, `kind`): namespaced kinds in
    /// `ns`, cluster-scoped kinds only the objects named in `cluster_names`. Returns once
    /// every kind has been listed, so nothing created afterwards is missed.
    pub async fn start(
        client: kube::Client,
        kinds: &BTreeSet<(String, String)>,
        ns: &str,
        cluster_names: BTreeSet<String>,
    ) -> Result<Recorder> {
        let events = Arc::new(Mutex::new(Vec::new()));
        let names = Arc::new(cluster_names);
        let mut tasks = Vec::new();
        let mut listed = Vec::new();
        for (api_version, kind) in kinds {
            let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
            let gvk = GroupVersionKind::gvk(group, version, kind);
            let (ar, caps) = kube::discovery::pinned_kind(&client, &gvk)
                .await
                .with_context(|| format!("discovering {api_version} {kind}"))?;
            let namespaced = caps.scope == Scope::Namespaced;
            let api: Api<DynamicObject> = if namespaced {
                Api::namespaced_with(client.clone(), ns, &ar)
            } else {
                Api::all_with(client.clone(), &ar)
            };
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            listed.push(rx);
            let (events, names, kind) = (events.clone(), names.clone(), kind.clone());
            let mut state: BTreeMap<String, (bool, bool)> = BTreeMap::new();
            tasks.push(tokio::spawn(watch_forever(api, Some(tx), move |seen| {
                let o = seen_obj(&seen).clone();
                let name = o.metadata.name.clone().unwrap_or_default();
                let uid = o.metadata.uid.clone().unwrap_or_default();
                let rv = o
                    .metadata
                    .resource_version
                    .as_deref()
                    .and_then(|r| r.parse().ok())
                    .unwrap_or(0);
                let keep = namespaced || names.contains(&name);
                let v = serde_json::to_value(&o).unwrap_or_default();
                let (was_finished, was_deleting) =
                    state.get(&uid).copied().unwrap_or((false, false));
                let finished = finished_of(&kind, &v);
                let deleting = o.metadata.deletion_timestamp.is_some();
                let what = match &seen {
                    Seen::Existing(_) => Some(What::Existing),
                    Seen::Added(_) => Some(What::Created),
                    Seen::Deleted(_) => Some(What::Deleted),
                    Seen::Modified(_) if deleting && !was_deleting => Some(What::Deleting),
                    Seen::Modified(_) if finished.is_some() && !was_finished => {
                        Some(if finished == Some(true) {
                            What::Failed
                        } else {
                            What::Succeeded
                        })
                    }
                    Seen::Modified(_) => Some(What::Modified),
                };
                state.insert(uid.clone(), (finished.is_some(), deleting));
                if keep && let Some(what) = what {
                    events.lock().unwrap().push(Recorded {
                        rv,
                        kind: kind.clone(),
                        namespace: o.metadata.namespace.clone(),
                        name,
                        uid,
                        what,
                    });
                }
                async {}
            })));
        }
        let recorder = Recorder { events, tasks };
        for (rx, (api_version, kind)) in listed.into_iter().zip(kinds) {
            tokio::time::timeout(std::time::Duration::from_secs(30), rx)
                .await
                .with_context(|| format!("listing {api_version} {kind}"))?
                .with_context(|| format!("the watch of {api_version} {kind}"))?;
        }
        Ok(recorder)
    }

    /// Everything recorded so far, ordered by resourceVersion.
    pub fn events(&self) -> Vec<Recorded> {
        let mut all = self.events.lock().unwrap().clone();
        all.sort_by_key(|e| e.rv);
        all
    }

    /// The highest resourceVersion recorded so far (0: none).
    pub fn last_rv(&self) -> u64 {
        self.events
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.rv)
            .max()
            .unwrap_or(0)
    }
}

/// Lists `api` once (used to prove a namespace empty of `kind`).
pub async fn names(api: &Api<DynamicObject>) -> Result<Vec<String>> {
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_status_carries_what_validation_asks() {
        let ok = job_status(false, "2026-01-01T00:00:00Z");
        assert_eq!(job_finished(&ok), Some(false));
        assert_eq!(ok["status"]["conditions"][0]["type"], "SuccessCriteriaMet");
        assert!(ok["status"]["completionTime"].is_string());
        let bad = job_status(true, "2026-01-01T00:00:00Z");
        assert_eq!(job_finished(&bad), Some(true));
        assert_eq!(bad["status"]["conditions"][0]["type"], "FailureTarget");
        assert!(bad["status"]["completionTime"].is_null());
    }

    #[test]
    fn a_workload_is_made_available_once() {
        let d = json!({"metadata": {"generation": 2}, "spec": {"replicas": 3}});
        let s = workload_status("Deployment", &d).unwrap();
        assert_eq!(s["status"]["availableReplicas"], 3);
        let done = json!({"metadata": {"generation": 2}, "spec": {"replicas": 3},
                          "status": {"observedGeneration": 2, "replicas": 3, "availableReplicas": 3}});
        assert_eq!(workload_status("Deployment", &done), None);
        let scaled = json!({"metadata": {"generation": 3}, "spec": {"replicas": 0},
                          "status": {"observedGeneration": 2, "replicas": 3, "availableReplicas": 3}});
        assert_eq!(
            workload_status("Deployment", &scaled).unwrap()["status"]["replicas"],
            0
        );
    }
}
