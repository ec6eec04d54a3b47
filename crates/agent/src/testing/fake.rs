//! The shared fake apiserver ([`FakeApiserver`], `tender_runtime::fake`) with what the agent
//! also asks of an apiserver: discovery of the kinds it is told about, and watches.
//!
//! Requests go to the shared fake, which stores the objects and records the requests; this
//! layer answers discovery and `watch=true` itself (neither is recorded: they are reads) and
//! turns every change into watch events — a write answered by the fake (an object whose
//! resourceVersion moved) or a test's own change through [`Fake::put`] and [`Fake::delete`].
//! A watch starts with the changes after its resourceVersion, then follows.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use futures::channel::mpsc;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use kube::Client;
use kube::api::ApiResource;
use serde_json::{Value, json};
use tender_runtime::fake::{FakeApiserver, Recorded};
use tower::ServiceExt;

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

struct Watcher {
    api_version: String,
    kind: String,
    namespace: Option<String>,
    selector: String,
    tx: mpsc::UnboundedSender<Bytes>,
}

#[derive(Default)]
struct Watches {
    open: Vec<Watcher>,
    /// The resourceVersion each object was last announced at, by (apiVersion, kind,
    /// namespace, name).
    announced: HashMap<(String, String, Option<String>, String), String>,
}

/// The fake apiserver of one cluster; clones share it.
#[derive(Clone)]
pub(crate) struct Fake {
    pub(crate) store: FakeApiserver,
    kinds: Arc<Vec<Kind>>,
    watches: Arc<Mutex<Watches>>,
}

/// A response body: one chunk, or a watch's events as they come.
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

/// Whether `object`'s labels match a selector of `k=v`, `k==v`, `k!=v`, `k` and `!k` terms.
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

fn query_param(query: &str, name: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).expect("json");
    line.push(b'\n');
    Bytes::from(line)
}

fn json_response(code: u16, body: &Value) -> Response<FakeBody> {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(FakeBody::Once(Some(Bytes::from(
            serde_json::to_vec(body).expect("json"),
        ))))
        .expect("response")
}

impl Fake {
    /// A fake serving `kinds` (each namespaced or not).
    pub(crate) fn new(kinds: &[(ApiResource, bool)]) -> Self {
        Self {
            store: FakeApiserver::new(),
            kinds: Arc::new(
                kinds
                    .iter()
                    .map(|(resource, namespaced)| Kind {
                        resource: resource.clone(),
                        namespaced: *namespaced,
                    })
                    .collect(),
            ),
            watches: Arc::default(),
        }
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

    fn kind(&self, api_version: &str, kind: &str) -> &Kind {
        self.kinds
            .iter()
            .find(|k| k.resource.api_version == api_version && k.resource.kind == kind)
            .unwrap_or_else(|| panic!("the fake does not serve {api_version} {kind}"))
    }

    /// The kind and namespace a collection path (`.../<plural>`) names.
    fn collection(&self, segments: &[&str]) -> Option<(Kind, Option<String>)> {
        let (prefix, rest) = match segments {
            ["api", v, rest @ ..] => (format!("api/{v}"), rest),
            ["apis", g, v, rest @ ..] => (format!("apis/{g}/{v}"), rest),
            _ => return None,
        };
        let (namespace, plural) = match rest {
            ["namespaces", ns, plural] => (Some(ns.to_string()), *plural),
            [plural] => (None, *plural),
            _ => return None,
        };
        let kind = self
            .kinds
            .iter()
            .find(|k| k.prefix() == prefix && k.resource.plural == plural)?
            .clone();
        Some((kind, namespace))
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
            let group_version = prefix
                .strip_prefix("apis/")
                .or_else(|| prefix.strip_prefix("api/"))
                .unwrap_or(prefix);
            json!({"kind": "APIResourceList", "apiVersion": "v1",
                   "groupVersion": group_version, "resources": list})
        };
        match segments {
            ["api"] => Some(json!({"kind": "APIVersions", "versions": ["v1"],
                                   "serverAddressByClientCIDRs": []})),
            ["apis"] => {
                let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
                for k in self.kinds.iter().filter(|k| !k.resource.group.is_empty()) {
                    let versions = groups.entry(&k.resource.group).or_default();
                    if !versions.contains(&k.resource.version.as_str()) {
                        versions.push(&k.resource.version);
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
            _ => None,
        }
    }

    async fn serve(&self, req: Request<kube::client::Body>) -> Response<FakeBody> {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().unwrap_or_default().to_string();
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        if parts.method == Method::GET {
            if let Some(found) = self.discovery(&segments) {
                return json_response(200, &found);
            }
            if query_param(&query, "watch").is_some_and(|w| w == "true" || w == "1")
                && let Some((kind, namespace)) = self.collection(&segments)
            {
                return self.watch(&kind, namespace, &query);
            }
        }
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let method = parts.method.clone();
        let forwarded = Request::from_parts(parts, kube::client::Body::from(bytes));
        let response = self
            .store
            .clone()
            .oneshot(forwarded)
            .await
            .expect("the fake answers");
        let (parts, body) = response.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if method != Method::GET && parts.status.is_success() {
            let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            self.announce(&answer);
        }
        Response::from_parts(parts, FakeBody::Once(Some(bytes)))
    }

    /// Sends watch events for `object` (as the fake answered a write with it) when its
    /// resourceVersion moved or it is gone.
    fn announce(&self, object: &Value) {
        let (Some(api_version), Some(kind), Some(name)) = (
            object["apiVersion"].as_str(),
            object["kind"].as_str(),
            object["metadata"]["name"].as_str(),
        ) else {
            return;
        };
        if !self
            .kinds
            .iter()
            .any(|k| k.resource.api_version == api_version && k.resource.kind == kind)
        {
            return;
        }
        let namespace = object["metadata"]["namespace"].as_str();
        let resource = &self.kind(api_version, kind).resource;
        let stored = self.store.get(resource, namespace, name);
        let id = (
            api_version.to_string(),
            kind.to_string(),
            namespace.map(str::to_string),
            name.to_string(),
        );
        let mut watches = self.watches.lock().expect("watches");
        let (event, shown) = match &stored {
            None => match watches.announced.remove(&id) {
                Some(_) => ("DELETED", object),
                None => return,
            },
            Some(now) => {
                let rv = now["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default();
                match watches.announced.insert(id, rv.to_string()) {
                    Some(before) if before == rv => return,
                    Some(_) => ("MODIFIED", now),
                    None => ("ADDED", now),
                }
            }
        };
        watches.open.retain(|w| !w.tx.is_closed());
        for w in &watches.open {
            if w.api_version == api_version
                && w.kind == kind
                && (w.namespace.is_none() || w.namespace.as_deref() == namespace)
                && selected(&w.selector, shown)
            {
                let _ = w.tx.unbounded_send(event_line(event, shown));
            }
        }
    }

    /// A watch from the request's resourceVersion: the objects stored after it first, then
    /// every change as it happens.
    fn watch(&self, kind: &Kind, namespace: Option<String>, query: &str) -> Response<FakeBody> {
        let (tx, rx) = mpsc::unbounded();
        let selector = query_param(query, "labelSelector").unwrap_or_default();
        let since: u64 = query_param(query, "resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let rv_of = |o: &Value| -> u64 {
            o["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let mut watches = self.watches.lock().expect("watches");
        for o in self.store.list(&kind.resource) {
            let id = (
                kind.resource.api_version.clone(),
                kind.resource.kind.clone(),
                o["metadata"]["namespace"].as_str().map(str::to_string),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
            watches.announced.entry(id).or_insert_with(|| {
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            });
            if (namespace.is_none() || o["metadata"]["namespace"].as_str() == namespace.as_deref())
                && rv_of(&o) > since
                && selected(&selector, &o)
            {
                let _ = tx.unbounded_send(event_line("MODIFIED", &o));
            }
        }
        watches.open.push(Watcher {
            api_version: kind.resource.api_version.clone(),
            kind: kind.resource.kind.clone(),
            namespace,
            selector,
            tx,
        });
        Response::builder()
            .status(200)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(FakeBody::Watch(rx))
            .expect("response")
    }

    // --- what a test does and reads ---

    /// Stores `object` as somebody else would (its apiVersion, kind, namespace and name say
    /// where); returns it as stored. Not recorded; watches see it.
    pub(crate) fn put(&self, object: Value) -> Value {
        let kind = self.kind(
            object["apiVersion"].as_str().expect("apiVersion"),
            object["kind"].as_str().expect("kind"),
        );
        let stored = self.store.insert(&kind.resource, object);
        self.announce(&stored);
        stored
    }

    /// The stored object, if any.
    pub(crate) fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let kind = self.kind(api_version, kind);
        self.store.get(&kind.resource, namespace, name)
    }

    /// Every request so far.
    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.store.requests()
    }

    /// How many requests were made so far (a mark for [`writes_since`](Self::writes_since)).
    pub(crate) fn mark(&self) -> usize {
        self.store.requests().len()
    }

    /// The writes since request number `from`.
    pub(crate) fn writes_since(&self, from: usize) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .skip(from)
            .filter(Recorded::is_write)
            .collect()
    }
}
