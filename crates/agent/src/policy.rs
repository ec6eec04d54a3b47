//! The downstream cluster owner's policy: which namespaces the agent may write to and read
//! from for a Bundle, which kinds it refuses, and what it never touches whatever a Bundle asks
//! for. Pure.
//!
//! Write refusal is per object: a refused object is reported (state `Error`, message starting
//! with `RefusedByPolicy`) and left alone — not created, not changed, not pruned — while
//! everything else in its BundleDeployment is deployed as usual. A refused read (reverse sync,
//! `valuesFrom`, `helmSecretName`) is reported with `ReadRefusedByPolicy`, naming the object
//! and the rule, never its content (decision 0077-reads-for-a-bundle-obey-the-owner).

use std::collections::BTreeMap;

use tender_types::ObjectRef;
use tender_types::conditions::reason;
use tender_types::labels;

/// Kinds refused unless the owner says otherwise: cluster-wide RBAC (a Bundle could grant
/// itself anything), admission webhooks and policies (a Bundle could intercept every write),
/// CRDs (cluster-wide API changes) and aggregated APIs (an `APIService` routes a whole API
/// group to a Service of the Bundle's choosing).
pub const DEFAULT_REFUSED_KINDS: &[&str] = &[
    "ClusterRole.rbac.authorization.k8s.io",
    "ClusterRoleBinding.rbac.authorization.k8s.io",
    "*.admissionregistration.k8s.io",
    "CustomResourceDefinition.apiextensions.k8s.io",
    "APIService.apiregistration.k8s.io",
];

/// The cluster's own namespaces: written only when `--allowed-namespaces` names them exactly
/// (a RoleBinding to `cluster-admin` in `kube-system` is admin over the control plane's
/// credentials). The agent's own namespace is protected the same way
/// (decision 0078-tenders-own-objects-and-protected-namespaces).
pub const PROTECTED_NAMESPACES: &[&str] = &["kube-system", "kube-public", "kube-node-lease"];

/// The Secret type never read for a Bundle: a ServiceAccount's long-lived token.
pub const SERVICE_ACCOUNT_TOKEN: &str = "kubernetes.io/service-account-token";

/// What the agent may write downstream, and read there for a Bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Namespaces the agent may write to (a trailing `*` matches a prefix); empty: all but the
    /// [`PROTECTED_NAMESPACES`] and the agent's own, which must be named exactly. A
    /// `Namespace` object counts as writing to the namespace it names.
    pub allowed_namespaces: Vec<String>,
    /// Kinds refused, as `Kind.group` (`Kind` alone for the core group, `*.group` for a whole
    /// group).
    pub refused_kinds: Vec<String>,
    /// Namespaces a Bundle may read from (reverse sync, `valuesFrom`, `helmSecretName`), same
    /// patterns; empty: all; `None`: the same as `allowed_namespaces`. The agent's own
    /// namespace is never readable.
    pub readable_namespaces: Option<Vec<String>>,
}

impl Default for Policy {
    /// Every namespace but the protected ones; the [`DEFAULT_REFUSED_KINDS`] refused; reads
    /// where writes go.
    fn default() -> Self {
        Self {
            allowed_namespaces: Vec::new(),
            refused_kinds: DEFAULT_REFUSED_KINDS
                .iter()
                .map(ToString::to_string)
                .collect(),
            readable_namespaces: None,
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

fn any_matches(patterns: &[String], ns: &str) -> bool {
    patterns.is_empty() || patterns.iter().any(|p| namespace_matches(p, ns))
}

/// The namespace writing `key` writes to: its own, or the one a `Namespace` object names.
fn namespace_of(key: &ObjectRef) -> Option<&str> {
    match (
        &key.namespace,
        key.kind.as_str(),
        group_of(&key.api_version),
    ) {
        (Some(ns), _, _) => Some(ns.as_str()),
        (None, "Namespace", "") => Some(key.name.as_str()),
        (None, _, _) => None,
    }
}

impl Policy {
    /// Whether a Bundle's `namespaceLabels`/`namespaceAnnotations` go on the namespaces the
    /// agent creates: only when the owner lets Bundles write `Namespace` objects at all (which
    /// could carry any label), so refusing the kind also keeps a Bundle from, say, relaxing a
    /// new namespace's Pod Security labels.
    pub fn namespace_metadata_allowed(&self) -> bool {
        !self
            .refused_kinds
            .iter()
            .any(|p| kind_matches(p, "Namespace", ""))
    }

    /// Why `key` may not be written downstream (the status message, starting with
    /// `RefusedByPolicy`), or `None` when it may. `agent_namespace` is the agent's own.
    pub fn refusal(&self, key: &ObjectRef, agent_namespace: &str) -> Option<String> {
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
        let ns = namespace_of(key)?;
        let protected = ns == agent_namespace || PROTECTED_NAMESPACES.contains(&ns);
        if protected {
            if self.allowed_namespaces.iter().any(|p| p == ns) {
                return None;
            }
            let what = if ns == agent_namespace {
                "the agent's own namespace"
            } else {
                "a protected namespace"
            };
            return Some(format!(
                "{}: namespace {ns} is {what}; this cluster's agent writes there only when --allowed-namespaces names it exactly",
                reason::REFUSED_BY_POLICY,
            ));
        }
        if any_matches(&self.allowed_namespaces, ns) {
            return None;
        }
        Some(format!(
            "{}: namespace {ns} is not one this cluster's agent may write to (--allowed-namespaces {})",
            reason::REFUSED_BY_POLICY,
            self.allowed_namespaces.join(",")
        ))
    }

    /// Why the existing, unmanaged object `key` (labels `live_labels`) may not be adopted by
    /// `takeOwnership` (a `RefusedByPolicy` message), whatever the flags: tender's own objects —
    /// anything in the agent's namespace (or that namespace itself), and anything labelled as
    /// one of tender's installs (`app.kubernetes.io/name` in [`labels::INSTALL_NAMES`]).
    pub fn adoption_refusal(
        key: &ObjectRef,
        live_labels: Option<&BTreeMap<String, String>>,
        agent_namespace: &str,
    ) -> Option<String> {
        if namespace_of(key) == Some(agent_namespace) {
            return Some(format!(
                "{}: {} {} is in the agent's own namespace {agent_namespace}; takeOwnership never adopts tender's own objects",
                reason::REFUSED_BY_POLICY,
                key.kind,
                describe(key)
            ));
        }
        let app = live_labels.and_then(|l| l.get(labels::APP_NAME))?;
        labels::INSTALL_NAMES.contains(&app.as_str()).then(|| {
            format!(
                "{}: {} {} is part of tender's install ({}={app}); takeOwnership never adopts tender's own objects",
                reason::REFUSED_BY_POLICY,
                key.kind,
                describe(key),
                labels::APP_NAME
            )
        })
    }

    /// The read bounds of this policy for an agent running in `agent_namespace`.
    pub fn reads<'a>(&'a self, agent_namespace: &'a str) -> Reads<'a> {
        Reads {
            patterns: self
                .readable_namespaces
                .as_deref()
                .unwrap_or(&self.allowed_namespaces),
            agent_namespace,
        }
    }
}

fn describe(key: &ObjectRef) -> String {
    match &key.namespace {
        Some(ns) => format!("{ns}/{}", key.name),
        None => key.name.clone(),
    }
}

/// What a Bundle may make the agent read downstream (reverse sync, `valuesFrom`,
/// `helmSecretName`): decision 0077-reads-for-a-bundle-obey-the-owner.
#[derive(Clone, Copy, Debug)]
pub struct Reads<'a> {
    patterns: &'a [String],
    agent_namespace: &'a str,
}

impl Reads<'_> {
    /// Why `kind` `namespace/name` may not be read (the message without the reason word; the
    /// reason is [`reason::READ_REFUSED_BY_POLICY`]), or `None`. Checked before reading, by
    /// namespace; `secret_type` is the type of the Secret read (check again once it is read).
    pub fn refusal(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        secret_type: Option<&str>,
    ) -> Option<String> {
        let what = format!("{kind} {namespace}/{name}");
        if namespace == self.agent_namespace {
            return Some(format!(
                "{what} is in the agent's own namespace; the agent never reads there for a Bundle"
            ));
        }
        if !any_matches(self.patterns, namespace) {
            return Some(format!(
                "{what} is outside the namespaces Bundles may read on this cluster (--readable-namespaces {})",
                self.patterns.join(",")
            ));
        }
        if kind == "Secret" && secret_type == Some(SERVICE_ACCOUNT_TOKEN) {
            return Some(format!(
                "{what} is a {SERVICE_ACCOUNT_TOKEN} Secret; the agent never reads one for a Bundle"
            ));
        }
        None
    }

    /// [`Self::refusal`] as a status message, starting with `ReadRefusedByPolicy`.
    pub fn refusal_message(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        secret_type: Option<&str>,
    ) -> Option<String> {
        self.refusal(kind, namespace, name, secret_type)
            .map(|why| format!("{}: {why}", reason::READ_REFUSED_BY_POLICY))
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

    const AGENT: &str = "tender-system";

    fn refusal(p: &Policy, key: &ObjectRef) -> Option<String> {
        p.refusal(key, AGENT)
    }

    fn key(api_version: &str, kind: &str, ns: Option<&str>, name: &str) -> ObjectRef {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: ns.map(Into::into),
            name: name.into(),
        }
    }

    #[test]
    fn defaults_refuse_cluster_rbac_webhooks_crds_and_api_services_only() {
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
            key("apiregistration.k8s.io/v1", "APIService", None, "v1.x"),
        ] {
            let why = refusal(&p, &refused).expect("refused");
            assert!(why.starts_with("RefusedByPolicy: "), "{why}");
            assert!(why.contains(&refused.kind), "{why}");
        }
        for allowed in [
            key("rbac.authorization.k8s.io/v1", "Role", Some("app"), "x"),
            key("v1", "ConfigMap", Some("app"), "x"),
            key("v1", "Namespace", None, "app"),
            key("kyverno.io/v1", "ClusterPolicy", None, "x"),
        ] {
            assert_eq!(refusal(&p, &allowed), None, "{allowed:?}");
        }
    }

    #[test]
    fn allowed_namespaces_cover_namespaced_objects_and_namespace_objects() {
        let p = Policy {
            allowed_namespaces: vec!["app".into(), "team-*".into()],
            refused_kinds: Vec::new(),
            readable_namespaces: None,
        };
        assert_eq!(refusal(&p, &key("v1", "Secret", Some("app"), "s")), None);
        assert_eq!(refusal(&p, &key("v1", "Secret", Some("team-a"), "s")), None);
        assert_eq!(refusal(&p, &key("v1", "Namespace", None, "team-b")), None);
        assert!(p.namespace_metadata_allowed());
        let no_ns = Policy {
            refused_kinds: vec!["Namespace".into()],
            ..Policy::default()
        };
        assert!(
            !no_ns.namespace_metadata_allowed(),
            "refusing the kind refuses its labels"
        );
        let why = refusal(&p, &key("v1", "Secret", Some("kube-system"), "s")).unwrap();
        assert!(why.contains("namespace kube-system"), "{why}");
        assert!(refusal(&p, &key("v1", "Namespace", None, "other")).is_some());
        // Cluster-scoped kinds are governed by the kind list only.
        assert_eq!(
            refusal(
                &p,
                &key("rbac.authorization.k8s.io/v1", "ClusterRole", None, "x")
            ),
            None,
            "an empty kind list allows what the defaults refuse"
        );
        assert_eq!(
            refusal(&p, &key("storage.k8s.io/v1", "StorageClass", None, "x")),
            None
        );
    }

    #[test]
    fn core_kinds_and_group_wildcards() {
        let p = Policy {
            allowed_namespaces: Vec::new(),
            refused_kinds: vec!["Secret".into(), "*.apps".into()],
            readable_namespaces: None,
        };
        assert!(refusal(&p, &key("v1", "Secret", Some("a"), "s")).is_some());
        assert!(refusal(&p, &key("apps/v1", "Deployment", Some("a"), "d")).is_some());
        assert_eq!(refusal(&p, &key("v1", "ConfigMap", Some("a"), "c")), None);
        // `Secret` names the core group only.
        assert_eq!(
            refusal(&p, &key("example.com/v1", "Secret", Some("a"), "s")),
            None
        );
    }

    #[test]
    fn protected_and_agent_namespaces_are_written_only_when_named_exactly() {
        let p = Policy::default();
        for ns in ["kube-system", "kube-public", "kube-node-lease", AGENT] {
            for k in [
                key("v1", "ConfigMap", Some(ns), "c"),
                key(
                    "rbac.authorization.k8s.io/v1",
                    "RoleBinding",
                    Some(ns),
                    "rb",
                ),
                key("v1", "Namespace", None, ns),
            ] {
                let why = refusal(&p, &k).expect("refused by default");
                assert!(why.starts_with("RefusedByPolicy: "), "{why}");
                assert!(why.contains(&format!("namespace {ns}")), "{why}");
                assert!(why.contains("names it exactly"), "{why}");
            }
        }
        // A prefix pattern does not open them; the exact name does.
        let p = Policy {
            allowed_namespaces: vec!["kube-*".into(), "tender-*".into(), "*".into()],
            ..Policy::default()
        };
        assert!(refusal(&p, &key("v1", "ConfigMap", Some("kube-system"), "c")).is_some());
        assert!(refusal(&p, &key("v1", "ConfigMap", Some(AGENT), "c")).is_some());
        assert_eq!(
            refusal(&p, &key("v1", "ConfigMap", Some("kube-x"), "c")),
            None
        );
        let p = Policy {
            allowed_namespaces: vec!["kube-system".into(), AGENT.into()],
            ..Policy::default()
        };
        assert_eq!(
            refusal(&p, &key("v1", "ConfigMap", Some("kube-system"), "c")),
            None
        );
        assert_eq!(refusal(&p, &key("v1", "ConfigMap", Some(AGENT), "c")), None);
        // Another agent's namespace is an ordinary one.
        assert_eq!(
            Policy::default().refusal(&key("v1", "ConfigMap", Some(AGENT), "c"), "agents-y"),
            None
        );
    }

    #[test]
    fn tenders_own_objects_are_never_adopted() {
        let labelled =
            |app: &str| BTreeMap::from([(labels::APP_NAME.to_string(), app.to_string())]);
        let deployment = key("apps/v1", "Deployment", Some("elsewhere"), "tender-agent");
        for app in ["tender-agent", "tender-hub", "tender-hub-shard"] {
            let why = Policy::adoption_refusal(&deployment, Some(&labelled(app)), AGENT)
                .expect("refused");
            assert!(why.starts_with("RefusedByPolicy: "), "{why}");
            assert!(why.contains("elsewhere/tender-agent"), "{why}");
        }
        for k in [
            key("v1", "Secret", Some(AGENT), "tender-agent-hub"),
            key("v1", "ConfigMap", Some(AGENT), "tender-inventory-x"),
            key("v1", "Namespace", None, AGENT),
        ] {
            let why = Policy::adoption_refusal(&k, None, AGENT).expect("refused");
            assert!(why.contains("agent's own namespace"), "{why}");
        }
        assert_eq!(
            Policy::adoption_refusal(&deployment, Some(&labelled("my-app")), AGENT),
            None
        );
        assert_eq!(
            Policy::adoption_refusal(
                &key("rbac.authorization.k8s.io/v1", "ClusterRole", None, "x"),
                None,
                AGENT
            ),
            None
        );
    }

    #[test]
    fn reads_never_touch_the_agent_namespace_or_service_account_tokens() {
        let p = Policy::default();
        let r = p.reads(AGENT);
        let why = r
            .refusal_message("Secret", AGENT, "tender-agent-hub", None)
            .expect("refused");
        assert!(why.starts_with("ReadRefusedByPolicy: "), "{why}");
        assert!(
            why.contains("Secret tender-system/tender-agent-hub"),
            "{why}"
        );
        assert!(why.contains("agent's own namespace"), "{why}");
        assert!(r.refusal("ConfigMap", AGENT, "c", None).is_some());
        let why = r
            .refusal("Secret", "apps", "sa-token", Some(SERVICE_ACCOUNT_TOKEN))
            .expect("refused");
        assert!(why.contains("service-account-token"), "{why}");
        assert_eq!(r.refusal("Secret", "apps", "s", Some("Opaque")), None);
        assert_eq!(r.refusal("Secret", "apps", "s", None), None);
        assert_eq!(
            r.refusal("ConfigMap", "kube-system", "c", None),
            None,
            "reads are not writes"
        );
        // Whatever the flags.
        let open = Policy {
            allowed_namespaces: vec![AGENT.into()],
            readable_namespaces: Some(vec![AGENT.into(), "*".into()]),
            ..Policy::default()
        };
        assert!(
            open.reads(AGENT)
                .refusal("Secret", AGENT, "x", None)
                .is_some()
        );
    }

    #[test]
    fn readable_namespaces_default_to_the_allowed_ones() {
        let p = Policy {
            allowed_namespaces: vec!["app".into(), "team-*".into()],
            ..Policy::default()
        };
        let r = p.reads(AGENT);
        assert_eq!(r.refusal("Secret", "team-a", "s", None), None);
        let why = r.refusal("Secret", "other", "s", None).expect("refused");
        assert!(why.contains("--readable-namespaces app,team-*"), "{why}");
        let p = Policy {
            readable_namespaces: Some(vec!["shared".into()]),
            ..p
        };
        assert_eq!(p.reads(AGENT).refusal("Secret", "shared", "s", None), None);
        assert!(p.reads(AGENT).refusal("Secret", "app", "s", None).is_some());
        let p = Policy {
            readable_namespaces: Some(Vec::new()),
            ..p
        };
        assert_eq!(
            p.reads(AGENT).refusal("Secret", "anything", "s", None),
            None
        );
    }
}
