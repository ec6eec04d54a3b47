//! Helm hooks as Helm defines them (decision 0088-phased-deploy-and-helm-hooks): which objects of
//! `helm template`'s output are hooks, for which events, in what order, and what their delete
//! policy says. Pure.
//!
//! Helm sorts a phase's hooks by kind (install order), then stably by weight and name, so
//! weight decides first, then the object's name, then its kind.

use std::cmp::Ordering;

use serde_json::Value;
use tender_types::Manifest;

/// `helm.sh/hook`.
pub const HOOK: &str = "helm.sh/hook";
/// `helm.sh/hook-weight`.
pub const HOOK_WEIGHT: &str = "helm.sh/hook-weight";
/// `helm.sh/hook-delete-policy`.
pub const HOOK_DELETE_POLICY: &str = "helm.sh/hook-delete-policy";
/// `helm.sh/resource-policy`.
pub const RESOURCE_POLICY: &str = "helm.sh/resource-policy";

/// A lifecycle event a hook runs at (`test` hooks are never rendered: `--skip-tests`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HookEvent {
    /// Before the first install's objects.
    PreInstall,
    /// After the first install's objects.
    PostInstall,
    /// Before an upgrade's objects.
    PreUpgrade,
    /// After an upgrade's objects.
    PostUpgrade,
    /// Before the release's objects are removed.
    PreDelete,
    /// After the release's objects are removed.
    PostDelete,
}

impl HookEvent {
    /// Helm's name of the event.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PreInstall => "pre-install",
            Self::PostInstall => "post-install",
            Self::PreUpgrade => "pre-upgrade",
            Self::PostUpgrade => "post-upgrade",
            Self::PreDelete => "pre-delete",
            Self::PostDelete => "post-delete",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s.trim() {
            "pre-install" => Self::PreInstall,
            "post-install" => Self::PostInstall,
            "pre-upgrade" => Self::PreUpgrade,
            "post-upgrade" => Self::PostUpgrade,
            "pre-delete" => Self::PreDelete,
            "post-delete" => Self::PostDelete,
            _ => return None,
        })
    }

    /// The events before and after the ordinary objects of an install or an upgrade.
    pub fn around(upgrade: bool) -> (Self, Self) {
        if upgrade {
            (Self::PreUpgrade, Self::PostUpgrade)
        } else {
            (Self::PreInstall, Self::PostInstall)
        }
    }
}

/// `helm.sh/hook-delete-policy`; none given means `before-hook-creation`, as in Helm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeletePolicy {
    /// Delete the previous run's object before creating it again.
    pub before_creation: bool,
    /// Delete it once it succeeded.
    pub succeeded: bool,
    /// Delete it once it failed.
    pub failed: bool,
}

impl DeletePolicy {
    fn parse(value: Option<&str>) -> Self {
        let mut p = Self::default();
        for word in value.unwrap_or_default().split(',').map(str::trim) {
            match word {
                "before-hook-creation" => p.before_creation = true,
                "hook-succeeded" => p.succeeded = true,
                "hook-failed" => p.failed = true,
                _ => {}
            }
        }
        if !(p.before_creation || p.succeeded || p.failed) {
            p.before_creation = true;
        }
        p
    }
}

/// One hook object of a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Hook {
    /// The object as rendered (its hook annotations kept, as Helm keeps them).
    pub manifest: Manifest,
    /// The events it runs at (`test` and unknown words dropped).
    pub events: Vec<HookEvent>,
    /// `helm.sh/hook-weight` (0 when absent or not a number, as in Helm).
    pub weight: i64,
    /// `helm.sh/hook-delete-policy`.
    pub delete: DeletePolicy,
}

impl Hook {
    /// Whether the rollout waits for this hook: a Job until it completes, a Pod until it
    /// succeeds; any other kind is done once applied.
    pub fn waits(&self) -> bool {
        matches!(self.kind(), "Job" | "Pod")
    }

    fn kind(&self) -> &str {
        self.manifest.kind().unwrap_or_default()
    }
}

/// What `helm template` printed, split the way Helm installs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RenderedChart {
    /// CustomResourceDefinitions from the chart's `crds/` directory: applied first, never
    /// upgraded away nor deleted by tender (Helm's rule).
    pub crds: Vec<Manifest>,
    /// The ordinary objects, in Helm's install order.
    pub objects: Vec<Manifest>,
    /// The hooks (test hooks excluded), in output order.
    pub hooks: Vec<Hook>,
}

impl RenderedChart {
    /// The hooks of `event`, in the order Helm runs them.
    pub fn hooks_of(&self, event: HookEvent) -> Vec<&Hook> {
        ordered(&self.hooks, event)
    }
}

/// The hooks among `hooks` of `event`, in the order Helm runs them.
pub fn ordered(hooks: &[Hook], event: HookEvent) -> Vec<&Hook> {
    let mut out: Vec<&Hook> = hooks.iter().filter(|h| h.events.contains(&event)).collect();
    out.sort_by(|a, b| hook_order(a, b));
    out
}

/// Weight, then name, then kind in Helm's install order.
fn hook_order(a: &Hook, b: &Hook) -> Ordering {
    a.weight
        .cmp(&b.weight)
        .then_with(|| {
            a.manifest
                .name()
                .unwrap_or_default()
                .cmp(b.manifest.name().unwrap_or_default())
        })
        .then_with(|| install_rank(a.kind()).cmp(&install_rank(b.kind())))
}

/// Helm's install order of kinds (`releaseutil.InstallOrder`); kinds it does not list last.
const INSTALL_ORDER: &[&str] = &[
    "PriorityClass",
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "PodSecurityPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "SecretList",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleList",
    "ClusterRoleBinding",
    "ClusterRoleBindingList",
    "Role",
    "RoleList",
    "RoleBinding",
    "RoleBindingList",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicationController",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "IngressClass",
    "Ingress",
    "APIService",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
];

/// Position of `kind` in Helm's install order.
pub fn install_rank(kind: &str) -> usize {
    INSTALL_ORDER
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(INSTALL_ORDER.len())
}

/// Whether an object says `helm.sh/resource-policy: keep` (Helm never deletes it).
pub fn is_kept(object: &Value) -> bool {
    object["metadata"]["annotations"][RESOURCE_POLICY]
        .as_str()
        .is_some_and(|p| p.trim() == "keep")
}

/// Splits `helm template` output into CRDs from `crds/`, ordinary objects (stably sorted in
/// Helm's install order) and hooks. `docs` are the documents with the `# Source:` path each
/// was printed under.
pub fn split(docs: Vec<(Option<String>, Value)>) -> RenderedChart {
    let mut out = RenderedChart::default();
    for (source, item) in docs {
        let annotations = &item["metadata"]["annotations"];
        if let Some(events) = annotations[HOOK].as_str() {
            let words: Vec<&str> = events.split(',').map(str::trim).collect();
            let events: Vec<HookEvent> = words.iter().filter_map(|w| HookEvent::parse(w)).collect();
            // A test hook (or one for rollback only) never runs here.
            if !events.is_empty() {
                out.hooks.push(Hook {
                    weight: annotations[HOOK_WEIGHT]
                        .as_str()
                        .and_then(|w| w.trim().parse().ok())
                        .unwrap_or(0),
                    delete: DeletePolicy::parse(annotations[HOOK_DELETE_POLICY].as_str()),
                    events,
                    manifest: Manifest(item),
                });
            }
            continue;
        }
        let from_crds_dir = source
            .as_deref()
            .is_some_and(|s| s.contains("/crds/") && !s.contains("/templates/"));
        if from_crds_dir && item["kind"] == "CustomResourceDefinition" {
            out.crds.push(Manifest(item));
        } else {
            out.objects.push(Manifest(item));
        }
    }
    // One CRD once: a `crds/` CRD rendered again (another file, or also under `templates/`)
    // stays the `crds/` one — applied first and never deleted — instead of a second object
    // that would conflict with it or delete it.
    let mut seen = std::collections::BTreeSet::new();
    out.crds
        .retain(|m| seen.insert(m.name().unwrap_or_default().to_string()));
    out.objects.retain(|m| {
        !(m.kind() == Some("CustomResourceDefinition")
            && seen.contains(m.name().unwrap_or_default()))
    });
    out.objects
        .sort_by_key(|m| install_rank(m.kind().unwrap_or_default()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(kind: &str, name: &str, annotations: Value) -> Value {
        json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "annotations": annotations}})
    }

    fn names(hooks: &[&Hook]) -> Vec<String> {
        hooks
            .iter()
            .map(|h| format!("{}/{}", h.kind(), h.manifest.name().unwrap()))
            .collect()
    }

    #[test]
    fn hooks_run_by_weight_then_name_then_kind() {
        let pre = |w: &str| json!({HOOK: "pre-install,pre-upgrade", HOOK_WEIGHT: w});
        let chart = split(vec![
            (None, obj("Job", "create", pre("0"))),
            (None, obj("RoleBinding", "admission", pre("-1"))),
            (None, obj("ServiceAccount", "admission", pre("-1"))),
            (None, obj("ClusterRole", "admission", pre("-1"))),
            (None, obj("Job", "patch", json!({HOOK: "post-install"}))),
            (None, obj("Pod", "smoke", json!({HOOK: "test"}))),
            (None, obj("ConfigMap", "plain", json!({}))),
        ]);
        assert_eq!(
            names(&chart.hooks_of(HookEvent::PreInstall)),
            [
                "ServiceAccount/admission",
                "ClusterRole/admission",
                "RoleBinding/admission",
                "Job/create"
            ]
        );
        assert_eq!(
            names(&chart.hooks_of(HookEvent::PreUpgrade)).len(),
            4,
            "one object may hook several events"
        );
        assert_eq!(
            names(&chart.hooks_of(HookEvent::PostInstall)),
            ["Job/patch"]
        );
        assert!(chart.hooks_of(HookEvent::PreDelete).is_empty());
        assert_eq!(chart.hooks.len(), 5, "the test hook is dropped");
        assert_eq!(chart.objects.len(), 1);
    }

    #[test]
    fn delete_policy_defaults_to_before_hook_creation() {
        assert_eq!(
            DeletePolicy::parse(None),
            DeletePolicy {
                before_creation: true,
                ..Default::default()
            }
        );
        assert_eq!(
            DeletePolicy::parse(Some("hook-succeeded, hook-failed")),
            DeletePolicy {
                before_creation: false,
                succeeded: true,
                failed: true
            }
        );
        assert!(DeletePolicy::parse(Some("before-hook-creation,hook-succeeded")).succeeded);
    }

    #[test]
    fn crds_from_the_crds_directory_are_apart_and_objects_follow_install_order() {
        let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "a.x.io"}});
        let mut other = crd.clone();
        other["metadata"]["name"] = json!("b.x.io");
        let chart = split(vec![
            (
                Some("app/templates/deploy.yaml".into()),
                obj("Deployment", "d", json!({})),
            ),
            (Some("app/crds/a.yaml".into()), crd.clone()),
            (Some("app/templates/crd.yaml".into()), other),
            // The same CRD again (another crds/ file, or under templates/): the crds/ one.
            (Some("app/crds/again.yaml".into()), crd.clone()),
            (Some("app/templates/dup.yaml".into()), crd),
            (
                Some("app/templates/sa.yaml".into()),
                obj("ServiceAccount", "s", json!({})),
            ),
            (
                Some("app/templates/x.yaml".into()),
                obj("Widget", "w", json!({})),
            ),
        ]);
        assert_eq!(chart.crds.len(), 1);
        let crd_objects: Vec<_> = chart
            .objects
            .iter()
            .filter(|m| m.kind() == Some("CustomResourceDefinition"))
            .map(|m| m.name().unwrap())
            .collect();
        assert_eq!(
            crd_objects,
            ["b.x.io"],
            "a templates/ CRD is an ordinary object"
        );
        let kinds: Vec<_> = chart.objects.iter().map(|m| m.kind().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "ServiceAccount",
                "CustomResourceDefinition",
                "Deployment",
                "Widget"
            ]
        );
    }

    #[test]
    fn weights_that_are_not_numbers_count_as_zero_and_keep_is_read() {
        let chart = split(vec![(
            None,
            obj(
                "Job",
                "j",
                json!({HOOK: "pre-delete", HOOK_WEIGHT: "heavy"}),
            ),
        )]);
        assert_eq!(chart.hooks[0].weight, 0);
        assert!(chart.hooks[0].waits());
        assert!(is_kept(&obj(
            "Secret",
            "s",
            json!({RESOURCE_POLICY: "keep"})
        )));
        assert!(!is_kept(&obj("Secret", "s", json!({}))));
    }
}
