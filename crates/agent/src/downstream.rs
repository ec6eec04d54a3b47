//! Downstream API access: discovery of each manifest's resource (cached) and dynamic APIs.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::{self, Scope};
use tender_runtime::ObjectKey;
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
