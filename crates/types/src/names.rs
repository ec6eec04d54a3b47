//! Name rules: every name tender derives, always valid and stable.

use crate::digest::{sha256_hex, short_hash};

/// Longest DNS label (namespace names).
pub const MAX_DNS_LABEL_LEN: usize = 63;
/// Longest DNS subdomain (most object names).
pub const MAX_DNS_SUBDOMAIN_LEN: usize = 253;

const CLUSTER_NAMESPACE_PREFIX: &str = "cluster-";

/// Whether `s` is an RFC 1123 DNS label: 1–63 lowercase alphanumerics or `-`, alphanumeric at
/// both ends.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_DNS_LABEL_LEN
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
}

/// Whether `s` is an RFC 1123 DNS subdomain as Kubernetes checks it: at most 253 characters
/// of dot-separated parts shaped like DNS labels (Kubernetes does not cap each part at 63).
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_DNS_SUBDOMAIN_LEN
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && is_lower_alnum(b[0])
                && is_lower_alnum(b[b.len() - 1])
                && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        })
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// Lowercases and replaces anything outside `[a-z0-9-]` by `-`, keeps at most `max` characters
/// and trims `-` at both ends.
fn sanitise(s: &str, max: usize) -> String {
    let mapped: String = s
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(max)
        .collect();
    mapped.trim_matches('-').to_string()
}

/// The cluster's own namespace on the hub:
/// `cluster-<workspace>-<name>-<16 hex of sha256("workspace/name")>`.
///
/// Always a DNS label of at most 63 characters. The readable part is truncated when long; the
/// hash of the full, unmodified pair keeps distinct clusters apart even when their readable
/// parts collide after truncation or sanitising.
///
/// The hash part is 64 bits (decision 0074-cluster-namespaces-provably-the-hubs): a tenant of
/// another workspace cannot search for a (workspace, name) pair whose namespace is somebody
/// else's; the hub also adopts no namespace it did not create.
pub fn cluster_namespace(workspace: &str, cluster_name: &str) -> String {
    let hash = sha256_hex(format!("{workspace}/{cluster_name}").as_bytes())[..16].to_string();
    let budget = MAX_DNS_LABEL_LEN - CLUSTER_NAMESPACE_PREFIX.len() - 1 - hash.len();
    let readable = sanitise(&format!("{workspace}-{cluster_name}"), budget);
    if readable.is_empty() {
        format!("{CLUSTER_NAMESPACE_PREFIX}{hash}")
    } else {
        format!("{CLUSTER_NAMESPACE_PREFIX}{readable}-{hash}")
    }
}

/// Name of the copy of a source Secret/ConfigMap in the cluster namespace on the hub:
/// `<bundle>-<kind>-<source>-<8 hex>`, lowercased, with dots and other characters outside
/// `[a-z0-9-]` turned into `-`.
///
/// Copies of every Bundle share the cluster namespace, so the hash of `bundle/kind/source` is
/// always appended: readable parts alone can collide (`a` + `x-secret-y` vs `a-secret-x` + `y`).
/// Always a DNS subdomain of at most 253 characters.
pub fn copy_name(bundle_name: &str, kind: &str, source_name: &str) -> String {
    let hash = short_hash(&format!("{bundle_name}/{kind}/{source_name}"));
    let budget = MAX_DNS_SUBDOMAIN_LEN - 1 - hash.len();
    let readable = sanitise(&format!("{bundle_name}-{kind}-{source_name}"), budget);
    if readable.is_empty() {
        hash
    } else {
        format!("{readable}-{hash}")
    }
}

/// Name of the Secret in the hub's own namespace where the hub keeps a rollout's state and the
/// previous revisions it may roll back to (decision 0112-rollout-state-in-the-hubs-namespace):
/// `tender-rollout-<workspace>-<bundle>[-<shard>]-<hash>`, readable and truncated, made unique
/// by the hash of the full identity (a shard replica rolls out its own Clusters, so keeps its
/// own). Never in a workspace (a Secret editor there could forge it) nor a cluster namespace.
pub fn rollout_secret(workspace: &str, bundle_name: &str, shard: Option<&str>) -> String {
    let identity = match shard {
        None => format!("{workspace}/{bundle_name}"),
        Some(id) => format!("{workspace}/{bundle_name}/{id}"),
    };
    let hash = short_hash(&identity);
    let readable = sanitise(
        &format!("tender-rollout-{}", identity.replace('/', "-")),
        MAX_DNS_SUBDOMAIN_LEN - 1 - hash.len(),
    );
    format!("{readable}-{hash}")
}

/// Name of the BundleDeployment of a Bundle in a cluster namespace (the Bundle's name).
pub fn bundle_deployment_name(bundle_name: &str) -> String {
    bundle_name.to_string()
}

/// Name of a cluster's published copy of a downstream object in the Bundle's namespace:
/// `<bundle>-<cluster>-<name>-<8 hex of sha256("bundle/cluster/name")>`, sanitised and
/// truncated to a DNS subdomain.
///
/// The hash is always there: the readable part alone collides (`east` publishing
/// `peering-request` and `east-peering` publishing `request`), and so would the two
/// publications. The hub still never overwrites an object it did not publish for the same
/// Bundle, cluster and source (reported `Conflict`).
pub fn upstream_name(bundle_name: &str, cluster_name: &str, name: &str) -> String {
    let hash = short_hash(&format!("{bundle_name}/{cluster_name}/{name}"));
    let budget = MAX_DNS_SUBDOMAIN_LEN - 1 - hash.len();
    let readable = sanitise(&format!("{bundle_name}-{cluster_name}-{name}"), budget);
    if readable.is_empty() {
        hash
    } else {
        format!("{readable}-{hash}")
    }
}

/// Name of the placeholder the hub creates in the cluster namespace for one upstream entry:
/// `<bundle>-upstream-<kind>-<name>-<8 hex of sha256("bundle/kind/namespace/name")>`, like
/// [`copy_name`].
pub fn upstream_placeholder(bundle_name: &str, kind: &str, namespace: &str, name: &str) -> String {
    let hash = short_hash(&format!("{bundle_name}/{kind}/{namespace}/{name}"));
    let budget = MAX_DNS_SUBDOMAIN_LEN - 1 - hash.len();
    let readable = sanitise(&format!("{bundle_name}-upstream-{kind}-{name}"), budget);
    if readable.is_empty() {
        hash
    } else {
        format!("{readable}-{hash}")
    }
}

/// Role and RoleBinding in the cluster namespace letting the agent write the placeholders of
/// one Bundle (`resourceNames`): `tender-agent-upstream-<bundle>`, hashed when too long.
pub fn upstream_role(bundle_name: &str) -> String {
    let name = format!("{AGENT_ROLE}-upstream-{bundle_name}");
    if name.len() <= MAX_DNS_SUBDOMAIN_LEN {
        return name;
    }
    let hash = short_hash(bundle_name);
    let keep = MAX_DNS_SUBDOMAIN_LEN - hash.len() - 1;
    format!("{}-{hash}", name[..keep].trim_end_matches(['-', '.']))
}

/// ServiceAccount of a cluster's agent, in the cluster namespace on the hub.
pub const AGENT_SERVICE_ACCOUNT: &str = "tender-agent";
/// The long-lived token Secret of [`AGENT_SERVICE_ACCOUNT`] that clusters registered before
/// decision 0044-expiring-agent-credentials had; the hub now deletes it (agents hold expiring
/// bound tokens instead).
pub const AGENT_TOKEN_SECRET: &str = "tender-agent-token";
/// Role and RoleBinding of the agent in its cluster namespace.
pub const AGENT_ROLE: &str = "tender-agent";
/// Lease the agent renews in its cluster namespace as its heartbeat.
pub const AGENT_LEASE: &str = "tender-agent";
/// ConfigMap in each cluster namespace holding the hub's key chain
/// ([`crate::signing::KeyChain`], JSON under [`HUB_KEYS_KEY`]).
pub const HUB_KEYS_CONFIG_MAP: &str = "tender-hub-keys";
/// The key of [`HUB_KEYS_CONFIG_MAP`]'s data holding the chain.
pub const HUB_KEYS_KEY: &str = "chain.json";
/// Default name of the Secret in the hub's namespace holding its signing keys.
pub const HUB_SIGNING_KEY_SECRET: &str = "tender-hub-signing-keys";

/// Name of the Role and RoleBinding in the workspace namespace that let one cluster's agent
/// read its own Cluster and write its status: `tender-agent-<cluster>`, hashed when too long.
pub fn agent_workspace_role(cluster_name: &str) -> String {
    let name = format!("{AGENT_ROLE}-{cluster_name}");
    if name.len() <= MAX_DNS_SUBDOMAIN_LEN {
        return name;
    }
    let hash = short_hash(cluster_name);
    let keep = MAX_DNS_SUBDOMAIN_LEN - hash.len() - 1;
    format!("{}-{hash}", &name[..keep])
}

#[cfg(test)]
mod tests {
    #[test]
    fn rollout_secrets_are_per_workspace_bundle_and_shard_and_always_valid() {
        use super::rollout_secret;
        let plain = rollout_secret("team-a", "app", None);
        assert!(plain.starts_with("tender-rollout-team-a-app-"), "{plain}");
        assert_ne!(plain, rollout_secret("team-a", "app", Some("s1")));
        // Names that read alike are different Bundles.
        assert_ne!(
            rollout_secret("a-b", "c", None),
            rollout_secret("a", "b-c", None)
        );
        let long = "x".repeat(253);
        let name = rollout_secret("ws", &long, None);
        assert!(name.len() <= 253 && name != rollout_secret("ws", &long, Some("s1")));
    }

    use super::*;

    #[test]
    fn dns_validators() {
        assert!(is_dns_label("a"));
        assert!(is_dns_label("a-1"));
        assert!(is_dns_label(&"a".repeat(63)));
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
        assert!(is_dns_subdomain("a.b-c.d"));
        assert!(is_dns_subdomain(&format!(
            "{}.{}",
            "a".repeat(63),
            "b".repeat(63)
        )));
        assert!(is_dns_subdomain(&"a".repeat(253)));
        assert!(!is_dns_subdomain(&"a".repeat(254)));
        for bad in ["", "a..b", ".a", "a.", "a.-b", &"a.".repeat(127)] {
            assert!(!is_dns_subdomain(bad), "{bad:?}");
        }
    }

    #[test]
    fn cluster_namespace_short_names_are_readable() {
        let ns = cluster_namespace("tender-default", "east-1");
        assert!(ns.starts_with("cluster-tender-default-east-1-"), "{ns}");
        assert_eq!(ns.len(), "cluster-tender-default-east-1-".len() + 16);
        assert!(is_dns_label(&ns));
        assert_eq!(ns, cluster_namespace("tender-default", "east-1"), "stable");
    }

    #[test]
    fn cluster_namespace_long_names_are_valid_and_distinct() {
        let prefix = "x".repeat(70);
        let a = cluster_namespace("ws", &format!("{prefix}-a"));
        let b = cluster_namespace("ws", &format!("{prefix}-b"));
        assert!(is_dns_label(&a) && is_dns_label(&b), "{a} {b}");
        assert_eq!(a.len(), 63);
        assert_ne!(a, b);
        let long_ws = cluster_namespace(&"w".repeat(63), &"c".repeat(63));
        assert!(is_dns_label(&long_ws), "{long_ws}");
    }

    #[test]
    fn cluster_namespace_separates_ambiguous_pairs() {
        // Same readable part, different (workspace, name) pairs.
        let a = cluster_namespace("a-b", "c");
        let b = cluster_namespace("a", "b-c");
        assert_ne!(a, b);
        assert!(is_dns_label(&cluster_namespace("UPPER_case", "x.y")));
        assert!(is_dns_label(&cluster_namespace("-", "-")));
    }

    #[test]
    fn copy_names_are_valid_unique_and_stable() {
        let n = copy_name("app", "Secret", "db-creds");
        assert!(n.starts_with("app-secret-db-creds-"), "{n}");
        assert!(is_dns_subdomain(&n));
        assert_eq!(n, copy_name("app", "Secret", "db-creds"));
        assert_ne!(n, copy_name("app", "ConfigMap", "db-creds"));
        assert_ne!(
            copy_name("a", "Secret", "x-secret-y"),
            copy_name("a-secret-x", "Secret", "y")
        );
        let long = "s".repeat(253);
        let a = copy_name(&"b".repeat(63), "ConfigMap", &format!("{long}a"));
        let b = copy_name(&"b".repeat(63), "ConfigMap", &format!("{long}b"));
        assert!(is_dns_subdomain(&a) && is_dns_subdomain(&b));
        assert_ne!(a, b);
        assert!(is_dns_subdomain(&copy_name("app", "Secret", "dotted.name")));
    }

    #[test]
    fn agent_workspace_role_names_stay_valid() {
        assert_eq!(agent_workspace_role("east-1"), "tender-agent-east-1");
        let a = agent_workspace_role(&format!("{}a", "c".repeat(252)));
        let b = agent_workspace_role(&format!("{}b", "c".repeat(252)));
        assert!(is_dns_subdomain(&a) && is_dns_subdomain(&b), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn upstream_names_are_readable_and_never_collide() {
        let n = upstream_name("vpc", "east-1", "peering");
        assert!(n.starts_with("vpc-east-1-peering-"), "{n}");
        assert_eq!(n.len(), "vpc-east-1-peering-".len() + 8);
        assert!(is_dns_subdomain(&upstream_name("vpc", "east.1", "a.b")));
        // The readable parts are equal; the publications must not be (issue 22).
        assert_ne!(
            upstream_name("vpc", "east", "peering-request"),
            upstream_name("vpc", "east-peering", "request")
        );
        let long = "n".repeat(250);
        let a = upstream_name("vpc", "east", &format!("{long}a"));
        let b = upstream_name("vpc", "east", &format!("{long}b"));
        assert!(is_dns_subdomain(&a) && is_dns_subdomain(&b), "{a}");
        assert_ne!(a, b);
        assert_eq!(
            a,
            upstream_name("vpc", "east", &format!("{long}a")),
            "stable"
        );
        let p = upstream_placeholder("vpc", "Secret", "ns", "peering");
        assert!(p.starts_with("vpc-upstream-secret-peering-"), "{p}");
        assert_ne!(p, upstream_placeholder("vpc", "Secret", "other", "peering"));
        assert_ne!(p, copy_name("vpc", "Secret", "peering"));
        assert_eq!(upstream_role("vpc"), "tender-agent-upstream-vpc");
        assert!(is_dns_subdomain(&upstream_role(&"b".repeat(253))));
    }

    #[test]
    fn bundle_deployment_is_named_after_its_bundle() {
        assert_eq!(bundle_deployment_name("app"), "app");
    }
}
