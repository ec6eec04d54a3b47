//! The agent's downstream RBAC as `tender cluster add` renders it — the same objects as the
//! agent chart (decision 0079-bundles-applied-as-an-impersonated-service-account): the agent
//! itself only reads, keeps its own namespace and impersonates the Bundle ServiceAccount; Bundles
//! are applied as that ServiceAccount, which gets edit-like rights in the namespaces given
//! (cluster-admin only on request).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tender_types::labels;
use tender_types::service_account::DEFAULT_BUNDLE_SERVICE_ACCOUNT;

/// What Bundles may do on the cluster: where they may write, and whether everywhere.
#[derive(Clone, Debug, Default)]
pub struct BundleAccess {
    /// Namespaces the Bundle ServiceAccount gets edit-like rights in (a RoleBinding each).
    pub namespaces: Vec<String>,
    /// Bind cluster-admin to the Bundle ServiceAccount (explicit opt-in).
    pub cluster_admin: bool,
}

const RBAC: &str = "rbac.authorization.k8s.io/v1";
const EDIT: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// The rights of the Bundle ServiceAccount in each of its namespaces: edit-like rights on
/// namespaced workloads, ConfigMaps and Secrets; no RBAC, no cluster-scoped kinds.
pub fn bundle_rules() -> Value {
    let rule = |group: &str, resources: &[&str]| json!({"apiGroups": [group], "resources": resources, "verbs": EDIT});
    json!([
        rule(
            "",
            &[
                "configmaps",
                "secrets",
                "services",
                "serviceaccounts",
                "persistentvolumeclaims",
                "pods"
            ]
        ),
        rule(
            "apps",
            &["deployments", "statefulsets", "daemonsets", "replicasets"]
        ),
        rule("batch", &["jobs", "cronjobs"]),
        rule("autoscaling", &["horizontalpodautoscalers"]),
        rule("policy", &["poddisruptionbudgets"]),
        rule("networking.k8s.io", &["ingresses", "networkpolicies"]),
    ])
}

/// `--bundle-service-account` for an agent in `agent_namespace`.
pub fn bundle_service_account(agent_namespace: &str) -> String {
    format!("{agent_namespace}/{DEFAULT_BUNDLE_SERVICE_ACCOUNT}")
}

/// The agent's and the Bundle ServiceAccount's RBAC objects.
pub fn agent_rbac(agent_namespace: &str, access: &BundleAccess) -> Vec<Value> {
    let app = BTreeMap::from([
        ("app.kubernetes.io/name", "tender-agent"),
        (labels::MANAGED_BY, "tender-cli"),
    ]);
    let agent =
        json!([{"kind": "ServiceAccount", "name": "tender-agent", "namespace": agent_namespace}]);
    let bundles = DEFAULT_BUNDLE_SERVICE_ACCOUNT;
    let bundles_subject =
        json!([{"kind": "ServiceAccount", "name": bundles, "namespace": agent_namespace}]);
    let bundles_role = format!("{bundles}-{agent_namespace}");
    let mut out = vec![
        // Reads only: caches of managed objects, conflict checks, namespaces, Helm values.
        json!({"apiVersion": RBAC, "kind": "ClusterRole",
               "metadata": {"name": "tender-agent", "labels": app},
               "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": RBAC, "kind": "ClusterRoleBinding",
               "metadata": {"name": "tender-agent", "labels": app},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tender-agent"},
               "subjects": agent}),
        // Its own namespace: inventories and the stored hub kubeconfig; and acting as the
        // Bundle ServiceAccount, no other.
        json!({"apiVersion": RBAC, "kind": "Role",
               "metadata": {"name": "tender-agent", "namespace": agent_namespace, "labels": app},
               "rules": [{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": EDIT},
                         {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"],
                          "resourceNames": [bundles]}]}),
        json!({"apiVersion": RBAC, "kind": "RoleBinding",
               "metadata": {"name": "tender-agent", "namespace": agent_namespace, "labels": app},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tender-agent"},
               "subjects": agent}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": bundles, "namespace": agent_namespace, "labels": app},
               "automountServiceAccountToken": false}),
        json!({"apiVersion": RBAC, "kind": "ClusterRole",
               "metadata": {"name": bundles_role, "labels": app},
               "rules": bundle_rules()}),
    ];
    for ns in &access.namespaces {
        // The namespace too: Bundles cannot create it themselves (a cluster-scoped kind).
        out.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
        out.push(json!({"apiVersion": RBAC, "kind": "RoleBinding",
            "metadata": {"name": bundles_role, "namespace": ns, "labels": app},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": bundles_role},
            "subjects": bundles_subject}));
    }
    if access.cluster_admin {
        out.push(json!({"apiVersion": RBAC, "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("{bundles_role}-cluster-admin"), "labels": app},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": bundles_subject}));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(objects: &[Value]) -> Vec<String> {
        objects
            .iter()
            .map(|o| {
                format!(
                    "{} {}",
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    }

    #[test]
    fn the_agent_reads_and_bundles_get_their_namespaces_only() {
        let access = BundleAccess {
            namespaces: vec!["default".into(), "apps".into()],
            cluster_admin: false,
        };
        let objects = agent_rbac("tender-system", &access);
        let agent_rules = &objects[0]["rules"];
        assert_eq!(agent_rules.as_array().unwrap().len(), 1);
        assert_eq!(agent_rules[0]["verbs"], json!(["get", "list", "watch"]));
        let bindings: Vec<_> = objects
            .iter()
            .filter(|o| o["kind"] == "RoleBinding" && o["roleRef"]["kind"] == "ClusterRole")
            .filter(|o| o["roleRef"]["name"] == "tender-bundles-tender-system")
            .map(|o| o["metadata"]["namespace"].as_str().unwrap())
            .collect();
        assert_eq!(bindings, ["default", "apps"]);
        let text = serde_json::to_string(&objects).unwrap();
        assert!(!text.contains("cluster-admin"), "{text}");
        assert!(
            !text.contains("rbac.authorization.k8s.io\"],\"resources"),
            "no RBAC rights"
        );
        assert!(names(&objects).contains(&"ServiceAccount tender-bundles".to_string()));
    }

    #[test]
    fn cluster_admin_is_an_explicit_opt_in() {
        let objects = agent_rbac(
            "tender-system",
            &BundleAccess {
                namespaces: vec![],
                cluster_admin: true,
            },
        );
        let admin = objects.last().unwrap();
        assert_eq!(admin["kind"], "ClusterRoleBinding");
        assert_eq!(admin["roleRef"]["name"], "cluster-admin");
        assert_eq!(admin["subjects"][0]["name"], "tender-bundles");
    }
}
