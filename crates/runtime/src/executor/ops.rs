//! The operations a plan returns: plain values, no I/O, so plans are tested by comparing lists.

use std::fmt;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::events::EventType;
use serde_json::Value;

/// A typed reference to one object: its API resource, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    /// Group, version, kind and plural of the object.
    pub resource: ApiResource,
    /// Namespace; `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

impl ObjectKey {
    /// The key of a statically typed object `K` (Secret, BundleDeployment, ...).
    pub fn of<K: Resource<DynamicType = ()>>(namespace: Option<&str>, name: &str) -> Self {
        Self {
            resource: ApiResource::erase::<K>(&()),
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }

    /// The key of an object of a kind found by discovery.
    pub fn dynamic(resource: ApiResource, namespace: Option<&str>, name: &str) -> Self {
        Self {
            resource,
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }

    /// Whether this is a core Secret: errors about it never quote the apiserver's message,
    /// which may echo a value.
    pub fn is_secret(&self) -> bool {
        self.resource.group.is_empty() && self.resource.kind == "Secret"
    }

    /// The object's kind.
    pub fn kind(&self) -> &str {
        &self.resource.kind
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.resource.kind, self.name),
            None => write!(f, "{} {}", self.resource.kind, self.name),
        }
    }
}

/// What a plan last saw of an object and what it wants written, so the executor can skip a
/// write it already made while the cache has not caught up (see [`crate::executor::WriteMemo`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    /// The cached object's resourceVersion the plan decided on (`None`: not cached).
    pub live_version: Option<String>,
    /// A hash of the desired content.
    pub desired: String,
}

/// Server-side apply of a whole object with the executor's field manager (forced).
#[derive(Clone, Debug, PartialEq)]
pub struct Apply {
    /// The object written.
    pub key: ObjectKey,
    /// The full object, `apiVersion`, `kind` and `metadata.name` included.
    pub body: Value,
    /// A 422 (an immutable field changed, e.g. an immutable Secret's data or a Secret's type)
    /// is answered by deleting the object and creating it again.
    pub replace_if_immutable: bool,
    /// Skip the write when the executor made the same one over the same cached version.
    pub fingerprint: Option<Fingerprint>,
}

/// One thing a reconciler wants done; the executor carries it out.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Server-side apply.
    Apply(Apply),
    /// Server-side apply to the status subresource: `body` holds `apiVersion`, `kind` and
    /// `status`.
    ApplyStatus(Apply),
    /// Create the object unless it exists (an existing one is left as it is). Needs only the
    /// `create` verb, where an apply needs `patch` too: for objects a narrow identity may make
    /// but must not change, such as namespaces.
    Create {
        /// The object created.
        key: ObjectKey,
        /// The full object, `apiVersion`, `kind` and `metadata.name` included.
        body: Value,
    },
    /// JSON merge patch (e.g. removing keys another field manager added); an object already
    /// gone is left alone.
    MergePatch {
        /// The object patched.
        key: ObjectKey,
        /// The merge patch.
        patch: Value,
    },
    /// Delete; with `uid`, only that incarnation (a newer object of the same name is kept).
    /// An object already gone is success.
    Delete {
        /// The object deleted.
        key: ObjectKey,
        /// Precondition on the object's uid.
        uid: Option<String>,
    },
    /// Delete the incarnation `uid`, wait until it is gone, then apply: for changes the
    /// apiserver refuses in place.
    Recreate {
        /// Precondition on the deleted object's uid.
        uid: Option<String>,
        /// What is created afterwards.
        apply: Apply,
    },
    /// Publish a Kubernetes Event (failures are logged, never fatal).
    Event(EventOp),
}

/// A Kubernetes Event about one object.
#[derive(Clone, Debug, PartialEq)]
pub struct EventOp {
    /// The object the event is about.
    pub regarding: ObjectReference,
    /// Normal or Warning.
    pub type_: EventType,
    /// CamelCase reason.
    pub reason: String,
    /// CamelCase action.
    pub action: String,
    /// Human-readable note (never Secret data); cut to the 1 kB Kubernetes allows.
    pub note: String,
}

impl Op {
    /// The object this operation writes (`None` for events).
    pub fn key(&self) -> Option<&ObjectKey> {
        match self {
            Op::Apply(a) | Op::ApplyStatus(a) | Op::Recreate { apply: a, .. } => Some(&a.key),
            Op::Create { key, .. } | Op::MergePatch { key, .. } | Op::Delete { key, .. } => {
                Some(key)
            }
            Op::Event(_) => None,
        }
    }

    /// Short verb for logs and metrics.
    pub fn verb(&self) -> &'static str {
        match self {
            Op::Apply(_) => "apply",
            Op::ApplyStatus(_) => "status",
            Op::Create { .. } => "create",
            Op::MergePatch { .. } => "patch",
            Op::Delete { .. } => "delete",
            Op::Recreate { .. } => "recreate",
            Op::Event(_) => "event",
        }
    }
}

/// What carrying out one operation came to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// The request was made (false: skipped by the memo, or the object was already gone).
    pub wrote: bool,
    /// uid of the object after the operation (from the response or the memo), when known.
    pub uid: Option<String>,
    /// The object as the apiserver returned it, for applies and patches that wrote (kept as
    /// the client decoded it: converting every response to JSON would cost each write).
    pub object: Option<DynamicObject>,
}
