//! Downstream ServiceAccounts a Bundle is applied as
//! (decision 0079-bundles-applied-as-an-impersonated-service-account): the `<namespace>/<name>`
//! form of flags and `Bundle.spec.serviceAccount`, the identity Kubernetes gives a ServiceAccount
//! (what the agent impersonates), and the owner's allow-list.

use std::fmt;

use crate::names::{is_dns_label, is_dns_subdomain};

/// Name of the ServiceAccount the agent chart and `tender cluster add` create for Bundles, in
/// the agent's namespace.
pub const DEFAULT_BUNDLE_SERVICE_ACCOUNT: &str = "tender-bundles";

/// Allow-list entry that allows every ServiceAccount.
pub const ANY: &str = "*";

/// A ServiceAccount by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceAccountRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl ServiceAccountRef {
    /// Parses `<namespace>/<name>`; `Err` says what is wrong.
    pub fn parse(s: &str) -> Result<Self, String> {
        let Some((namespace, name)) = s.trim().split_once('/') else {
            return Err(format!("{s:?} is not <namespace>/<name>"));
        };
        if !is_dns_label(namespace) {
            return Err(format!("{s:?}: {namespace:?} is not a namespace name"));
        }
        if !is_dns_subdomain(name) {
            return Err(format!("{s:?}: {name:?} is not a ServiceAccount name"));
        }
        Ok(Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }

    /// The user name Kubernetes gives it: `system:serviceaccount:<namespace>:<name>`.
    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }

    /// The groups a ServiceAccount's token carries; the apiserver gives them to an
    /// impersonated ServiceAccount when the request names no group.
    pub fn groups(&self) -> Vec<String> {
        vec![
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{}", self.namespace),
            "system:authenticated".to_string(),
        ]
    }

    /// Whether the owner's allow-list (`<namespace>/<name>` entries, or [`ANY`]) allows it.
    pub fn allowed_by(&self, allowed: &[String]) -> bool {
        allowed.iter().any(|a| {
            let a = a.trim();
            a == ANY || a == self.to_string()
        })
    }
}

impl fmt::Display for ServiceAccountRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_namespace_slash_name_and_names_its_identity() {
        let sa = ServiceAccountRef::parse("tender-system/tender-bundles").unwrap();
        assert_eq!(sa.namespace, "tender-system");
        assert_eq!(sa.name, "tender-bundles");
        assert_eq!(sa.to_string(), "tender-system/tender-bundles");
        assert_eq!(
            sa.user(),
            "system:serviceaccount:tender-system:tender-bundles"
        );
        assert_eq!(
            sa.groups(),
            [
                "system:serviceaccounts",
                "system:serviceaccounts:tender-system",
                "system:authenticated"
            ]
        );
        for bad in ["", "x", "/x", "x/", "Kube-System/x", "a/b/c", "a/B"] {
            assert!(ServiceAccountRef::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_allow_list_is_exact_or_a_star() {
        let sa = ServiceAccountRef::parse("apps/deployer").unwrap();
        assert!(!sa.allowed_by(&[]));
        assert!(!sa.allowed_by(&["apps/other".into(), "other/deployer".into()]));
        assert!(sa.allowed_by(&["apps/deployer".into()]));
        assert!(sa.allowed_by(&["*".into()]));
    }
}
