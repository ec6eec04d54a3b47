//! Where things land downstream.
//!
//! Copies go to `targetNamespace`, else `defaultNamespace`, else `default`. Manifests of
//! namespaced kinds go to `targetNamespace` when set (overriding their own namespace), else
//! their own namespace, else `defaultNamespace`, else `default`. Cluster-scoped manifests have
//! no namespace.

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
}
