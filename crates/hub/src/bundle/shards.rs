//! A Bundle's shard bookkeeping (decision 0062-hub-shards): the unsharded replica drops the
//! cleanup finalizers of shards that no longer serve a Cluster. Pure.

use std::collections::BTreeSet;

use kube::ResourceExt;
use tender_runtime::executor::{ObjectKey, Op};
use tender_types::{Bundle, labels};

/// The unsharded replica's removal of the cleanup finalizers of shards that serve no Cluster
/// of the Bundle's workspace (`serving`: the shard ids Clusters are labelled with), so a
/// retired shard never holds a Bundle's deletion forever; none when there are none. A shard
/// without Clusters has no BundleDeployments to remove (a moved Cluster's are adopted).
pub(crate) fn stale_shard_finalizers(bundle: &Bundle, serving: &BTreeSet<String>) -> Option<Op> {
    let prefix = format!("{}-", labels::BUNDLE_CLEANUP_FINALIZER);
    let stale = |f: &String| {
        f.strip_prefix(&prefix)
            .is_some_and(|id| !serving.contains(id))
    };
    if !bundle.finalizers().iter().any(stale) {
        return None;
    }
    let kept: Vec<&String> = bundle.finalizers().iter().filter(|f| !stale(f)).collect();
    // resourceVersion makes this a compare-and-swap: a concurrent change fails and retries.
    Some(Op::MergePatch {
        key: ObjectKey::of::<Bundle>(bundle.namespace().as_deref(), &bundle.name_any()),
        patch: serde_json::json!({
            "metadata": {"finalizers": kept, "resourceVersion": bundle.resource_version()}
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_finalizers_of_shards_without_clusters_are_removed() {
        let mut b = Bundle::new("app", Default::default());
        b.metadata.namespace = Some("ws".into());
        b.metadata.resource_version = Some("7".into());
        b.metadata.finalizers = Some(vec![
            labels::BUNDLE_CLEANUP_FINALIZER.into(),
            labels::bundle_cleanup_finalizer(Some("a")),
            labels::bundle_cleanup_finalizer(Some("gone")),
            "example.com/other".into(),
        ]);
        let serving = BTreeSet::from(["a".to_string()]);
        let Some(Op::MergePatch { patch, .. }) = stale_shard_finalizers(&b, &serving) else {
            panic!("expected a patch");
        };
        assert_eq!(
            patch["metadata"]["finalizers"],
            serde_json::json!([
                labels::BUNDLE_CLEANUP_FINALIZER,
                labels::bundle_cleanup_finalizer(Some("a")),
                "example.com/other"
            ])
        );
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        // Every shard still serves a Cluster: nothing to do.
        let all = BTreeSet::from(["a".to_string(), "gone".to_string()]);
        assert!(stale_shard_finalizers(&b, &all).is_none());
    }
}
