//! Where things land downstream.
//!
//! Copies go to `targetNamespace`, else `defaultNamespace`, else `default`. Manifests of
//! namespaced kinds go to `targetNamespace` when set (overriding their own namespace), else
//! their own namespace, else `defaultNamespace`, else `default`. Cluster-scoped manifests have
//! no namespace.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::targeting::{SelectorError, selector_matches};

/// Namespace used when neither `targetNamespace` nor `defaultNamespace` is set.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Namespace the agent runs in downstream when `Cluster.spec.agentNamespace` is unset.
pub const DEFAULT_AGENT_NAMESPACE: &str = "tender-system";

/// The resolved `defaultNamespace`: the given one, else `default`.
pub fn default_namespace(default_namespace: Option<&str>) -> &str {
    default_namespace.unwrap_or(DEFAULT_NAMESPACE)
}

/// Namespace of the downstream copies of Secrets and ConfigMaps.
pub fn copies_namespace<'a>(
    target_namespace: Option<&'a str>,
    default_namespace: Option<&'a str>,
) -> &'a str {
    target_namespace
        .or(default_namespace)
        .unwrap_or(DEFAULT_NAMESPACE)
}

/// Namespace a manifest is applied in, or `None` for a cluster-scoped kind.
///
/// `own_namespace` is the manifest's `metadata.namespace`; `namespaced` whether its kind is
/// namespaced (known from discovery downstream).
pub fn manifest_namespace<'a>(
    own_namespace: Option<&'a str>,
    namespaced: bool,
    target_namespace: Option<&'a str>,
    default_namespace: Option<&'a str>,
) -> Option<&'a str> {
    if !namespaced {
        return None;
    }
    let own = own_namespace.filter(|ns| !ns.is_empty());
    Some(
        target_namespace
            .or(own)
            .or(default_namespace)
            .unwrap_or(DEFAULT_NAMESPACE),
    )
}

/// Fan-out: the namespaces copies and namespaced manifests go to, given `targetNamespaces`, a
/// `targetNamespaceSelector` and the downstream namespaces (name, labels, being deleted) — or
/// `None` when the deployment does not fan out. Namespaces being deleted are not targeted (a
/// write there would fail); explicitly listed ones always are.
pub fn fan_out_namespaces<'a>(
    target_namespaces: &[String],
    selector: Option<&LabelSelector>,
    existing: impl IntoIterator<Item = (&'a str, &'a BTreeMap<String, String>, bool)>,
) -> Result<Option<BTreeSet<String>>, SelectorError> {
    if target_namespaces.is_empty() && selector.is_none() {
        return Ok(None);
    }
    let mut out: BTreeSet<String> = target_namespaces.iter().cloned().collect();
    if let Some(selector) = selector {
        for (name, labels, deleting) in existing {
            if !deleting && selector_matches(selector, labels)? {
                out.insert(name.to_string());
            }
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_prefer_target_then_default() {
        assert_eq!(copies_namespace(Some("t"), Some("d")), "t");
        assert_eq!(copies_namespace(None, Some("d")), "d");
        assert_eq!(copies_namespace(None, None), "default");
        assert_eq!(default_namespace(None), "default");
        assert_eq!(default_namespace(Some("d")), "d");
    }

    #[test]
    fn manifests_resolve_namespaces() {
        // targetNamespace overrides an explicit namespace.
        assert_eq!(
            manifest_namespace(Some("own"), true, Some("t"), Some("d")),
            Some("t")
        );
        assert_eq!(
            manifest_namespace(None, true, Some("t"), Some("d")),
            Some("t")
        );
        // Without targetNamespace an explicit namespace is kept.
        assert_eq!(
            manifest_namespace(Some("own"), true, None, Some("d")),
            Some("own")
        );
        assert_eq!(manifest_namespace(None, true, None, Some("d")), Some("d"));
        assert_eq!(
            manifest_namespace(Some(""), true, None, Some("d")),
            Some("d")
        );
        assert_eq!(manifest_namespace(None, true, None, None), Some("default"));
        // Cluster-scoped kinds never get one.
        assert_eq!(
            manifest_namespace(Some("own"), false, Some("t"), Some("d")),
            None
        );
    }

    #[test]
    fn fan_out_is_the_list_plus_matching_live_namespaces() {
        let team = BTreeMap::from([("team".to_string(), "a".to_string())]);
        let other = BTreeMap::new();
        let existing = [
            ("a1", &team, false),
            ("a2", &team, true),
            ("b", &other, false),
        ];
        let selector = LabelSelector {
            match_labels: Some(team.clone()),
            ..Default::default()
        };
        assert_eq!(fan_out_namespaces(&[], None, existing).unwrap(), None);
        let got = fan_out_namespaces(&["x".to_string()], Some(&selector), existing).unwrap();
        assert_eq!(
            got,
            Some(BTreeSet::from(["a1".to_string(), "x".to_string()]))
        );
        let all = fan_out_namespaces(&[], Some(&LabelSelector::default()), existing).unwrap();
        assert_eq!(all.unwrap().len(), 2);
    }
}
