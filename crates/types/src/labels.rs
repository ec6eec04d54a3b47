//! Every label, annotation, finalizer and field manager tender writes, in one place.
//!
//! All of tender's own keys start with [`PREFIX`]. Label values must be valid Kubernetes label
//! values; use [`safe_label_value`] for anything derived from user input.

use crate::digest::short_hash;

/// Prefix of every tender label, annotation and finalizer.
pub const PREFIX: &str = "tender.dev/";

/// Standard `managed-by` label key, set on everything tender creates.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY`] on objects tender creates.
pub const MANAGED_BY_VALUE: &str = "tender";

/// Standard `name` label key; tender's own installs carry one of [`INSTALL_NAMES`].
pub const APP_NAME: &str = "app.kubernetes.io/name";
/// [`APP_NAME`] of the agent's install (its chart and what `tender cluster add` renders).
pub const AGENT_APP_NAME: &str = "tender-agent";
/// [`APP_NAME`] values of tender's own installs (agent, hub, hub shards): objects carrying one
/// are never adopted by `takeOwnership`
/// (decision 0078-tenders-own-objects-and-protected-namespaces).
pub const INSTALL_NAMES: &[&str] = &[AGENT_APP_NAME, "tender-hub", "tender-hub-shard"];

/// Label: namespace of the Bundle an object was created for.
pub const BUNDLE_NAMESPACE: &str = "tender.dev/bundle-namespace";
/// Label: name of the Bundle an object was created for.
pub const BUNDLE_NAME: &str = "tender.dev/bundle-name";
/// Annotation on a Bundle's rollout Secret in the hub's namespace: the uid of that Bundle (a
/// Bundle recreated under the same name starts its rollouts afresh).
pub const BUNDLE_UID: &str = "tender.dev/bundle-uid";
/// Label: name of the Cluster (on cluster namespaces and BundleDeployments).
pub const CLUSTER: &str = "tender.dev/cluster";
/// Label: the cluster's own namespace on the hub (where its BundleDeployments live).
pub const CLUSTER_NAMESPACE: &str = "tender.dev/cluster-namespace";
/// Annotation on a Cluster: the uid of the cluster namespace the hub created for it. Only a
/// namespace of that uid is the hub's to write into and delete
/// (decision 0074-cluster-namespaces-provably-the-hubs); the agent's credential cannot write a
/// Cluster's metadata.
pub const NAMESPACE_UID: &str = "tender.dev/namespace-uid";
/// Label on a cluster namespace: the random claim the hub created it with; the Cluster's
/// [`NAMESPACE_UID`] holds `pending:<sha256 of the claim>` until the uid is recorded, so a hub
/// stopped between the two writes still knows the namespace for its own
/// (decision 0074-cluster-namespaces-provably-the-hubs).
pub const NAMESPACE_CLAIM: &str = "tender.dev/namespace-claim";
/// Label: namespace of the Cluster object (the workspace), on cluster namespaces.
pub const WORKSPACE: &str = "tender.dev/workspace";
/// Label on downstream objects: which BundleDeployment owns them, as
/// [`bundle_deployment_owner_label`] of `(cluster namespace, BundleDeployment name)`.
/// Used to list a deployment's objects; the exact owner is in [`OWNER_ANNOTATION`].
pub const BUNDLE_DEPLOYMENT: &str = "tender.dev/bundle-deployment";

/// Annotation on downstream objects: exact owner, `<cluster namespace>/<BundleDeployment name>`.
pub const OWNER_ANNOTATION: &str = "tender.dev/owner";
/// Annotation: content hash of what tender last wrote (see [`crate::hash`]); equal hash, no write.
pub const CONTENT_HASH: &str = "tender.dev/content-hash";
/// Pod-template annotation on a Bundle's workloads (with `rolloutOnCopyChange`): hash of the
/// copied Secrets and ConfigMaps the pods consume, so a rotation rolls them.
pub const COPIES_HASH: &str = "tender.dev/copies-hash";
/// Annotation `"true"` on a downstream object: leave it in place when it is no longer deployed.
pub const KEEP_RESOURCES: &str = "tender.dev/keep-resources";
/// Annotation on copies: the source, `<namespace>/<name>` (the kind is the copy's own kind).
pub const COPY_OF: &str = "tender.dev/copy-of";
/// Annotation on a copy on the hub: the hub's signature over the copy's identity and content
/// hash, `<keyId>.<signedAt>.<signature>` ([`crate::signing`]).
pub const HUB_SIGNATURE: &str = "tender.dev/hub-signature";
/// Annotation on a downstream copy: the `signedAt` of the hub copy it was deployed from (a
/// replayed older signed copy is refused, [`crate::signing::not_replayed`]).
pub const SIGNED_AT: &str = "tender.dev/signed-at";
/// Label `"true"` on a carrier: a Secret in a cluster namespace on the hub that carries the
/// serialized copy of an object of another kind (which must never come alive on the hub).
pub const CARRIER: &str = "tender.dev/carrier";
/// Annotation on a carrier: the `apiVersion` and `kind` of the object it carries (`<apiVersion>/<kind>`).
pub const CARRIED_KIND: &str = "tender.dev/carried-kind";
/// Secret `type` of carriers.
pub const CARRIER_TYPE: &str = "tender.dev/carrier";
/// The key of a carrier's data holding the carried object (canonical JSON).
pub const CARRIER_KEY: &str = "object.json";
/// Label `"true"` on the agent's per-BundleDeployment inventory ConfigMaps downstream (the
/// list of objects a deployment created, used for pruning and the start-up sweep).
pub const INVENTORY: &str = "tender.dev/inventory";

/// Label on reverse-sync objects: [`UPSTREAM_PLACEHOLDER`] (cluster namespace, written by
/// the agent) or [`UPSTREAM_PUBLISHED`] (Bundle namespace, written by the hub).
pub const UPSTREAM: &str = "tender.dev/upstream";
/// Value of [`UPSTREAM`] on placeholders.
pub const UPSTREAM_PLACEHOLDER: &str = "placeholder";
/// Value of [`UPSTREAM`] on published objects.
pub const UPSTREAM_PUBLISHED: &str = "published";
/// Label on placeholders and published objects: the Bundle's name. Not [`BUNDLE_NAME`], so
/// neither is taken for a copy, and a published object can be a `downstreamResources` source.
pub const UPSTREAM_BUNDLE: &str = "tender.dev/upstream-bundle";
/// Annotation on placeholders and published objects: the downstream object,
/// `Kind/namespace/name` ([`crate::upstream::source_ref`]).
pub const UPSTREAM_SOURCE: &str = "tender.dev/upstream-source";
/// Annotation the agent sets on a placeholder: `Present` or `Absent` downstream.
pub const UPSTREAM_OBSERVED: &str = "tender.dev/upstream-observed";
/// Annotation the agent sets on a Secret placeholder: the downstream Secret's `type`
/// (placeholders are `Opaque`, and a Secret's type cannot change).
pub const UPSTREAM_TYPE: &str = "tender.dev/upstream-type";
/// Annotation on published objects: when their content last changed (RFC 3339).
pub const PUBLISHED_AT: &str = "tender.dev/published-at";
/// Field manager of the agent's placeholder writes and of `status.upstream`.
pub const AGENT_UPSTREAM_FIELD_MANAGER: &str = "tender-agent-upstream";

/// Annotation on a Bundle or HelmOp: a new value resumes a halted or rolled-back rollout
/// (`tender rollout resume` writes the time).
pub const ROLLOUT_RESUME: &str = "tender.dev/rollout-resume";

/// Finalizer on BundleDeployments: the agent removes downstream objects before deletion completes.
pub const AGENT_CLEANUP_FINALIZER: &str = "tender.dev/agent-cleanup";
/// Finalizer on Clusters: the hub removes the cluster namespace before deletion completes.
pub const CLUSTER_CLEANUP_FINALIZER: &str = "tender.dev/cluster-cleanup";
/// Finalizer on Bundles: the hub removes BundleDeployments in other namespaces (owner
/// references cannot cross namespaces).
pub const BUNDLE_CLEANUP_FINALIZER: &str = "tender.dev/bundle-cleanup";

/// Label on Clusters: the hub shard (`--shard-id`) that serves them; unlabelled Clusters are
/// served by the replica without a shard id. The hub sets it on everything it writes into the
/// cluster's namespace, and each replica's caches select on it.
pub const SHARD: &str = "tender.dev/shard";
/// Longest shard id: it ends up in a finalizer name (63 characters after the `/`).
pub const MAX_SHARD_ID_LEN: usize = 48;

/// Checks a shard id: a lowercase RFC 1123 label (a valid label value that can also name a
/// Lease and a finalizer) of at most [`MAX_SHARD_ID_LEN`] characters.
pub fn validate_shard_id(id: &str) -> Result<(), String> {
    let ok_chars = id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ok_ends = id.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && id.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if id.len() <= MAX_SHARD_ID_LEN && ok_chars && ok_ends {
        Ok(())
    } else {
        Err(format!(
            "invalid shard id {id:?}: it is the value of the {SHARD} label on Clusters and part of a Lease and finalizer name, so it must be lowercase letters, digits and '-', start and end with a letter or digit, and be at most {MAX_SHARD_ID_LEN} characters"
        ))
    }
}

/// The Bundle finalizer of the hub replica serving `shard` (`None`: the unsharded replica),
/// so each replica removes its own BundleDeployments before a Bundle goes.
pub fn bundle_cleanup_finalizer(shard: Option<&str>) -> String {
    match shard {
        None => BUNDLE_CLEANUP_FINALIZER.to_string(),
        Some(id) => format!("{BUNDLE_CLEANUP_FINALIZER}-{id}"),
    }
}

/// Field manager of the `status.shards` entry a shard replica writes on Bundles.
pub fn shard_field_manager(id: &str) -> String {
    format!("{HUB_FIELD_MANAGER}-shard-{id}")
}

/// The default leader Lease of the hub replica serving `shard`.
pub fn hub_lease_name(shard: Option<&str>) -> String {
    match shard {
        None => HUB_FIELD_MANAGER.to_string(),
        Some(id) => format!("{HUB_FIELD_MANAGER}-{id}"),
    }
}

/// Finalizer on HelmOps: the hub brings the HelmOp's last spec (`keepResources`) to its
/// Bundle before deleting that Bundle.
pub const HELMOP_CLEANUP_FINALIZER: &str = "tender.dev/helmop-cleanup";
/// Label on a Bundle the hub writes for a HelmOp: the HelmOp's name.
pub const HELMOP: &str = "tender.dev/helmop";

/// Server-side apply field manager of the hub.
pub const HUB_FIELD_MANAGER: &str = "tender-hub";
/// Server-side apply field manager of the agent.
pub const AGENT_FIELD_MANAGER: &str = "tender-agent";

/// Longest valid label value.
pub const MAX_LABEL_VALUE_LEN: usize = 63;

/// Whether `key` is one of tender's own label/annotation keys.
pub fn is_tender_key(key: &str) -> bool {
    key.starts_with(PREFIX)
}

/// Whether a source's label or annotation `key` is carried over to its copies.
///
/// tender's own keys, [`MANAGED_BY`] and `kubectl.kubernetes.io/` bookkeeping are not: they
/// describe the source object, not the data.
pub fn is_copied_metadata_key(key: &str) -> bool {
    !(is_tender_key(key) || key == MANAGED_BY || key.starts_with("kubectl.kubernetes.io/"))
}

/// Whether `value` is a valid label value (empty, or ≤63 alphanumerics, `-`, `_`, `.`, starting
/// and ending alphanumeric).
pub fn is_label_value(value: &str) -> bool {
    if value.is_empty() {
        return true;
    }
    let bytes = value.as_bytes();
    value.len() <= MAX_LABEL_VALUE_LEN
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Turns any string into a valid label value: unchanged when already valid, otherwise
/// sanitised, truncated and suffixed with a short hash of the original so distinct inputs stay
/// distinct and the result is stable.
pub fn safe_label_value(value: &str) -> String {
    if is_label_value(value) {
        return value.to_string();
    }
    let hash = short_hash(value);
    let budget = MAX_LABEL_VALUE_LEN - hash.len() - 1;
    let sanitised: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(budget)
        .collect();
    let readable = sanitised.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if readable.is_empty() {
        hash
    } else {
        format!("{readable}-{hash}")
    }
}

/// Value of [`BUNDLE_DEPLOYMENT`] for a BundleDeployment (`<cluster namespace>.<name>`, made label-safe).
pub fn bundle_deployment_owner_label(cluster_namespace: &str, name: &str) -> String {
    safe_label_value(&format!("{cluster_namespace}.{name}"))
}

/// Value of [`OWNER_ANNOTATION`] for a BundleDeployment.
pub fn bundle_deployment_owner(cluster_namespace: &str, name: &str) -> String {
    format!("{cluster_namespace}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tender_key_has_the_prefix() {
        for key in [
            BUNDLE_NAMESPACE,
            BUNDLE_NAME,
            CLUSTER,
            CLUSTER_NAMESPACE,
            WORKSPACE,
            BUNDLE_DEPLOYMENT,
            OWNER_ANNOTATION,
            CONTENT_HASH,
            KEEP_RESOURCES,
            COPY_OF,
            HUB_SIGNATURE,
            SIGNED_AT,
            INVENTORY,
            UPSTREAM,
            UPSTREAM_BUNDLE,
            UPSTREAM_SOURCE,
            UPSTREAM_OBSERVED,
            UPSTREAM_TYPE,
            PUBLISHED_AT,
            AGENT_CLEANUP_FINALIZER,
            CLUSTER_CLEANUP_FINALIZER,
            BUNDLE_CLEANUP_FINALIZER,
            SHARD,
        ] {
            assert!(is_tender_key(key), "{key}");
            assert!(!is_copied_metadata_key(key), "{key}");
        }
        assert!(is_copied_metadata_key("app"));
        assert!(!is_copied_metadata_key(
            "kubectl.kubernetes.io/last-applied-configuration"
        ));
    }

    #[test]
    fn shard_ids_are_label_values_that_name_leases_and_finalizers() {
        for id in ["a", "shard-1", "eu-west-2", &"x".repeat(MAX_SHARD_ID_LEN)] {
            assert_eq!(validate_shard_id(id), Ok(()), "{id}");
            assert!(is_label_value(id));
            let finalizer = bundle_cleanup_finalizer(Some(id));
            let (_, name) = finalizer.split_once('/').unwrap();
            assert!(name.len() <= 63, "{finalizer}");
        }
        for id in [
            "",
            "A",
            "a_b",
            "a.b",
            "-a",
            "a-",
            "é",
            &"x".repeat(MAX_SHARD_ID_LEN + 1),
        ] {
            let err = validate_shard_id(id).unwrap_err();
            assert!(err.contains("invalid shard id"), "{err}");
        }
        assert_eq!(bundle_cleanup_finalizer(None), BUNDLE_CLEANUP_FINALIZER);
        assert_eq!(hub_lease_name(Some("a")), "tender-hub-a");
        assert_eq!(shard_field_manager("a"), "tender-hub-shard-a");
    }

    #[test]
    fn valid_label_values_are_kept() {
        for v in ["", "a", "cluster-1", "a.b_c-d", &"x".repeat(63)] {
            assert_eq!(safe_label_value(v), v);
        }
    }

    #[test]
    fn invalid_label_values_become_valid_and_distinct() {
        let long_a = format!("{}a", "x".repeat(80));
        let long_b = format!("{}b", "x".repeat(80));
        let inputs = [
            "ns/name",
            "-lead",
            "trail.",
            "ünïcode",
            "///",
            &long_a,
            &long_b,
        ];
        let mut outputs: Vec<String> = inputs.iter().map(|v| safe_label_value(v)).collect();
        for (input, out) in inputs.iter().zip(&outputs) {
            assert!(is_label_value(out), "{input:?} -> {out:?}");
            assert_eq!(&safe_label_value(input), out, "stable");
        }
        outputs.sort();
        outputs.dedup();
        assert_eq!(outputs.len(), inputs.len());
    }

    #[test]
    fn owner_label_is_label_safe() {
        let ns = crate::names::cluster_namespace(&"w".repeat(60), &"c".repeat(60));
        let v = bundle_deployment_owner_label(&ns, &"b".repeat(63));
        assert!(is_label_value(&v), "{v}");
        assert_eq!(bundle_deployment_owner_label("ns", "bd"), "ns.bd");
        assert_eq!(bundle_deployment_owner("ns", "bd"), "ns/bd");
    }
}
