//! The Bundle's side of `pollingInterval`: the version the poll controller ([`crate::poll`])
//! recorded in status, and the spec its BundleDeployments are planned from — the chart at the
//! version the hub resolved (decisions 0104-hub-polls-chart-versions,
//! 0113-chart-polling-controller). Nothing here looks at a repository.

use std::borrow::Cow;

use tender_types::conditions::{TYPE_POLLED, find_condition};
use tender_types::{Bundle, BundleSpec};

use crate::helm_poll;

/// What the poll controller recorded for the Bundle's spec as it is now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// The Bundle does not poll.
    NotPolling,
    /// It polls, and the poller has not looked at this generation yet: its `Polled` condition
    /// is for an older spec. The reconcile waits (the poller's write wakes it), so a new range
    /// is never handed out unresolved.
    Waiting,
    /// The exact version to deploy, or `None` when none was resolved (the agents then resolve
    /// the range themselves, as without polling).
    Version(Option<String>),
}

/// The version recorded in `bundle`'s status for its current spec. Pure.
pub(crate) fn recorded(bundle: &Bundle) -> Recorded {
    if helm_poll::resolution(bundle).is_none() {
        return Recorded::NotPolling;
    }
    let status = bundle.status.as_ref();
    let polled = status.and_then(|s| find_condition(&s.conditions, TYPE_POLLED));
    match polled {
        Some(c) if c.observed_generation == bundle.metadata.generation => {
            Recorded::Version(status.and_then(|s| s.version.clone()))
        }
        _ => Recorded::Waiting,
    }
}

/// The spec BundleDeployments are planned from: the chart at the resolved exact version
/// when there is one, else the Bundle's own spec.
pub(super) fn resolved_spec<'a>(
    spec: &'a BundleSpec,
    version: Option<&str>,
) -> Cow<'a, BundleSpec> {
    match (version, &spec.helm) {
        (Some(version), Some(_)) => {
            let mut s = spec.clone();
            if let Some(h) = s.helm.as_mut() {
                h.version = Some(version.to_string());
            }
            Cow::Owned(s)
        }
        _ => Cow::Borrowed(spec),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deployments_get_the_resolved_version() {
        let spec: BundleSpec = serde_json::from_value(json!({
            "helm": {"chart": "app", "repo": "https://c", "version": "^0.1"},
            "pollingInterval": "30s"
        }))
        .unwrap();
        let s = resolved_spec(&spec, Some("0.1.4"));
        assert_eq!(s.helm.as_ref().unwrap().version.as_deref(), Some("0.1.4"));
        let none = resolved_spec(&spec, None);
        assert!(matches!(none, Cow::Borrowed(_)));
        assert_eq!(
            none.helm.as_ref().unwrap().version.as_deref(),
            Some("^0.1"),
            "nothing resolved yet: the agents resolve the range"
        );
    }

    #[test]
    fn the_reconcile_waits_for_a_look_at_its_generation() {
        let mut b: Bundle = serde_json::from_value(json!({
            "apiVersion": "tender.dev/v1alpha1", "kind": "Bundle",
            "metadata": {"name": "app", "namespace": "ws", "generation": 3},
            "spec": {"helm": {"chart": "app", "repo": "https://c", "version": "^0.1"},
                     "pollingInterval": "30s"}
        }))
        .unwrap();
        assert_eq!(recorded(&b), Recorded::Waiting, "never looked");
        let polled = |generation| {
            serde_json::from_value(json!({
                "version": "0.1.4",
                "conditions": [{"type": "Polled", "status": "True", "reason": "VersionResolved",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "observedGeneration": generation}]
            }))
            .unwrap()
        };
        b.status = Some(polled(2));
        assert_eq!(recorded(&b), Recorded::Waiting, "looked at an older spec");
        b.status = Some(polled(3));
        assert_eq!(recorded(&b), Recorded::Version(Some("0.1.4".into())));
        b.spec.polling_interval = None;
        assert_eq!(recorded(&b), Recorded::NotPolling);
    }
}
