//! What a request asks for: the object key and target a path names, its query parameters,
//! label and field selectors, and the `Status` body an error answers with.

use std::collections::BTreeMap;

use kube::api::ApiResource;
use serde_json::{Value, json};

/// The key objects are held under.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    /// `v1` or `group/version`.
    pub(super) api_version: String,
    pub(super) plural: String,
    pub(super) namespace: Option<String>,
    pub(super) name: String,
}

impl Key {
    pub(super) fn of(resource: &ApiResource, namespace: Option<&str>, name: &str) -> Self {
        Self {
            api_version: resource.api_version.clone(),
            plural: resource.plural.clone(),
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }
}

/// Where a request goes: a collection, an object or an object's subresource.
#[derive(Debug)]
pub(super) struct Target {
    pub(super) api_version: String,
    pub(super) plural: String,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    pub(super) subresource: Option<String>,
}

impl Target {
    pub(super) fn parse(path: &str) -> Option<Self> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (api_version, mut rest) = match *segments.first()? {
            "api" => (segments.get(1)?.to_string(), &segments[2..]),
            "apis" => (
                format!("{}/{}", segments.get(1)?, segments.get(2)?),
                segments.get(3..)?,
            ),
            _ => return None,
        };
        let mut namespace = None;
        // `/api/v1/namespaces/x/status` is the Namespace's status, not a resource "status".
        if rest.len() >= 3 && rest[0] == "namespaces" && !(rest.len() == 3 && rest[2] == "status") {
            namespace = Some(rest[1].to_string());
            rest = &rest[2..];
        }
        Some(Self {
            api_version,
            plural: rest.first()?.to_string(),
            namespace,
            name: rest.get(1).map(|s| s.to_string()),
            subresource: rest.get(2).map(|s| s.to_string()),
        })
    }

    pub(super) fn key(&self, name: &str) -> Key {
        Key {
            api_version: self.api_version.clone(),
            plural: self.plural.clone(),
            namespace: self.namespace.clone(),
            name: name.to_string(),
        }
    }

    pub(super) fn is_status(&self) -> bool {
        self.subresource.as_deref() == Some("status")
    }
}

/// A `Status` body like the apiserver's.
pub(super) fn status(code: u16, message: &str) -> Value {
    let reason = match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    };
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// The query's parameters, decoded.
pub(super) fn query_params(query: &str) -> BTreeMap<String, String> {
    form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect()
}

/// `k=v`, `k==v`, `k!=v`, `k` and `!k`, comma-separated (all must hold).
pub(super) fn selects_labels(selector: &str, object: &Value) -> bool {
    let labels = &object["metadata"]["labels"];
    selector
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .all(|term| {
            if let Some((k, v)) = term.split_once("!=") {
                labels[k.trim()].as_str() != Some(v.trim())
            } else if let Some((k, v)) = term.split_once('=') {
                labels[k.trim()].as_str() == Some(v.trim_start_matches('=').trim())
            } else if let Some(k) = term.strip_prefix('!') {
                labels.get(k.trim()).is_none()
            } else {
                labels.get(term).is_some()
            }
        })
}

/// `metadata.name=x` and `metadata.namespace=y`, comma-separated.
pub(super) fn selects_fields(selector: &str, object: &Value) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let (field, wanted, equal) = match term.split_once("!=") {
            Some((f, w)) => (f, w, false),
            None => {
                let (f, w) = term.split_once('=').unwrap_or((term, ""));
                (f, w.trim_start_matches('='), true)
            }
        };
        let value = match field {
            "metadata.name" => object["metadata"]["name"].as_str(),
            "metadata.namespace" => object["metadata"]["namespace"].as_str(),
            _ => return true,
        };
        (value == Some(wanted)) == equal
    })
}
