//! Downstream namespaces for fan-out (`targetNamespaces`, `targetNamespaceSelector`): one
//! metadata reflector, whose changes wake the BundleDeployments that fan out.

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::ResourceExt;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef as KubeRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use tender_types::BundleDeployment;

/// An empty namespace cache and the writer [`feed`] fills it with.
pub(crate) fn store() -> (
    Store<PartialObjectMeta<Namespace>>,
    Writer<PartialObjectMeta<Namespace>>,
) {
    reflector::store()
}

/// Whether `bd` fans out over namespaces.
pub(crate) fn fans_out(bd: &BundleDeployment) -> bool {
    let o = &bd.spec.options;
    o.target_namespace_selector.is_some() || !o.target_namespaces.is_empty()
}

/// Reflects downstream namespaces (metadata only); after the initial list, every change
/// (created, relabelled, being deleted, deleted) triggers the BundleDeployments that fan out.
pub(crate) async fn feed(
    downstream: Client,
    writer: Writer<PartialObjectMeta<Namespace>>,
    bds: Store<BundleDeployment>,
    trigger: UnboundedSender<KubeRef<BundleDeployment>>,
) {
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(downstream);
    let mut stream = reflector::reflector(
        writer,
        tender_runtime::watch::watcher(api, watcher::Config::default()),
    )
    .default_backoff()
    .boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                for bd in bds.state().iter().filter(|bd| fans_out(bd)) {
                    let r =
                        KubeRef::new(&bd.name_any()).within(&bd.namespace().unwrap_or_default());
                    let _ = trigger.unbounded_send(r);
                }
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "watching downstream namespaces failed; retrying with backoff");
            }
        }
    }
}
