//! A push Cluster's kubeconfig: parsed, checked against what the hub must never do with it,
//! and turned into a client configuration with timeouts.
//!
//! [`check`] is pure. Nothing here quotes the kubeconfig: a parse error of the YAML library
//! may cite the offending text (a token, a key), so problems are described in our own words.

use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Why a kubeconfig is not used. Messages never contain any of its content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Unparsable or unusable; the message says which part, not what it holds.
    Invalid(String),
    /// It would run a command in the hub (`exec` plugin) or an `auth-provider`, and the hub
    /// was not started with `--allow-kubeconfig-exec`.
    ExecNotAllowed(&'static str),
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Invalid(why) => f.write_str(why),
            Self::ExecNotAllowed(what) => write!(
                f,
                "the kubeconfig's user uses {what}, which would run a command inside the hub; \
                 the hub refuses it unless started with --allow-kubeconfig-exec"
            ),
        }
    }
}

fn invalid(why: impl Into<String>) -> Problem {
    Problem::Invalid(why.into())
}

/// Parses `bytes` and checks the current context: it must exist and name a cluster with a
/// server and a user; nothing may point at a file (the hub pod's own files, such as its
/// service-account token, would be read and sent to whatever server the kubeconfig names);
/// `exec` and `auth-provider` only with `allow_exec`. Returns the kubeconfig with its current
/// context set.
pub fn check(bytes: &[u8], allow_exec: bool) -> Result<Kubeconfig, Problem> {
    let text =
        std::str::from_utf8(bytes).map_err(|_| invalid("the kubeconfig is not UTF-8 text"))?;
    let mut config = Kubeconfig::from_yaml(text)
        .map_err(|_| invalid("the kubeconfig cannot be parsed as a kubeconfig (YAML)"))?;
    let current = match (&config.current_context, config.contexts.as_slice()) {
        (Some(name), _) if !name.is_empty() => name.clone(),
        (_, [only]) => only.name.clone(),
        _ => {
            return Err(invalid(
                "the kubeconfig has no current-context (and more or fewer than one context)",
            ));
        }
    };
    let context = config
        .contexts
        .iter()
        .find(|c| c.name == current)
        .and_then(|c| c.context.clone())
        .ok_or_else(|| {
            invalid(format!(
                "the kubeconfig's current-context {current:?} is not among its contexts"
            ))
        })?;
    let cluster = config
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| {
            invalid(format!(
                "cluster {:?} of context {current:?} is not in the kubeconfig",
                context.cluster
            ))
        })?;
    if cluster.server.as_deref().is_none_or(str::is_empty) {
        return Err(invalid(format!(
            "cluster {:?} has no server",
            context.cluster
        )));
    }
    if cluster.certificate_authority.is_some() {
        return Err(invalid(
            "certificate-authority names a file, which the hub does not read; use certificate-authority-data",
        ));
    }
    let user_name = context
        .user
        .clone()
        .ok_or_else(|| invalid(format!("context {current:?} names no user")))?;
    let user = config
        .auth_infos
        .iter()
        .find(|u| u.name == user_name)
        .and_then(|u| u.auth_info.as_ref())
        .ok_or_else(|| {
            invalid(format!(
                "user {user_name:?} of context {current:?} is not in the kubeconfig"
            ))
        })?;
    if user.token_file.is_some() || user.client_certificate.is_some() || user.client_key.is_some() {
        return Err(invalid(
            "the user names a file (tokenFile, client-certificate or client-key), which the hub does not read; embed the data instead",
        ));
    }
    if !allow_exec {
        if user.exec.is_some() {
            return Err(Problem::ExecNotAllowed("an exec plugin"));
        }
        if user.auth_provider.is_some() {
            return Err(Problem::ExecNotAllowed("an auth-provider"));
        }
    }
    config.current_context = Some(current);
    Ok(config)
}

/// Timeouts of a push cluster's client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP + TLS connect.
    pub connect: Duration,
    /// Waiting for a response (reset by every write, so an idle pooled connection does not
    /// count against it). Longer than a watch's server-side timeout (290 s).
    pub read: Duration,
    /// Sending a request.
    pub write: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            read: Duration::from_secs(295),
            write: Duration::from_secs(30),
        }
    }
}

/// The client configuration of a checked kubeconfig, with `timeouts`.
pub async fn client_config(
    kubeconfig: Kubeconfig,
    timeouts: Timeouts,
) -> Result<kube::Config, Problem> {
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        // The loader's errors describe structure (missing URL, bad base64), but stay cautious.
        .map_err(|_| invalid("the kubeconfig's cluster or user data cannot be loaded (server URL, certificate or key data)"))?;
    config.connect_timeout = Some(timeouts.connect);
    config.read_timeout = Some(timeouts.read);
    config.reset_reader_on_write = true;
    config.write_timeout = Some(timeouts.write);
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "s3cr3t-token-value";

    fn kubeconfig(user: &str) -> String {
        format!(
            "apiVersion: v1
kind: Config
current-context: edge
clusters:
- name: edge
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority-data: Q0EtREFUQQ==
contexts:
- name: edge
  context:
    cluster: edge
    user: edge-user
users:
- name: edge-user
  user:
{user}
"
        )
    }

    fn token_user() -> String {
        format!("    token: {TOKEN}")
    }

    const EXEC_USER: &str = "    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: /bin/sh
      args: [\"-c\", \"cat /var/run/secrets/kubernetes.io/serviceaccount/token\"]
      interactiveMode: Never";

    const AUTH_PROVIDER_USER: &str = "    auth-provider:
      name: oidc
      config:
        cmd-path: /bin/sh";

    #[test]
    fn a_token_kubeconfig_is_accepted_with_its_context() {
        let config = check(kubeconfig(&token_user()).as_bytes(), false).unwrap();
        assert_eq!(config.current_context.as_deref(), Some("edge"));
    }

    #[test]
    fn exec_and_auth_provider_are_refused_unless_allowed() {
        let exec = kubeconfig(EXEC_USER);
        assert_eq!(
            check(exec.as_bytes(), false).err(),
            Some(Problem::ExecNotAllowed("an exec plugin"))
        );
        assert!(
            check(exec.as_bytes(), true).is_ok(),
            "allowed by the operator"
        );
        let provider = kubeconfig(AUTH_PROVIDER_USER);
        assert_eq!(
            check(provider.as_bytes(), false).err(),
            Some(Problem::ExecNotAllowed("an auth-provider"))
        );
        assert!(check(provider.as_bytes(), true).is_ok());
        assert!(
            Problem::ExecNotAllowed("an exec plugin")
                .to_string()
                .contains("--allow-kubeconfig-exec"),
            "the message says how to allow it"
        );
    }

    #[test]
    fn file_references_are_refused_even_with_exec_allowed() {
        for user in [
            "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
            "    client-certificate: /etc/tls/tls.crt\n    client-key: /etc/tls/tls.key",
        ] {
            assert!(
                matches!(
                    check(kubeconfig(user).as_bytes(), true),
                    Err(Problem::Invalid(_))
                ),
                "{user}"
            );
        }
        let ca_file = kubeconfig(&token_user()).replace(
            "certificate-authority-data: Q0EtREFUQQ==",
            "certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
        );
        assert!(matches!(
            check(ca_file.as_bytes(), true),
            Err(Problem::Invalid(_))
        ));
    }

    #[test]
    fn broken_kubeconfigs_are_invalid_and_never_quoted() {
        let good = kubeconfig(&token_user());
        let cases = [
            format!("{good}\n  : [unbalanced {TOKEN}"),
            good.replace("current-context: edge", "current-context: other"),
            good.replace(
                "    cluster: edge\n    user",
                "    cluster: nowhere\n    user",
            ),
            good.replace("    server: https://10.0.0.1:6443\n", ""),
            good.replace("    user: edge-user", "    user: nobody"),
            "not: [a, kubeconfig".to_string(),
        ];
        for case in &cases {
            match check(case.as_bytes(), false) {
                Err(Problem::Invalid(why)) => {
                    assert!(!why.contains(TOKEN), "the problem quotes the token: {why}");
                    assert!(
                        !why.contains("Q0EtREFUQQ=="),
                        "the problem quotes CA data: {why}"
                    );
                }
                other => panic!("{case}\n→ {other:?}"),
            }
        }
        assert!(matches!(
            check(&[0xff, 0xfe], false),
            Err(Problem::Invalid(_))
        ));
    }

    #[test]
    fn a_single_context_without_current_context_is_used() {
        let config = kubeconfig(&token_user()).replace("current-context: edge\n", "");
        assert_eq!(
            check(config.as_bytes(), false)
                .unwrap()
                .current_context
                .as_deref(),
            Some("edge")
        );
    }

    #[tokio::test]
    async fn client_config_sets_the_timeouts() {
        let config = kubeconfig(&token_user()).replace(
            "certificate-authority-data: Q0EtREFUQQ==",
            "insecure-skip-tls-verify: true",
        );
        let checked = check(config.as_bytes(), false).unwrap();
        let timeouts = Timeouts {
            connect: Duration::from_secs(3),
            read: Duration::from_secs(60),
            write: Duration::from_secs(7),
        };
        let config = client_config(checked, timeouts).await.unwrap();
        assert_eq!(config.connect_timeout, Some(Duration::from_secs(3)));
        assert_eq!(config.read_timeout, Some(Duration::from_secs(60)));
        assert_eq!(config.write_timeout, Some(Duration::from_secs(7)));
        assert!(config.reset_reader_on_write);
        assert_eq!(config.cluster_url.to_string(), "https://10.0.0.1:6443/");
    }
}
