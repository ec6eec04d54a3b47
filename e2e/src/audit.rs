//! The apiservers' audit logs: every request of an identity under test and what the apiserver
//! answered it, as the apiserver saw it — a refusal is counted where it happens, not searched
//! for in tender's own logs (which would pass if tender logged nothing, or logged it in other
//! words).
//!
//! Every apiserver of the environment writes `<state-dir>/<cluster>/audit.log` (JSON lines,
//! level `Metadata`: no request or response bodies, so no Secret content). The environment's
//! admin (the tests themselves, the controller-manager) and the apiserver's own loopback
//! client are left out by the [`crate::env::AUDIT_POLICY`]: what remains is tender's identities (the hub's
//! ServiceAccount, agents, the Bundle ServiceAccounts they impersonate), the restricted test
//! users, and every request that failed authentication.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::env::ADMIN_USER;

/// The name every 401 is counted under: the apiserver could not tell who sent it.
pub const UNAUTHENTICATED: &str = "(unauthenticated)";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(default)]
    stage: String,
    #[serde(default)]
    verb: String,
    #[serde(default)]
    request_uri: String,
    #[serde(default)]
    user: Option<UserInfo>,
    #[serde(default)]
    impersonated_user: Option<UserInfo>,
    #[serde(default)]
    response_status: Option<ResponseStatus>,
    #[serde(default)]
    stage_timestamp: String,
}

#[derive(Debug, Deserialize)]
struct UserInfo {
    #[serde(default)]
    username: String,
}

#[derive(Debug, Deserialize)]
struct ResponseStatus {
    #[serde(default)]
    code: u16,
}

/// One answered request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The identity the request was authorized as: the impersonated user if any, else the
    /// authenticated one ([`UNAUTHENTICATED`] for a 401).
    pub user: String,
    /// Who sent it, when it was impersonated.
    pub sent_by: Option<String>,
    pub code: u16,
    pub verb: String,
    pub uri: String,
    /// RFC 3339 with microseconds, as the apiserver wrote it.
    pub at: String,
}

impl Answer {
    /// 401 or 403.
    pub fn is_refusal(&self) -> bool {
        matches!(self.code, 401 | 403)
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {} {}", self.at, self.code, self.verb, self.uri)?;
        match &self.sent_by {
            Some(by) => write!(f, " as {} (sent by {by})", self.user),
            None => write!(f, " as {}", self.user),
        }
    }
}

/// Every completed request of one audit log.
#[derive(Clone, Debug, Default)]
pub struct Audit {
    pub answers: Vec<Answer>,
}

/// The audit log of a test cluster's apiserver, kept here so the environment needs nothing
/// of this module.
impl crate::env::TestEnv {
    /// What `cluster`'s apiserver answered each identity under test so far.
    pub fn audit(&self, cluster: &str) -> Audit {
        Audit::read(&self.audit_log(cluster))
    }
}

impl Audit {
    /// Reads an audit log (a missing file is an empty log; a line that does not parse, such
    /// as one being written right now, is skipped).
    pub fn read(path: &Path) -> Self {
        Self::parse(&std::fs::read_to_string(path).unwrap_or_default())
    }

    /// Parses audit JSON lines.
    pub fn parse(text: &str) -> Self {
        let answers = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Event>(l).ok())
            .filter(|e| e.stage == "ResponseComplete" || e.stage == "Panic")
            .map(|e| {
                let authenticated = e.user.map(|u| u.username).filter(|u| !u.is_empty());
                let impersonated = e
                    .impersonated_user
                    .map(|u| u.username)
                    .filter(|u| !u.is_empty());
                let code = e.response_status.map_or(0, |s| s.code);
                let (user, sent_by) = match (impersonated, authenticated) {
                    (Some(as_user), by) => (as_user, by),
                    (None, Some(user)) => (user, None),
                    (None, None) => (UNAUTHENTICATED.to_string(), None),
                };
                Answer {
                    user,
                    sent_by,
                    code,
                    verb: e.verb,
                    uri: e.request_uri,
                    at: e.stage_timestamp,
                }
            })
            .filter(|a| a.user != ADMIN_USER)
            .collect();
        Self { answers }
    }

    /// How many requests of `user` were answered at all (so that "no refusal" of an identity
    /// that never reached the apiserver cannot pass).
    pub fn answered(&self, user: &str) -> usize {
        self.answers.iter().filter(|a| a.user == user).count()
    }

    /// The 401 and 403 answers to `user` (or sent by `user` as someone else).
    pub fn refusals_of(&self, user: &str) -> Vec<&Answer> {
        self.answers
            .iter()
            .filter(|a| a.is_refusal())
            .filter(|a| a.user == user || a.sent_by.as_deref() == Some(user))
            .collect()
    }

    /// The number of 401 and 403 answers by identity.
    pub fn refusals_by_user(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for a in self.answers.iter().filter(|a| a.is_refusal()) {
            *out.entry(a.user.clone()).or_default() += 1;
        }
        out
    }

    /// Asserts that `user` reached the apiserver and was refused nothing; `what` names the
    /// identity in the failure message.
    ///
    /// # Panics
    /// When `user` sent no request at all, or was answered 401 or 403.
    pub fn assert_never_refused(&self, user: &str, what: &str) {
        assert!(
            self.answered(user) > 0,
            "{what} ({user}) never reached the apiserver: an empty audit proves nothing"
        );
        let refused = self.refusals_of(user);
        assert!(
            refused.is_empty(),
            "{what} ({user}) was refused {} time(s) by the apiserver:\n{}",
            refused.len(),
            refused
                .iter()
                .take(20)
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// The username of ServiceAccount `namespace/name`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/x/secrets","verb":"list","user":{"username":"system:serviceaccount:tender-system:tender-hub"},"responseStatus":{"metadata":{},"code":200},"stageTimestamp":"2026-12-02T12:00:00.000001Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/y/secrets","verb":"create","user":{"username":"system:serviceaccount:tender-system:tender-hub"},"responseStatus":{"metadata":{},"status":"Failure","reason":"Forbidden","code":403},"stageTimestamp":"2026-12-02T12:00:01.000001Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/apps/configmaps","verb":"create","user":{"username":"system:serviceaccount:tender-system:tender-agent"},"impersonatedUser":{"username":"system:serviceaccount:tender-system:tender-bundle"},"responseStatus":{"metadata":{},"code":403},"stageTimestamp":"2026-12-02T12:00:02.000001Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete","requestURI":"/api","verb":"get","user":{},"responseStatus":{"metadata":{},"code":401},"stageTimestamp":"2026-12-02T12:00:03.000001Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete","requestURI":"/api","verb":"get","user":{"username":"tender-admin"},"responseStatus":{"metadata":{},"code":403},"stageTimestamp":"2026-12-02T12:00:03.000001Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"Respo"#;

    #[test]
    fn refusals_are_counted_per_identity_impersonation_included() {
        let audit = Audit::parse(LOG);
        let hub = service_account_user("tender-system", "tender-hub");
        let agent = service_account_user("tender-system", "tender-agent");
        let bundle = service_account_user("tender-system", "tender-bundle");
        assert_eq!(audit.answered(&hub), 2);
        assert_eq!(audit.refusals_of(&hub).len(), 1);
        assert_eq!(audit.refusals_of(&bundle).len(), 1);
        // The agent sent the impersonated request: its refusal shows for the agent too.
        assert_eq!(audit.refusals_of(&agent).len(), 1);
        assert_eq!(
            audit.refusals_by_user(),
            BTreeMap::from([
                (UNAUTHENTICATED.to_string(), 1),
                (bundle.clone(), 1),
                (hub.clone(), 1)
            ])
        );
        // The half-written last line is skipped; the admin is never counted.
        assert_eq!(audit.answers.len(), 4);
    }

    #[test]
    #[should_panic(expected = "never reached the apiserver")]
    fn an_identity_absent_from_the_log_is_not_proof_of_anything() {
        Audit::parse(LOG).assert_never_refused("system:serviceaccount:a:b", "someone");
    }

    #[test]
    #[should_panic(expected = "was refused 1 time(s)")]
    fn a_refused_identity_fails_the_assertion() {
        let hub = service_account_user("tender-system", "tender-hub");
        Audit::parse(LOG).assert_never_refused(&hub, "the hub");
    }

    #[test]
    fn the_policy_leaves_out_the_admin_the_tests_use() {
        assert!(crate::env::AUDIT_POLICY.contains(&format!("\"{ADMIN_USER}\"")));
    }
}
