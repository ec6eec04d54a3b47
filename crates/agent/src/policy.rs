//! The downstream cluster owner's policy: which namespaces the agent may write to and which
//! kinds it refuses, whatever a Bundle asks for. Pure.
//!
//! Refusal is per object: a refused object is reported (state `Error`, message starting with
//! `RefusedByPolicy`) and left alone — not created, not changed, not pruned — while everything
//! else in its BundleDeployment is deployed as usual.

use tender_types::ObjectRef;
use tender_types::conditions::reason;

/// Kinds refused unless the owner says otherwise: cluster-wide RBAC (a Bundle could grant
/// itself anything), admission webhooks and policies (a Bundle could intercept every write),
/// and CRDs (cluster-wide API changes).
pub const DEFAULT_REFUSED_KINDS: &[&str] = &[
    "ClusterRole.rbac.authorization.k8s.io",
    "ClusterRoleBinding.rbac.authorization.k8s.io",
    "*.admissionregistration.k8s.io",
    "CustomResourceDefinition.apiextensions.k8s.io",
];

/// What the agent may write downstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Namespaces the agent may write to (a trailing `*` matches a prefix); empty: all. A
    /// `Namespace` object counts as writing to the namespace it names.
    pub allowed_namespaces: Vec<String>,
    /// Kinds refused, as `Kind.group` (`Kind` alone for the core group, `*.group` for a whole
    /// group).
    pub refused_kinds: Vec<String>,
}

impl Default for Policy {
    /// Every namespace; the [`DEFAULT_REFUSED_KINDS`] refused.
    fn default() -> Self {
        Self {
            allowed_namespaces: Vec::new(),
            refused_kinds: DEFAULT_REFUSED_KINDS
                .iter()
                .map(ToString::to_string)
                .collect(),
        }
    }
}

fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

fn kind_matches(pattern: &str, kind: &str, group: &str) -> bool {
    let (p_kind, p_group) = pattern.split_once('.').unwrap_or((pattern, ""));
    p_group == group && (p_kind == "*" || p_kind == kind)
}

fn namespace_matches(pattern: &str, ns: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => ns.starts_with(prefix),
        None => pattern == ns,
    }
}

impl Policy {
    /// Why `key` may not be written downstream (the status message, starting with
    /// `RefusedByPolicy`), or `None` when it may.
    pub fn refusal(&self, key: &ObjectRef) -> Option<String> {
        let group = group_of(&key.api_version);
        if let Some(p) = self
            .refused_kinds
            .iter()
            .find(|p| kind_matches(p, &key.kind, group))
        {
            return Some(format!(
                "{}: kind {}/{} is refused by this cluster's agent (--refused-kinds {p})",
                reason::REFUSED_BY_POLICY,
                key.api_version,
                key.kind
            ));
        }
        let ns = match (&key.namespace, key.kind.as_str(), group) {
            (Some(ns), _, _) => ns.as_str(),
            (None, "Namespace", "") => key.name.as_str(),
            (None, _, _) => return None,
        };
        if self.allowed_namespaces.is_empty()
            || self
                .allowed_namespaces
                .iter()
                .any(|p| namespace_matches(p, ns))
        {
            return None;
        }
        Some(format!(
            "{}: namespace {ns} is not one this cluster's agent may write to (--allowed-namespaces {})",
            reason::REFUSED_BY_POLICY,
            self.allowed_namespaces.join(",")
        ))
    }
}

/// Whether an object status is a policy refusal.
pub fn is_refused(s: &tender_types::ObjectStatus) -> bool {
    s.state == tender_types::ObjectState::Error
        && s.message
            .as_deref()
            .is_some_and(|m| m.starts_with(reason::REFUSED_BY_POLICY))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(api_version: &str, kind: &str, ns: Option<&str>, name: &str) -> ObjectRef {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: ns.map(Into::into),
            name: name.into(),
        }
    }

    #[test]
    fn defaults_refuse_cluster_rbac_webhooks_and_crds_only() {
        let p = Policy::default();
        for refused in [
            key("rbac.authorization.k8s.io/v1", "ClusterRole", None, "x"),
            key(
                "rbac.authorization.k8s.io/v1",
                "ClusterRoleBinding",
                None,
                "x",
            ),
            key(
                "admissionregistration.k8s.io/v1",
                "ValidatingWebhookConfiguration",
                None,
                "x",
            ),
            key(
                "admissionregistration.k8s.io/v1",
                "MutatingWebhookConfiguration",
                None,
                "x",
            ),
            key(
                "admissionregistration.k8s.io/v1",
                "ValidatingAdmissionPolicy",
                None,
                "x",
            ),
            key(
                "apiextensions.k8s.io/v1",
                "CustomResourceDefinition",
                None,
                "x",
            ),
        ] {
            let why = p.refusal(&refused).expect("refused");
            assert!(why.starts_with("RefusedByPolicy: "), "{why}");
            assert!(why.contains(&refused.kind), "{why}");
        }
        for allowed in [
            key("rbac.authorization.k8s.io/v1", "Role", Some("app"), "x"),
            key("v1", "ConfigMap", Some("app"), "x"),
            key("v1", "Namespace", None, "app"),
            key("kyverno.io/v1", "ClusterPolicy", None, "x"),
        ] {
            assert_eq!(p.refusal(&allowed), None, "{allowed:?}");
        }
    }

    #[test]
    fn allowed_namespaces_cover_namespaced_objects_and_namespace_objects() {
        let p = Policy {
            allowed_namespaces: vec!["app".into(), "team-*".into()],
            refused_kinds: Vec::new(),
        };
        assert_eq!(p.refusal(&key("v1", "Secret", Some("app"), "s")), None);
        assert_eq!(p.refusal(&key("v1", "Secret", Some("team-a"), "s")), None);
        assert_eq!(p.refusal(&key("v1", "Namespace", None, "team-b")), None);
        let why = p
            .refusal(&key("v1", "Secret", Some("kube-system"), "s"))
            .unwrap();
        assert!(why.contains("namespace kube-system"), "{why}");
        assert!(p.refusal(&key("v1", "Namespace", None, "other")).is_some());
        // Cluster-scoped kinds are governed by the kind list only.
        assert_eq!(
            p.refusal(&key(
                "rbac.authorization.k8s.io/v1",
                "ClusterRole",
                None,
                "x"
            )),
            None,
            "an empty kind list allows what the defaults refuse"
        );
        assert_eq!(
            p.refusal(&key("storage.k8s.io/v1", "StorageClass", None, "x")),
            None
        );
    }

    #[test]
    fn core_kinds_and_group_wildcards() {
        let p = Policy {
            allowed_namespaces: Vec::new(),
            refused_kinds: vec!["Secret".into(), "*.apps".into()],
        };
        assert!(p.refusal(&key("v1", "Secret", Some("a"), "s")).is_some());
        assert!(
            p.refusal(&key("apps/v1", "Deployment", Some("a"), "d"))
                .is_some()
        );
        assert_eq!(p.refusal(&key("v1", "ConfigMap", Some("a"), "c")), None);
        // `Secret` names the core group only.
        assert_eq!(
            p.refusal(&key("example.com/v1", "Secret", Some("a"), "s")),
            None
        );
    }
}
