//! Who a BundleDeployment's content is written as downstream
//! (decision 0079-bundles-applied-as-an-impersonated-service-account): the downstream owner's
//! Bundle ServiceAccount (`--bundle-service-account`), or one the Bundle names
//! (`spec.serviceAccount`) when the owner allows it (`--allow-bundle-service-accounts`), or — with
//! no Bundle ServiceAccount configured — the agent itself. Writes as a ServiceAccount go through a
//! client impersonating it, so Kubernetes RBAC bounds what any Bundle can do; the agent's own
//! identity keeps reading (caches, conflict checks) and its own objects.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tender_runtime::Executor;
use tender_types::conditions::reason;
use tender_types::service_account::ServiceAccountRef;

/// The identity a deployment is applied as: `Ok(None)` the agent itself, `Ok(Some(sa))` that
/// ServiceAccount, `Err` the status message refusing it (`ServiceAccountNotAllowed: …`). Pure.
pub fn applies_as(
    requested: Option<&str>,
    default: Option<&ServiceAccountRef>,
    allowed: &[String],
) -> Result<Option<ServiceAccountRef>, String> {
    let Some(requested) = requested.filter(|r| !r.is_empty()) else {
        return Ok(default.cloned());
    };
    let refuse = |why: String| Err(format!("{}: {why}", reason::SERVICE_ACCOUNT_NOT_ALLOWED));
    let sa = match ServiceAccountRef::parse(requested) {
        Ok(sa) => sa,
        Err(e) => return refuse(e),
    };
    if default == Some(&sa) || sa.allowed_by(allowed) {
        Ok(Some(sa))
    } else {
        refuse(format!(
            "this cluster's owner does not allow Bundles to be applied as ServiceAccount {sa} \
             (--allow-bundle-service-accounts); nothing of this deployment is applied here"
        ))
    }
}

/// The downstream executors by identity, all sharing the agent executor's memo and metrics.
pub(crate) struct Identities {
    agent: Arc<Executor>,
    default: Option<ServiceAccountRef>,
    allowed: Vec<String>,
    writers: Mutex<HashMap<ServiceAccountRef, Arc<Executor>>>,
}

impl Identities {
    /// Identities over `agent` (the agent's own downstream executor).
    pub(crate) fn new(
        agent: Arc<Executor>,
        default: Option<ServiceAccountRef>,
        allowed: Vec<String>,
    ) -> Self {
        Self {
            agent,
            default,
            allowed,
            writers: Mutex::new(HashMap::new()),
        }
    }

    /// The executor writing the content of a deployment that names `requested` (its
    /// `options.serviceAccount`), or the refusal message.
    pub(crate) fn writer(&self, requested: Option<&str>) -> Result<Arc<Executor>, String> {
        let Some(sa) = applies_as(requested, self.default.as_ref(), &self.allowed)? else {
            return Ok(self.agent.clone());
        };
        let mut writers = self.writers.lock().expect("writers");
        if let Some(w) = writers.get(&sa) {
            return Ok(w.clone());
        }
        // No Impersonate-Group: for a ServiceAccount user the apiserver adds its groups itself
        // (`system:serviceaccounts`, `system:serviceaccounts:<ns>`, `system:authenticated`),
        // so the agent needs `impersonate` on that ServiceAccount only, never on groups.
        let client =
            tender_runtime::impersonate::impersonating(self.agent.client(), &sa.user(), &[])
                .map_err(|e| format!("{}: {sa}: {e}", reason::SERVICE_ACCOUNT_NOT_ALLOWED))?;
        let w = Arc::new(self.agent.with_client(client));
        writers.insert(sa, w.clone());
        Ok(w)
    }

    /// The executor for cleanup of a deployment that names `requested`: its own identity, or
    /// the default one when it is refused (a refused deployment wrote nothing as another).
    pub(crate) fn cleanup_writer(&self, requested: Option<&str>) -> Arc<Executor> {
        self.writer(requested)
            .or_else(|_| self.writer(None))
            .unwrap_or_else(|_| self.agent.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> ServiceAccountRef {
        ServiceAccountRef::parse(s).unwrap()
    }

    #[test]
    fn without_a_bundle_service_account_the_agent_applies_as_itself() {
        assert_eq!(applies_as(None, None, &[]), Ok(None));
        assert_eq!(applies_as(Some(""), None, &[]), Ok(None));
    }

    #[test]
    fn the_default_applies_unless_the_bundle_names_an_allowed_one() {
        let default = sa("tender-system/tender-bundles");
        assert_eq!(
            applies_as(None, Some(&default), &[]),
            Ok(Some(default.clone()))
        );
        // Naming the default is always allowed.
        assert_eq!(
            applies_as(Some("tender-system/tender-bundles"), Some(&default), &[]),
            Ok(Some(default.clone()))
        );
        let allowed = vec!["apps/deployer".to_string()];
        assert_eq!(
            applies_as(Some("apps/deployer"), Some(&default), &allowed),
            Ok(Some(sa("apps/deployer")))
        );
        assert_eq!(
            applies_as(Some("kube-system/admin"), Some(&default), &["*".into()]),
            Ok(Some(sa("kube-system/admin")))
        );
    }

    #[test]
    fn a_service_account_the_owner_did_not_allow_is_refused_with_its_reason() {
        let default = sa("tender-system/tender-bundles");
        for (requested, allowed) in [
            ("kube-system/admin", vec![]),
            ("kube-system/admin", vec!["apps/deployer".to_string()]),
            // Without a default, naming one needs the allow-list too.
            ("apps/deployer", vec![]),
            ("not a name", vec!["*".to_string()]),
        ] {
            let d = (requested != "apps/deployer").then_some(&default);
            let refused = applies_as(Some(requested), d, &allowed).unwrap_err();
            assert!(
                refused.starts_with("ServiceAccountNotAllowed: "),
                "{requested}: {refused}"
            );
        }
    }
}
