//! An in-memory apiserver for in-process reconciler tests (cargo feature `fake`).
//!
//! [`FakeApiserver`] is a `tower::Service` that [`kube::Client::new`] accepts: the code under
//! test makes its ordinary requests, the fake answers from objects held in memory, and the
//! test asserts on the requests it recorded ([`FakeApiserver::writes`]). It is good enough for
//! what tender's reconcilers and executor send, not a full apiserver:
//!
//! - GET one object, LIST (namespaced or across namespaces; `labelSelector` with `k=v`,
//!   `k!=v`, `k`, `!k`; `fieldSelector` on `metadata.name` / `metadata.namespace`);
//! - server-side apply (`application/apply-patch+yaml`): creates, or merges the applied
//!   fields into the object, dropping fields the same field manager applied before and no
//!   longer does (no ownership between managers, no conflicts); `conditions` and `shards`
//!   merge entry by entry (by `type`, by `id`) as the CRDs' list maps do, other lists are
//!   replaced;
//! - JSON merge patch (and strategic merge patch, treated as a merge patch), honouring a
//!   `metadata.resourceVersion` in the patch as a precondition (409 when stale); JSON patch
//!   (`add`, `remove`, `replace`, `test`: what kube's finalizer helper sends; a failed `test`
//!   answers 422);
//! - DELETE with `uid` / `resourceVersion` preconditions; an object with finalizers gets a
//!   `deletionTimestamp` and goes when the last finalizer is removed;
//! - POST (create, events included; `generateName`), PUT (replace);
//! - the `status` subresource (writes there change only `status`, writes to the object never
//!   do; `generation` moves only when something outside metadata and status changes).
//!
//! Every object gets a `uid`, an increasing `resourceVersion` (only when it changed, as the
//! apiserver does), a `creationTimestamp` and a `generation`. A test can make a path answer an
//! error ([`FakeApiserver::fail`]), seed and edit objects without recording requests, and
//! hand the objects to a reflector store ([`FakeApiserver::refill`]) as a watch would.

mod json;
mod request;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::ApiResource;
use kube::client::Body;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use json::{drop_unapplied, json_patch, merge, merge_applied, without};
use request::{Key, Target, query_params, selects_fields, selects_labels, status};

/// One request the fake received.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    /// HTTP method.
    pub method: Method,
    /// The path, without the query.
    pub path: String,
    /// The query string as sent (percent-encoded), empty when none.
    pub query: String,
    /// The `Content-Type` header (tells apply, merge and strategic merge patches apart).
    pub content_type: Option<String>,
    /// The body as JSON (`Null` when empty or not JSON).
    pub body: Value,
}

impl Recorded {
    /// Whether the request changes something (anything but GET, LIST and WATCH).
    pub fn is_write(&self) -> bool {
        self.method != Method::GET
    }

    /// Whether this is a server-side apply.
    pub fn is_apply(&self) -> bool {
        self.method == Method::PATCH
            && self
                .content_type
                .as_deref()
                .is_some_and(|c| c.starts_with("application/apply-patch"))
    }

    /// A query parameter, percent-decoded.
    pub fn param(&self, name: &str) -> Option<String> {
        query_params(&self.query).remove(name)
    }
}

impl std::fmt::Display for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

struct Failure {
    method: Option<Method>,
    path: String,
    code: u16,
    /// How many more requests it answers (`None`: until cleared).
    times: Option<usize>,
}

type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

#[derive(Default)]
struct State {
    objects: BTreeMap<Key, Value>,
    /// The last body each field manager applied to each object (per subresource), so an
    /// apply that no longer sets a field removes it.
    applied: BTreeMap<(Key, String, bool), Value>,
    resource_version: u64,
    uids: u64,
    failures: Vec<Failure>,
    requests: Vec<Recorded>,
    clock: Option<Clock>,
}

/// An in-memory apiserver; cheap to clone (clones share the objects and the record).
#[derive(Clone, Default)]
pub struct FakeApiserver {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for FakeApiserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("FakeApiserver")
            .field("objects", &state.objects.len())
            .field("requests", &state.requests.len())
            .finish()
    }
}

impl FakeApiserver {
    /// An empty apiserver.
    pub fn new() -> Self {
        Self::default()
    }

    /// A client talking to this apiserver (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.clone(), "default")
    }

    /// Timestamps (`creationTimestamp`, `deletionTimestamp`) come from `clock` instead of
    /// the wall clock, e.g. the test's virtual clock.
    pub fn set_clock(&self, clock: impl Fn() -> Timestamp + Send + Sync + 'static) {
        self.lock().clock = Some(Arc::new(clock));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    // --- seeding and reading, without recording requests ---

    /// Stores `object` of `resource` (namespace and name from its metadata), replacing any
    /// object of that name; returns it with uid, resourceVersion, creationTimestamp and
    /// generation filled in.
    pub fn insert(&self, resource: &ApiResource, mut object: Value) -> Value {
        let meta = &object["metadata"];
        let key = Key::of(
            resource,
            meta["namespace"].as_str(),
            meta["name"].as_str().unwrap_or_default(),
        );
        if let Value::Object(map) = &mut object {
            map.insert("apiVersion".into(), resource.api_version.clone().into());
            map.insert("kind".into(), resource.kind.clone().into());
        }
        let mut state = self.lock();
        let old = state.objects.get(&key).cloned();
        state.store(key, old.as_ref(), object, true)
    }

    /// Stores a typed object (see [`FakeApiserver::insert`]).
    pub fn put<K>(&self, object: &K) -> K
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let value = serde_json::to_value(object).expect("serialisable object");
        let stored = self.insert(&ApiResource::erase::<K>(&()), value);
        serde_json::from_value(stored).expect("the stored object reads back")
    }

    /// Changes a stored object in place (a change by someone else: a user, the agent); the
    /// resourceVersion and generation move as they would. False when there is no such object.
    pub fn edit(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> bool {
        let key = Key::of(resource, namespace, name);
        let mut state = self.lock();
        let Some(old) = state.objects.get(&key).cloned() else {
            return false;
        };
        let mut new = old.clone();
        change(&mut new);
        state.store(key, Some(&old), new, true);
        true
    }

    /// Removes a stored object outright (no finalizers, no request recorded).
    pub fn remove(&self, resource: &ApiResource, namespace: Option<&str>, name: &str) -> bool {
        let key = Key::of(resource, namespace, name);
        self.lock().objects.remove(&key).is_some()
    }

    /// The stored object, if any.
    pub fn get(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        self.lock()
            .objects
            .get(&Key::of(resource, namespace, name))
            .cloned()
    }

    /// A typed stored object, if any.
    pub fn get_as<K>(&self, namespace: Option<&str>, name: &str) -> Option<K>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let value = self.get(&ApiResource::erase::<K>(&()), namespace, name)?;
        Some(serde_json::from_value(value).expect("a stored object of its type"))
    }

    /// Every stored object of `resource`, in every namespace, ordered by namespace and name.
    pub fn list(&self, resource: &ApiResource) -> Vec<Value> {
        self.lock()
            .objects
            .iter()
            .filter(|(k, _)| k.api_version == resource.api_version && k.plural == resource.plural)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Every stored object of type `K` (also `PartialObjectMeta<K>`, which reads the metadata).
    pub fn all<K>(&self) -> Vec<K>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        self.list(&ApiResource::erase::<K>(&()))
            .into_iter()
            .map(|v| serde_json::from_value(v).expect("a stored object of its type"))
            .collect()
    }

    /// Replaces the contents of a reflector store with the stored objects of `K`, as a
    /// watch's initial list would.
    pub fn refill<K>(&self, writer: &mut Writer<K>)
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Clone + 'static,
    {
        writer.apply_watcher_event(&watcher::Event::Init);
        for object in self.all::<K>() {
            writer.apply_watcher_event(&watcher::Event::InitApply(object));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
    }

    // --- faults ---

    /// Requests with `method` (any method when `None`) to exactly `path` answer `code` (e.g.
    /// 409, 413, 500) until [`FakeApiserver::clear_failures`].
    pub fn fail(&self, method: Option<Method>, path: &str, code: u16) {
        self.fail_times(method, path, code, None);
    }

    /// Like [`FakeApiserver::fail`], for the next `times` matching requests only (`None`:
    /// until cleared).
    pub fn fail_times(&self, method: Option<Method>, path: &str, code: u16, times: Option<usize>) {
        self.lock().failures.push(Failure {
            method,
            path: path.to_string(),
            code,
            times,
        });
    }

    /// Every path answers normally again.
    pub fn clear_failures(&self) {
        self.lock().failures.clear();
    }

    // --- the record ---

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// The requests received so far, forgetting them (so the next step's are seen alone).
    pub fn take_requests(&self) -> Vec<Recorded> {
        std::mem::take(&mut self.lock().requests)
    }

    /// The writes received so far (see [`Recorded::is_write`]).
    pub fn writes(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(Recorded::is_write)
            .collect()
    }

    /// The writes received so far, forgetting every request.
    pub fn take_writes(&self) -> Vec<Recorded> {
        self.take_requests()
            .into_iter()
            .filter(Recorded::is_write)
            .collect()
    }

    // --- serving ---

    fn handle(&self, request: Recorded) -> (u16, Value) {
        let mut state = self.lock();
        state.requests.push(request.clone());
        if let Some(code) = state.injected(&request) {
            return (
                code,
                status(code, &format!("injected failure for {request}")),
            );
        }
        let Some(target) = Target::parse(&request.path) else {
            return (404, status(404, &format!("no such path {}", request.path)));
        };
        let params = query_params(&request.query);
        let result = match (&request.method, target.name.as_deref()) {
            (&Method::GET, None) => Ok(state.list_response(&target, &params)),
            (&Method::GET, Some(name)) => state.read(&target.key(name)).map(|v| (200, v)),
            (&Method::POST, None) => state.create(&target, request.body),
            (&Method::PATCH, Some(name)) => state.patch(
                &target,
                name,
                request.content_type.as_deref().unwrap_or_default(),
                params.get("fieldManager").map(String::as_str),
                request.body,
            ),
            (&Method::PUT, Some(name)) => state.replace(&target, name, request.body),
            (&Method::DELETE, Some(name)) => state.delete(&target.key(name), &request.body),
            _ => Err((405, format!("{request} is not supported by the fake"))),
        };
        result.unwrap_or_else(|(code, message)| (code, status(code, &message)))
    }
}

type Answer = Result<(u16, Value), (u16, String)>;

impl State {
    fn injected(&mut self, request: &Recorded) -> Option<u16> {
        let i = self.failures.iter().position(|f| {
            f.path == request.path
                && f.method.as_ref().is_none_or(|m| *m == request.method)
                && f.times != Some(0)
        })?;
        let failure = &mut self.failures[i];
        if let Some(n) = &mut failure.times {
            *n -= 1;
        }
        Some(failure.code)
    }

    fn now(&self) -> String {
        let now = self.clock.as_ref().map_or_else(Timestamp::now, |c| c());
        now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    }

    fn read(&self, key: &Key) -> Result<Value, (u16, String)> {
        self.objects
            .get(key)
            .cloned()
            .ok_or_else(|| (404, format!("{} {:?} not found", key.plural, key.name)))
    }

    /// Stores `new` under `key` over `old`: fills in what the apiserver assigns, moves the
    /// resourceVersion only when something changed and the generation only when more than
    /// metadata or status changed, and lets an object whose deletion waited on finalizers go.
    fn store(&mut self, key: Key, old: Option<&Value>, mut new: Value, spec_write: bool) -> Value {
        let meta = &mut new["metadata"];
        meta["name"] = key.name.clone().into();
        match &key.namespace {
            Some(ns) => meta["namespace"] = ns.clone().into(),
            None => {
                if let Value::Object(m) = meta {
                    m.remove("namespace");
                }
            }
        }
        let kept = |field: &str| old.map(|o| o["metadata"][field].clone());
        match old {
            None => {
                self.uids += 1;
                meta["uid"] = format!("fake-uid-{}", self.uids).into();
                meta["creationTimestamp"] = self.now().into();
                meta["generation"] = 1.into();
            }
            Some(_) => {
                for field in ["uid", "creationTimestamp", "generation", "resourceVersion"] {
                    if let Some(v) = kept(field) {
                        meta[field] = v;
                    }
                }
                if old
                    .and_then(|o| o["metadata"].get("deletionTimestamp"))
                    .is_some()
                {
                    meta["deletionTimestamp"] = kept("deletionTimestamp").unwrap_or_default();
                }
            }
        }
        let changed = old != Some(&new);
        if changed {
            if spec_write
                && let Some(old) = old
                && without(old, &["metadata", "status"]) != without(&new, &["metadata", "status"])
            {
                let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
                new["metadata"]["generation"] = (generation + 1).into();
            }
            self.resource_version += 1;
            new["metadata"]["resourceVersion"] = self.resource_version.to_string().into();
        }
        let finalized = new["metadata"].get("deletionTimestamp").is_some()
            && new["metadata"]["finalizers"]
                .as_array()
                .is_none_or(Vec::is_empty);
        if finalized {
            self.objects.remove(&key);
            self.applied.retain(|(k, _, _), _| *k != key);
        } else {
            self.objects.insert(key, new.clone());
        }
        new
    }

    fn list_response(&self, target: &Target, params: &BTreeMap<String, String>) -> (u16, Value) {
        let version = self.resource_version.to_string();
        if params.get("watch").is_some_and(|w| w == "true" || w == "1") {
            // No watch: the stream ends at once and a watcher lists again.
            return (200, Value::Null);
        }
        let labels = params.get("labelSelector").map(String::as_str);
        let fields = params.get("fieldSelector").map(String::as_str);
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|(k, _)| {
                k.api_version == target.api_version
                    && k.plural == target.plural
                    && (target.namespace.is_none() || k.namespace == target.namespace)
            })
            .map(|(_, v)| v)
            .filter(|v| labels.is_none_or(|s| selects_labels(s, v)))
            .filter(|v| fields.is_none_or(|s| selects_fields(s, v)))
            .cloned()
            .collect();
        let kind = items
            .first()
            .and_then(|i| i["kind"].as_str())
            .map_or_else(|| "List".to_string(), |k| format!("{k}List"));
        let list = json!({
            "apiVersion": target.api_version,
            "kind": kind,
            "metadata": {"resourceVersion": version},
            "items": items,
        });
        (200, list)
    }

    fn create(&mut self, target: &Target, mut body: Value) -> Answer {
        let name = match body["metadata"]["name"].as_str() {
            Some(name) => name.to_string(),
            None => match body["metadata"]["generateName"].as_str() {
                Some(prefix) => format!("{prefix}{}", self.uids + 1),
                None => return Err((422, "metadata.name: Required value".into())),
            },
        };
        let key = target.key(&name);
        if self.objects.contains_key(&key) {
            return Err((409, format!("{} {name:?} already exists", target.plural)));
        }
        body["metadata"]["name"] = name.into();
        Ok((201, self.store(key, None, body, true)))
    }

    fn patch(
        &mut self,
        target: &Target,
        name: &str,
        content_type: &str,
        manager: Option<&str>,
        body: Value,
    ) -> Answer {
        let key = target.key(name);
        let status_only = target.is_status();
        let old = self.objects.get(&key).cloned();
        let written = if status_only {
            json!({"status": body.get("status").cloned().unwrap_or(Value::Null)})
        } else {
            without(&body, &["status"])
        };
        if content_type.starts_with("application/apply-patch") {
            let applied_key = (
                key.clone(),
                manager.unwrap_or_default().to_string(),
                status_only,
            );
            let mut new = match &old {
                Some(old) => old.clone(),
                None if status_only => {
                    return Err((404, format!("{} {name:?} not found", key.plural)));
                }
                None => {
                    json!({"apiVersion": body["apiVersion"], "kind": body["kind"], "metadata": {}})
                }
            };
            if let Some(before) = self.applied.get(&applied_key) {
                drop_unapplied(&mut new, before, &written);
            }
            merge_applied(&mut new, &written);
            self.applied.insert(applied_key, written);
            let code = if old.is_some() { 200 } else { 201 };
            return Ok((code, self.store(key, old.as_ref(), new, !status_only)));
        }
        let Some(old) = old else {
            return Err((404, format!("{} {name:?} not found", key.plural)));
        };
        if content_type.starts_with("application/json-patch") {
            let mut new = old.clone();
            json_patch(&mut new, &body).map_err(|why| (422, why))?;
            if status_only {
                let mut only = old.clone();
                only["status"] = new["status"].take();
                new = only;
            } else if let Value::Object(m) = &mut new {
                // The status subresource's alone.
                match old.get("status") {
                    Some(s) => m.insert("status".into(), s.clone()),
                    None => m.remove("status"),
                };
            }
            return Ok((200, self.store(key, Some(&old), new, !status_only)));
        }
        if !(content_type.starts_with("application/merge-patch")
            || content_type.starts_with("application/strategic-merge-patch"))
        {
            return Err((
                415,
                format!("patch type {content_type:?} is not supported by the fake"),
            ));
        }
        if let Some(wanted) = body["metadata"]["resourceVersion"].as_str()
            && old["metadata"]["resourceVersion"].as_str() != Some(wanted)
        {
            return Err((
                409,
                format!("{} {name:?}: the object has been modified", key.plural),
            ));
        }
        let mut new = old.clone();
        merge(&mut new, &written);
        Ok((200, self.store(key, Some(&old), new, !status_only)))
    }

    fn replace(&mut self, target: &Target, name: &str, body: Value) -> Answer {
        let key = target.key(name);
        let old = self.read(&key)?;
        if let Some(wanted) = body["metadata"]["resourceVersion"].as_str()
            && old["metadata"]["resourceVersion"].as_str() != Some(wanted)
        {
            return Err((
                409,
                format!("{} {name:?}: the object has been modified", key.plural),
            ));
        }
        let new = if target.is_status() {
            let mut new = old.clone();
            new["status"] = body["status"].clone();
            new
        } else {
            let mut new = body;
            new["status"] = old.get("status").cloned().unwrap_or(Value::Null);
            if new["status"].is_null()
                && let Value::Object(m) = &mut new
            {
                m.remove("status");
            }
            new
        };
        Ok((200, self.store(key, Some(&old), new, !target.is_status())))
    }

    fn delete(&mut self, key: &Key, options: &Value) -> Answer {
        let old = self.read(key)?;
        let pre = &options["preconditions"];
        for field in ["uid", "resourceVersion"] {
            if let Some(wanted) = pre[field].as_str()
                && old["metadata"][field].as_str() != Some(wanted)
            {
                return Err((409, format!("precondition failed: {field} {wanted}")));
            }
        }
        let has_finalizers = old["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if !has_finalizers {
            self.objects.remove(key);
            self.applied.retain(|(k, _, _), _| k != key);
            return Ok((200, old));
        }
        let mut new = old.clone();
        if new["metadata"].get("deletionTimestamp").is_none() {
            new["metadata"]["deletionTimestamp"] = self.now().into();
        }
        Ok((200, self.store(key.clone(), Some(&old), new, false)))
    }
}

impl tower::Service<Request<Body>> for FakeApiserver {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let fake = self.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes = body
                .collect_bytes()
                .await
                .map(|b| b.to_vec())
                .unwrap_or_default();
            let recorded = Recorded {
                method: parts.method,
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or_default().to_string(),
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let (code, answer) = fake.handle(recorded);
            let bytes = if answer.is_null() {
                Vec::new()
            } else {
                serde_json::to_vec(&answer).unwrap_or_default()
            };
            let response = Response::builder()
                .status(code)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(bytes))
                .expect("a valid response");
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests;
