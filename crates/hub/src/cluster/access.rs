//! What the hub creates so an agent can work: its namespace, identity and RBAC (pure).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::ObjectMeta;
use tender_types::{API_GROUP, labels, names};

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Everything the hub creates for one Cluster so its agent can work, and nothing more.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentAccess {
    /// The cluster namespace.
    pub namespace: Namespace,
    /// The agent's ServiceAccount in the cluster namespace.
    pub service_account: ServiceAccount,
    /// What the agent may do in its cluster namespace.
    pub role: Role,
    /// Binds [`AgentAccess::role`] to the agent.
    pub role_binding: RoleBinding,
    /// In the workspace: read its own Cluster and write its status, nothing else.
    pub workspace_role: Role,
    /// Binds [`AgentAccess::workspace_role`] to the agent.
    pub workspace_role_binding: RoleBinding,
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |s: &[&str]| s.iter().map(ToString::to_string).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..Default::default()
    }
}

fn meta(name: &str, namespace: Option<&str>, labels: &BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(ToString::to_string),
        labels: Some(labels.clone()),
        ..Default::default()
    }
}

/// The namespace, identity and RBAC of the agent of Cluster `cluster` in `workspace`.
pub fn agent_access(workspace: &str, cluster: &str) -> AgentAccess {
    let ns = names::cluster_namespace(workspace, cluster);
    let labels = BTreeMap::from([
        (
            labels::MANAGED_BY.to_string(),
            labels::MANAGED_BY_VALUE.to_string(),
        ),
        (labels::WORKSPACE.to_string(), workspace.to_string()),
        (
            labels::CLUSTER.to_string(),
            labels::safe_label_value(cluster),
        ),
    ]);
    let sa = names::AGENT_SERVICE_ACCOUNT;
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: sa.into(),
        namespace: Some(ns.clone()),
        ..Default::default()
    };
    let role_ref = |name: &str| RoleRef {
        api_group: Some(RBAC_GROUP.into()),
        kind: "Role".into(),
        name: name.into(),
    };
    let ws_role = names::agent_workspace_role(cluster);
    let own = |mut r: PolicyRule| {
        r.resource_names = Some(vec![cluster.to_string()]);
        r
    };
    AgentAccess {
        namespace: Namespace {
            metadata: meta(&ns, None, &labels),
            ..Default::default()
        },
        service_account: ServiceAccount {
            metadata: meta(sa, Some(&ns), &labels),
            ..Default::default()
        },
        role: Role {
            metadata: meta(names::AGENT_ROLE, Some(&ns), &labels),
            rules: Some(vec![
                rule(
                    &[API_GROUP],
                    &["bundledeployments"],
                    &["get", "list", "watch", "patch", "update"],
                ),
                rule(
                    &[API_GROUP],
                    &["bundledeployments/status"],
                    &["get", "patch", "update"],
                ),
                rule(&[""], &["secrets", "configmaps"], &["get", "list", "watch"]),
                rule(
                    &["coordination.k8s.io"],
                    &["leases"],
                    &["get", "list", "watch", "create", "update", "patch"],
                ),
                rule(&["", "events.k8s.io"], &["events"], &["create", "patch"]),
                // Renewing its own expiring token, and nobody else's.
                PolicyRule {
                    resource_names: Some(vec![sa.to_string()]),
                    ..rule(&[""], &["serviceaccounts/token"], &["create"])
                },
            ]),
        },
        role_binding: RoleBinding {
            metadata: meta(names::AGENT_ROLE, Some(&ns), &labels),
            role_ref: role_ref(names::AGENT_ROLE),
            subjects: Some(vec![subject.clone()]),
        },
        workspace_role: Role {
            metadata: meta(&ws_role, Some(workspace), &labels),
            rules: Some(vec![
                own(rule(&[API_GROUP], &["clusters"], &["get"])),
                own(rule(
                    &[API_GROUP],
                    &["clusters/status"],
                    &["get", "patch", "update"],
                )),
            ]),
        },
        workspace_role_binding: RoleBinding {
            metadata: meta(&ws_role, Some(workspace), &labels),
            role_ref: role_ref(&ws_role),
            subjects: Some(vec![subject]),
        },
    }
}

/// The Role and RoleBinding letting the agent of `cluster_ns` write exactly the placeholders of
/// one Bundle there (reverse sync): `get`/`patch`/`update` with `resourceNames`, never
/// `create`, `list` or another name. `None` when the Bundle has no placeholders there.
pub fn upstream_access(
    cluster_ns: &str,
    bundle: &str,
    secrets: &[String],
    config_maps: &[String],
    labels: &BTreeMap<String, String>,
) -> Option<(Role, RoleBinding)> {
    let verbs = ["get", "patch", "update"];
    let named = |resource: &str, names: &[String]| {
        (!names.is_empty()).then(|| PolicyRule {
            resource_names: Some(names.to_vec()),
            ..rule(&[""], &[resource], &verbs)
        })
    };
    let rules: Vec<PolicyRule> = [named("secrets", secrets), named("configmaps", config_maps)]
        .into_iter()
        .flatten()
        .collect();
    if rules.is_empty() {
        return None;
    }
    let name = names::upstream_role(bundle);
    let role = Role {
        metadata: meta(&name, Some(cluster_ns), labels),
        rules: Some(rules),
    };
    let binding = RoleBinding {
        metadata: meta(&name, Some(cluster_ns), labels),
        role_ref: RoleRef {
            api_group: Some(RBAC_GROUP.into()),
            kind: "Role".into(),
            name,
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: names::AGENT_SERVICE_ACCOUNT.into(),
            namespace: Some(cluster_ns.to_string()),
            ..Default::default()
        }]),
    };
    Some((role, binding))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;

    #[test]
    fn upstream_access_names_exactly_the_placeholders() {
        let (role, binding) =
            upstream_access("cns", "vpc", &["p1".to_string()], &[], &BTreeMap::new()).unwrap();
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["secrets".to_string()][..])
        );
        assert_eq!(
            rules[0].resource_names.as_deref(),
            Some(&["p1".to_string()][..])
        );
        assert_eq!(rules[0].verbs, ["get", "patch", "update"]);
        assert_eq!(binding.role_ref.name, "tender-agent-upstream-vpc");
        assert_eq!(
            binding.subjects.unwrap()[0].namespace.as_deref(),
            Some("cns")
        );
        assert!(upstream_access("cns", "vpc", &[], &[], &BTreeMap::new()).is_none());
    }

    #[test]
    fn agent_access_is_scoped_to_its_cluster() {
        let a = agent_access("ws", "east");
        let ns = names::cluster_namespace("ws", "east");
        assert_eq!(a.namespace.name_any(), ns);
        assert_eq!(a.namespace.labels()[labels::WORKSPACE], "ws");
        assert_eq!(a.namespace.labels()[labels::CLUSTER], "east");
        for obj in [
            &a.service_account.metadata,
            &a.role.metadata,
            &a.role_binding.metadata,
        ] {
            assert_eq!(obj.namespace.as_deref(), Some(ns.as_str()));
        }
        // The agent may mint tokens of its own ServiceAccount only.
        let mint: Vec<_> = a
            .role
            .rules
            .as_ref()
            .unwrap()
            .iter()
            .filter(|r| {
                r.resources
                    .iter()
                    .flatten()
                    .any(|x| x == "serviceaccounts/token")
            })
            .collect();
        assert_eq!(mint.len(), 1);
        assert_eq!(mint[0].verbs, ["create"]);
        assert_eq!(
            mint[0].resource_names.as_deref(),
            Some(&[names::AGENT_SERVICE_ACCOUNT.to_string()][..])
        );
        let ws_rules = a.workspace_role.rules.as_ref().unwrap();
        assert!(
            ws_rules
                .iter()
                .all(|r| r.resource_names.as_deref() == Some(&["east".to_string()][..])),
            "workspace rules are limited to the cluster's own object"
        );
        assert_eq!(a.workspace_role.metadata.namespace.as_deref(), Some("ws"));
        assert_eq!(a.workspace_role.name_any(), "tender-agent-east");
        let subject = &a.workspace_role_binding.subjects.as_ref().unwrap()[0];
        assert_eq!(subject.namespace.as_deref(), Some(ns.as_str()));
        let verbs: Vec<_> = a
            .role
            .rules
            .as_ref()
            .unwrap()
            .iter()
            .flat_map(|r| r.verbs.clone())
            .collect();
        assert!(
            !verbs.contains(&"delete".to_string()),
            "the agent never deletes on the hub"
        );
    }
}
