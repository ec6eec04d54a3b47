//! Downstream API access: discovery of each manifest's resource (cached) and dynamic APIs.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::{self, Scope};
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
            .map_err(|e| Error::kube(format!("discovering {api_version} {kind} downstream"), e))?;
        let found = (resource, caps.scope == Scope::Namespaced);
        self.cache
            .lock()
            .expect("discovery cache")
            .insert(cache_key, found.clone());
        Ok(found)
    }

    /// A dynamic API for the object `key` (namespaced or cluster-wide as discovered).
    pub(crate) async fn api(&self, key: &ObjectRef) -> Result<(Api<DynamicObject>, ApiResource)> {
        let (resource, namespaced) = self.resolve(&key.api_version, &key.kind).await?;
        let api = match (&key.namespace, namespaced) {
            (Some(ns), true) => Api::namespaced_with(self.client.clone(), ns, &resource),
            _ => Api::all_with(self.client.clone(), &resource),
        };
        Ok((api, resource))
    }
}
