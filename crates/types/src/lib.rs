//! tender's API types and the pure rules shared by hub, agent, CLI and tests.
//!
//! Nothing in this crate performs I/O: CRD types (`Cluster`, `ClusterGroup`, `Bundle`,
//! `BundleDeployment`, `HelmOp`), the one home of every label, annotation, finalizer and name rule, content
//! hashing, target matching, namespace resolution, condition bookkeeping and the feature gate.

pub mod bundle;
pub mod bundle_deployment;
pub mod chart_version;
pub mod cluster;
pub mod cluster_group;
pub mod conditions;
pub mod copy;
pub mod customize;
pub mod diff;
pub mod digest;
mod fleet_only;
pub mod gate;
pub mod hash;
pub mod helm;
pub mod helmop;
pub mod labels;
mod manifest;
pub mod names;
pub mod namespaces;
pub mod ownership;
pub mod rollout;
pub mod service_account;
pub mod signing;
pub mod targeting;
pub mod template;
pub mod upstream;
pub mod waves;

mod schema;

pub use bundle::{
    Bundle, BundleDisplay, BundleRef, BundleShardStatus, BundleSpec, BundleState, BundleStatus,
    BundleSummary, BundleTarget, CorrectDrift, DownstreamResource, FileEntry, Manifest, Resource,
    SourceKind,
};
pub use bundle_deployment::{
    BundleDeployment, BundleDeploymentDisplay, BundleDeploymentOptions, BundleDeploymentSpec,
    BundleDeploymentStatus, CopiedResource, ObjectRef, ObjectState, ObjectStatus,
};
pub use cluster::{
    AgentStatus, Cluster, ClusterDisplay, ClusterMode, ClusterSpec, ClusterStatus,
    KubeconfigSecretRef,
};
pub use cluster_group::{ClusterGroup, ClusterGroupDisplay, ClusterGroupSpec, ClusterGroupStatus};
pub use diff::{ComparePatch, DiffOptions, PatchOperation};
pub use helm::{HelmOptions, KeyRef, Values, ValuesFrom};
pub use helmop::{HelmOp, HelmOpSpec, HelmOpStatus};
pub use upstream::{UpstreamObjectStatus, UpstreamPublication, UpstreamResource, UpstreamState};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// API group of every tender resource.
pub const API_GROUP: &str = "tender.dev";
/// API version of every tender resource.
pub const API_VERSION: &str = "v1alpha1";
/// `apiVersion` string of tender resources (`tender.dev/v1alpha1`).
pub const API_GROUP_VERSION: &str = "tender.dev/v1alpha1";

/// All tender CRDs, with the apiserver-side validation that `#[derive]` cannot express added.
///
/// This is the single source of `deploy/crds/*.yaml`; `tender crdgen` writes it out and a test
/// fails when the committed files drift from it.
pub fn crds() -> Vec<CustomResourceDefinition> {
    schema::crds()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crds_share_group_category_and_status() {
        let crds = crds();
        let names: Vec<_> = crds
            .iter()
            .filter_map(|c| c.metadata.name.as_deref())
            .collect();
        assert_eq!(
            names,
            [
                "clusters.tender.dev",
                "clustergroups.tender.dev",
                "bundles.tender.dev",
                "bundledeployments.tender.dev",
                "helmops.tender.dev"
            ]
        );
        for crd in &crds {
            assert_eq!(crd.spec.group, API_GROUP);
            assert_eq!(crd.spec.scope, "Namespaced");
            assert_eq!(
                crd.spec.names.categories.as_deref(),
                Some(&["tender".to_string()][..])
            );
            let version = &crd.spec.versions[0];
            assert_eq!(version.name, API_VERSION);
            assert!(
                version
                    .subresources
                    .as_ref()
                    .is_some_and(|s| s.status.is_some())
            );
        }
    }

    #[test]
    fn validation_rules_are_in_the_schema() {
        let bundle = serde_json::to_string(&crds()[2]).unwrap();
        for needle in [
            "!has(self.__namespace__)",
            "or a file with content (Fleet's {name, content, encoding})",
            "pollingInterval must be 0 or a valid Go duration",
            r#""x-kubernetes-list-map-keys":["kind","name"]"#,
            r#""x-kubernetes-list-map-keys":["type"]"#,
            "metadata.name of a Bundle must be a DNS label",
        ] {
            assert!(bundle.contains(needle), "{needle}");
        }
    }
}
