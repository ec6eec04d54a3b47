//! A minimal in-memory apiserver for the agent's in-process tests: a tower service a
//! `kube::Client` runs over, objects kept as JSON, every request recorded.
//!
//! It serves what the agent asks of an apiserver: discovery of the kinds it is told about,
//! get, list and watch (label selectors `k=v`, `k!=v`, `k`, `!k`), create, server-side apply
//! (a deep merge, enough for one writer per field), merge and JSON patches, the status
//! subresource, and deletes with a uid precondition. A write that changes nothing keeps the
//! resourceVersion and sends no watch event, as a real apiserver does. Nothing here runs a
//! controller: a Job's status is what the test writes.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use futures::channel::mpsc;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::Client;
use kube::api::ApiResource;
use serde_json::{Value, json};

/// One request the fake answered.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Recorded {
    pub(crate) method: Method,
    /// The path, without the query.
    pub(crate) path: String,
    pub(crate) query: String,
    /// The body, as JSON (`Null` when empty).
    pub(crate) body: Value,
    /// The answer's status code (200 for a watch).
    pub(crate) status: u16,
}

impl Recorded {
    /// Whether the request can change what the apiserver stores.
    pub(crate) fn is_write(&self) -> bool {
        self.method != Method::GET
    }

    /// `METHOD path`, for assertion messages.
    pub(crate) fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    /// `METHOD path?query -> status body`, for a look at everything.
    pub(crate) fn dump(&self) -> String {
        format!(
            "{} {}?{} -> {} {}",
            self.method, self.path, self.query, self.status, self.body
        )
    }
}

/// A kind the fake serves.
#[derive(Clone, Debug)]
struct Kind {
    resource: ApiResource,
    namespaced: bool,
}

impl Kind {
    /// `api/v1` or `apis/<group>/<version>`.
    fn prefix(&self) -> String {
        if self.resource.group.is_empty() {
            format!("api/{}", self.resource.version)
        } else {
            format!("apis/{}/{}", self.resource.group, self.resource.version)
        }
    }
}

/// Where an object lives: the kind's prefix and plural, its namespace, its name.
type Key = (String, Option<String>, String);

struct Watcher {
    collection: String,
    namespace: Option<String>,
    selector: String,
    tx: mpsc::UnboundedSender<Bytes>,
}

#[derive(Default)]
struct State {
    kinds: Vec<Kind>,
    objects: BTreeMap<Key, Value>,
    revision: u64,
    uids: u64,
    requests: Vec<Recorded>,
    watchers: Vec<Watcher>,
}

/// The fake apiserver; clones share one state.
#[derive(Clone, Default)]
pub(crate) struct Fake {
    state: Arc<Mutex<State>>,
}

/// The body of a response: one chunk, or a watch's stream of events.
pub(crate) enum FakeBody {
    Once(Option<Bytes>),
    Watch(mpsc::UnboundedReceiver<Bytes>),
}

impl http_body::Body for FakeBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        match &mut *self {
            Self::Once(bytes) => Poll::Ready(bytes.take().map(|b| Ok(http_body::Frame::data(b)))),
            Self::Watch(rx) => Pin::new(rx)
                .poll_next(cx)
                .map(|next| next.map(|b| Ok(http_body::Frame::data(b)))),
        }
    }
}

fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "reason": reason, "message": message, "code": code}),
    )
}

fn not_found(what: &str) -> (u16, Value) {
    status(404, "NotFound", &format!("{what} not found"))
}

/// Whether `labels` match a selector of `k=v`, `k==v`, `k!=v`, `k` and `!k` terms.
fn selected(selector: &str, object: &Value) -> bool {
    let labels = &object["metadata"]["labels"];
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            labels[k].as_str() != Some(v)
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            labels[k].as_str() == Some(v)
        } else if let Some(k) = term.strip_prefix('!') {
            labels.get(k).is_none()
        } else {
            labels.get(term).is_some()
        }
    })
}

/// `b` merged into `a` (objects key by key, anything else replaced; `null` removes).
fn merge(a: &mut Value, b: &Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                if v.is_null() {
                    a.remove(k);
                } else {
                    merge(a.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (a, b) => *a = b.clone(),
    }
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<std::borrow::Cow<'a, str>> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// A path split into the kind's collection, namespace, name and subresource.
struct Target {
    kind: Kind,
    collection: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl State {
    fn kind_by(&self, prefix: &str, plural: &str) -> Option<Kind> {
        self.kinds
            .iter()
            .find(|k| k.prefix() == prefix && k.resource.plural == plural)
            .cloned()
    }

    fn target(&self, segments: &[&str]) -> Option<Target> {
        let (prefix, rest) = match segments {
            ["api", v, rest @ ..] => (format!("api/{v}"), rest),
            ["apis", g, v, rest @ ..] => (format!("apis/{g}/{v}"), rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
            _ => (None, rest),
        };
        let (plural, name, subresource) = match rest {
            [plural] => (*plural, None, None),
            [plural, name] => (*plural, Some(name.to_string()), None),
            [plural, name, sub] => (*plural, Some(name.to_string()), Some(sub.to_string())),
            _ => return None,
        };
        let kind = self.kind_by(&prefix, plural)?;
        Some(Target {
            collection: format!("{prefix}/{plural}"),
            namespace: namespace.filter(|_| kind.namespaced),
            kind,
            name,
            subresource,
        })
    }

    fn discovery(&self, segments: &[&str]) -> Option<Value> {
        let resources = |prefix: &str| {
            let list: Vec<Value> = self
                .kinds
                .iter()
                .filter(|k| k.prefix() == prefix)
                .map(|k| {
                    json!({"name": k.resource.plural, "singularName": "", "namespaced": k.namespaced,
                           "kind": k.resource.kind,
                           "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]})
                })
                .collect();
            json!({"kind": "APIResourceList", "apiVersion": "v1",
                   "groupVersion": prefix.trim_start_matches("api/").trim_start_matches("apis/"),
                   "resources": list})
        };
        match segments {
            ["api"] => Some(
                json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
            ),
            ["apis"] => {
                let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
                for k in self.kinds.iter().filter(|k| !k.resource.group.is_empty()) {
                    let versions = groups.entry(k.resource.group.clone()).or_default();
                    if !versions.contains(&k.resource.version) {
                        versions.push(k.resource.version.clone());
                    }
                }
                let groups: Vec<Value> = groups
                    .into_iter()
                    .map(|(g, vs)| {
                        let versions: Vec<Value> = vs
                            .iter()
                            .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                            .collect();
                        json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
                    })
                    .collect();
                Some(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
            }
            ["api", v] => Some(resources(&format!("api/{v}"))),
            ["apis", g, v] => {
                let prefix = format!("apis/{g}/{v}");
                self.kinds
                    .iter()
                    .any(|k| k.prefix() == prefix)
                    .then(|| resources(&prefix))
            }
            ["version"] => Some(json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0",
                                       "gitCommit": "", "gitTreeState": "", "buildDate": "",
                                       "goVersion": "", "compiler": "", "platform": ""})),
            _ => None,
        }
    }

    fn next_revision(&mut self) -> String {
        self.revision += 1;
        self.revision.to_string()
    }

    /// Sends `object`'s event to the watches that select it.
    fn notify(&mut self, collection: &str, event: &str, object: &Value) {
        let ns = object["metadata"]["namespace"].as_str();
        let line = serde_json::to_vec(&json!({"type": event, "object": object})).expect("json");
        let mut line = line;
        line.push(b'\n');
        self.watchers.retain(|w| !w.tx.is_closed());
        for w in &self.watchers {
            if w.collection == collection
                && (w.namespace.is_none() || w.namespace.as_deref() == ns)
                && selected(&w.selector, object)
            {
                let _ = w.tx.unbounded_send(Bytes::from(line.clone()));
            }
        }
    }

    /// Stores `object` under `key` (new: uid and creationTimestamp), with a new
    /// resourceVersion unless nothing changed; returns it as stored.
    fn store(&mut self, t: &Target, key: Key, mut object: Value) -> Value {
        let previous = self.objects.get(&key).cloned();
        object["apiVersion"] = json!(t.kind.resource.api_version);
        object["kind"] = json!(t.kind.resource.kind);
        object["metadata"]["name"] = json!(key.2);
        if let Some(ns) = &key.1 {
            object["metadata"]["namespace"] = json!(ns);
        }
        match &previous {
            Some(prev) => {
                for field in ["uid", "creationTimestamp", "resourceVersion"] {
                    object["metadata"][field] = prev["metadata"][field].clone();
                }
                if *prev == object {
                    return object;
                }
            }
            None => {
                self.uids += 1;
                object["metadata"]["uid"] = json!(format!("uid-{}", self.uids));
                // The wall clock, as an apiserver's: a hook's age is judged against it.
                object["metadata"]["creationTimestamp"] = json!(
                    k8s_openapi::jiff::Timestamp::now()
                        .round(k8s_openapi::jiff::Unit::Second)
                        .expect("round")
                        .to_string()
                );
            }
        }
        object["metadata"]["resourceVersion"] = json!(self.next_revision());
        let event = if previous.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.objects.insert(key, object.clone());
        self.notify(&t.collection, event, &object);
        object
    }

    fn remove(&mut self, t: &Target, key: &Key) -> Option<Value> {
        let mut gone = self.objects.remove(key)?;
        gone["metadata"]["resourceVersion"] = json!(self.next_revision());
        self.notify(&t.collection, "DELETED", &gone);
        Some(gone)
    }

    fn list(&self, t: &Target, selector: &str) -> Value {
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|((c, ns, _), o)| {
                *c == t.collection
                    && (t.namespace.is_none() || *ns == t.namespace)
                    && selected(selector, o)
            })
            .map(|(_, o)| o.clone())
            .collect();
        json!({"kind": format!("{}List", t.kind.resource.kind), "apiVersion": t.kind.resource.api_version,
               "metadata": {"resourceVersion": self.revision.to_string()}, "items": items})
    }

    /// Answers one request (not a watch).
    fn answer(
        &mut self,
        method: &Method,
        t: &Target,
        query: &str,
        content: &str,
        body: Value,
    ) -> (u16, Value) {
        let Some(name) = t.name.clone().or_else(|| {
            (*method == Method::POST)
                .then(|| body["metadata"]["name"].as_str().map(str::to_string))
                .flatten()
        }) else {
            return match *method {
                Method::GET => (
                    200,
                    self.list(t, &query_param(query, "labelSelector").unwrap_or_default()),
                ),
                _ => status(405, "MethodNotAllowed", "collection writes are not served"),
            };
        };
        let key = (t.collection.clone(), t.namespace.clone(), name.clone());
        let what = format!("{} {name}", t.kind.resource.plural);
        let existing = self.objects.get(&key).cloned();
        match (method.clone(), existing) {
            (Method::GET, Some(o)) => (200, o),
            (Method::GET, None) => not_found(&what),
            (Method::POST, Some(_)) => {
                status(409, "AlreadyExists", &format!("{what} already exists"))
            }
            (Method::POST, None) => (201, self.store(t, key, body)),
            (Method::PUT, Some(_)) => (200, self.store(t, key, body)),
            (Method::PATCH, existing) => {
                let apply = content.starts_with("application/apply-patch");
                let mut object = match existing {
                    Some(o) => o,
                    None if apply && t.subresource.is_none() => json!({"metadata": {}}),
                    None => return not_found(&what),
                };
                if content.starts_with("application/json-patch") {
                    // A test for `null` passes on an absent field, as the apiserver's does.
                    let mut body = body;
                    if let Some(ops) = body.as_array_mut() {
                        ops.retain(|op| {
                            !(op["op"] == "test"
                                && op["value"].is_null()
                                && op["path"]
                                    .as_str()
                                    .and_then(|p| object.pointer(p))
                                    .is_none_or(Value::is_null))
                        });
                    }
                    let Ok(patch) = serde_json::from_value::<json_patch::Patch>(body) else {
                        return status(400, "BadRequest", "not a JSON patch");
                    };
                    if json_patch::patch(&mut object, &patch).is_err() {
                        return status(422, "Invalid", "the JSON patch does not apply");
                    }
                } else if t.subresource.as_deref() == Some("status") {
                    merge(&mut object["status"], &body["status"]);
                } else {
                    let mut body = body;
                    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                        meta.remove("resourceVersion");
                    }
                    merge(&mut object, &body);
                }
                let released = object["metadata"]["deletionTimestamp"].is_string()
                    && object["metadata"]["finalizers"]
                        .as_array()
                        .is_none_or(Vec::is_empty);
                let stored = self.store(t, key.clone(), object);
                if released {
                    self.remove(t, &key);
                }
                (200, stored)
            }
            (Method::DELETE, Some(o)) => {
                let uid = body["preconditions"]["uid"].as_str();
                if uid.is_some_and(|u| Some(u) != o["metadata"]["uid"].as_str()) {
                    return status(409, "Conflict", "Precondition failed: UID in precondition");
                }
                let finalizers = o["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty());
                if finalizers {
                    let mut marked = o;
                    marked["metadata"]["deletionTimestamp"] = json!(
                        k8s_openapi::jiff::Timestamp::now()
                            .round(k8s_openapi::jiff::Unit::Second)
                            .expect("round")
                            .to_string()
                    );
                    return (200, self.store(t, key, marked));
                }
                (200, self.remove(t, &key).expect("present"))
            }
            (_, None) => not_found(&what),
            _ => status(405, "MethodNotAllowed", "not served"),
        }
    }
}

impl Fake {
    /// A fake serving `kinds` (namespaced or not).
    pub(crate) fn new(kinds: &[(ApiResource, bool)]) -> Self {
        let fake = Self::default();
        fake.state.lock().expect("fake").kinds = kinds
            .iter()
            .map(|(resource, namespaced)| Kind {
                resource: resource.clone(),
                namespaced: *namespaced,
            })
            .collect();
        fake
    }

    /// A client of this fake with default namespace `default`.
    pub(crate) fn client(&self, default: &str) -> Client {
        let fake = self.clone();
        let service = tower::service_fn(move |req: Request<kube::client::Body>| {
            let fake = fake.clone();
            async move { Ok::<_, Infallible>(fake.serve(req).await) }
        });
        Client::new(service, default)
    }

    async fn serve(&self, req: Request<kube::client::Body>) -> Response<FakeBody> {
        let (parts, body) = req.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().unwrap_or_default().to_string();
        let content = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let mut state = self.state.lock().expect("fake");
        state.requests.push(Recorded {
            method: parts.method.clone(),
            path: path.clone(),
            query: query.clone(),
            body: body.clone(),
            status: 200,
        });
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let (code, answer) = if parts.method == Method::GET
            && let Some(found) = state.discovery(&segments)
        {
            (200, found)
        } else if let Some(t) = state.target(&segments) {
            if parts.method == Method::GET
                && t.name.is_none()
                && query_param(&query, "watch").is_some_and(|w| w == "true" || w == "1")
            {
                return state.watch(&t, &query);
            }
            state.answer(&parts.method, &t, &query, &content, body)
        } else {
            not_found(&path)
        };
        if let Some(last) = state.requests.last_mut() {
            last.status = code;
        }
        let bytes = serde_json::to_vec(&answer).expect("json");
        Response::builder()
            .status(StatusCode::from_u16(code).expect("status"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(FakeBody::Once(Some(Bytes::from(bytes))))
            .expect("response")
    }

    /// Every request so far.
    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.state.lock().expect("fake").requests.clone()
    }

    /// The writes (any request but a GET) since request number `from`.
    pub(crate) fn writes_since(&self, from: usize) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .skip(from)
            .filter(Recorded::is_write)
            .collect()
    }

    /// How many requests were made so far (a mark for [`writes_since`](Self::writes_since)).
    pub(crate) fn mark(&self) -> usize {
        self.state.lock().expect("fake").requests.len()
    }

    fn target_of(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> (Target, Key) {
        let state = self.state.lock().expect("fake");
        let k = state
            .kinds
            .iter()
            .find(|k| k.resource.api_version == api_version && k.resource.kind == kind)
            .unwrap_or_else(|| panic!("the fake does not serve {api_version} {kind}"))
            .clone();
        let collection = format!("{}/{}", k.prefix(), k.resource.plural);
        let namespace = namespace.filter(|_| k.namespaced).map(str::to_string);
        let key = (collection.clone(), namespace.clone(), name.to_string());
        (
            Target {
                kind: k,
                collection,
                namespace,
                name: Some(name.to_string()),
                subresource: None,
            },
            key,
        )
    }

    /// Stores `object` as somebody else would (its apiVersion, kind, namespace and name say
    /// where); returns it as stored.
    pub(crate) fn put(&self, object: Value) -> Value {
        let m = &object["metadata"];
        let (t, key) = self.target_of(
            object["apiVersion"].as_str().expect("apiVersion"),
            object["kind"].as_str().expect("kind"),
            m["namespace"].as_str(),
            m["name"].as_str().expect("name"),
        );
        self.state.lock().expect("fake").store(&t, key, object)
    }

    /// The stored object, if any.
    pub(crate) fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let (_, key) = self.target_of(api_version, kind, namespace, name);
        self.state.lock().expect("fake").objects.get(&key).cloned()
    }

    /// Removes the object as somebody else would.
    pub(crate) fn delete(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) {
        let (t, key) = self.target_of(api_version, kind, namespace, name);
        self.state.lock().expect("fake").remove(&t, &key);
    }
}

impl State {
    /// A watch from the request's resourceVersion: changes stored after it first, then every
    /// change as it happens.
    fn watch(&mut self, t: &Target, query: &str) -> Response<FakeBody> {
        let (tx, rx) = mpsc::unbounded();
        let selector = query_param(query, "labelSelector")
            .unwrap_or_default()
            .to_string();
        let since: u64 = query_param(query, "resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        for ((c, ns, _), o) in &self.objects {
            let rv: u64 = o["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if *c == t.collection
                && (t.namespace.is_none() || *ns == t.namespace)
                && rv > since
                && selected(&selector, o)
            {
                let mut line =
                    serde_json::to_vec(&json!({"type": "MODIFIED", "object": o})).expect("json");
                line.push(b'\n');
                let _ = tx.unbounded_send(Bytes::from(line));
            }
        }
        self.watchers.push(Watcher {
            collection: t.collection.clone(),
            namespace: t.namespace.clone(),
            selector,
            tx,
        });
        Response::builder()
            .status(200)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(FakeBody::Watch(rx))
            .expect("response")
    }
}
