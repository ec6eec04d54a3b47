//! Downstream API access: discovery of each manifest's resource (cached) and dynamic APIs.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::{self, Scope};
use tender_runtime::reconcile::error_text;
use tender_runtime::{ObjectKey, ReconcileError};
use tender_types::ObjectRef;

use crate::{Error, Result};

/// The downstream client plus a cache of discovered resources.
pub(crate) struct Downstream {
    pub(crate) client: Client,
    cache: Mutex<HashMap<(String, String), (ApiResource, bool)>>,
}

impl Downstream {
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The API resource of `apiVersion`/`kind` and whether it is namespaced. Cached after the
    /// first success; unknown kinds are asked again next time (a CRD may appear).
    pub(crate) async fn resolve(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<(ApiResource, bool)> {
        let cache_key = (api_version.to_string(), kind.to_string());
        if let Some(hit) = self.cache.lock().expect("discovery cache").get(&cache_key) {
            return Ok(hit.clone());
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| {
                Error::kube(
                    format!("discover {api_version} {kind} downstream"),
                    false,
                    e,
                )
            })?;
        let found = (resource, caps.scope == Scope::Namespaced);
        self.cache
            .lock()
            .expect("discovery cache")
            .insert(cache_key, found.clone());
        Ok(found)
    }

    /// Drops the cached resource of `apiVersion`/`kind`, so the next [`resolve`](Self::resolve)
    /// asks discovery again: after a 404 on a write, its CRD may have been removed.
    pub(crate) fn forget(&self, api_version: &str, kind: &str) {
        self.cache
            .lock()
            .expect("discovery cache")
            .remove(&(api_version.to_string(), kind.to_string()));
    }

    /// The executor's key of object `r` and a dynamic API to read it (namespaced or
    /// cluster-wide as discovered).
    pub(crate) async fn locate(&self, r: &ObjectRef) -> Result<(ObjectKey, Api<DynamicObject>)> {
        let (resource, namespaced) = self.resolve(&r.api_version, &r.kind).await?;
        let namespace = r.namespace.as_deref().filter(|_| namespaced);
        let api = match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        };
        Ok((ObjectKey::dynamic(resource, namespace, &r.name), api))
    }
}

/// Whether a discovery failure says the cluster does not serve the kind (its group/version
/// answers 404, or lists no such kind), rather than that discovery could not be asked.
pub(crate) fn not_installed(error: &Error) -> bool {
    match error {
        Error::Kube { source, .. } => {
            matches!(
                source,
                kube::Error::Api(s) if s.code == 404
            ) || matches!(
                source,
                kube::Error::Discovery(
                    kube::error::DiscoveryError::MissingKind(_)
                        | kube::error::DiscoveryError::MissingResource(_)
                )
            )
        }
        _ => false,
    }
}

/// The status message for a kind that could not be resolved: `KindNotInstalled: …` when the
/// cluster does not serve it, else why discovery failed.
pub(crate) fn unresolved(api_version: &str, kind: &str, error: &Error) -> String {
    if not_installed(error) {
        format!(
            "{}: {api_version} {kind} is not served by this cluster (install its CRD here)",
            tender_types::conditions::reason::KIND_NOT_INSTALLED
        )
    } else {
        message(error)
    }
}

/// An error as a status message: the apiserver's reason and message (never its message about
/// a Secret, which [`ReconcileError`] already dropped), not the client's debug dump.
pub(crate) fn message(error: &ReconcileError) -> String {
    match error {
        // An RBAC refusal names its code too: it is the Bundle ServiceAccount's (or the
        // agent's) rights that stopped the write, which the owner changes, not the author.
        ReconcileError::Kube {
            action,
            source: kube::Error::Api(s),
        } if s.code == 403 => format!("cannot {action}: {} ({}): {}", s.reason, s.code, s.message),
        ReconcileError::Kube { action, source } => {
            format!("cannot {action}: {}", error_text(source, false))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status {
                code,
                reason: "NotFound".into(),
                message: "the server could not find the requested resource".into(),
                ..Default::default()
            }
            .boxed(),
        )
    }

    #[test]
    fn only_a_missing_api_is_kind_not_installed() {
        let missing_group = Error::kube("discover", false, api(404));
        let missing_kind = Error::kube(
            "discover",
            false,
            kube::Error::Discovery(kube::error::DiscoveryError::MissingKind("Widget".into())),
        );
        for e in [&missing_group, &missing_kind] {
            let m = unresolved("example.com/v1", "Widget", e);
            assert!(
                m.starts_with("KindNotInstalled: example.com/v1 Widget"),
                "{m}"
            );
        }
        // The apiserver failing or refusing is not a verdict on the kind.
        for code in [403, 500, 503] {
            let e = Error::kube("discover", false, api(code));
            assert!(!not_installed(&e), "{code}");
            assert!(!unresolved("example.com/v1", "Widget", &e).starts_with("KindNotInstalled"));
        }
    }
}
