//! Kubeconfigs tender hands out (an agent's hub identity, test users), serialised from kube's
//! own `Kubeconfig` type rather than assembled as text.

use base64::Engine;
use kube::config::{Context, Kubeconfig, NamedCluster, NamedContext};

/// A kubeconfig with one cluster, one bearer-token user and one context.
#[derive(Debug, Clone)]
pub struct TokenKubeconfig<'a> {
    /// Name of the cluster and of the context.
    pub name: &'a str,
    /// `https://host:port` of the apiserver.
    pub server: &'a str,
    /// PEM of the CA that signs the apiserver's certificate.
    pub ca_pem: &'a [u8],
    /// Name of the user entry.
    pub user: &'a str,
    /// The bearer token.
    pub token: &'a str,
    /// Default namespace of the context.
    pub namespace: Option<&'a str>,
}

impl TokenKubeconfig<'_> {
    /// The kubeconfig as kube's type.
    pub fn to_kubeconfig(&self) -> Kubeconfig {
        let cluster = kube::config::Cluster {
            server: Some(self.server.to_string()),
            certificate_authority_data: Some(
                base64::engine::general_purpose::STANDARD.encode(self.ca_pem),
            ),
            ..Default::default()
        };
        // The token field is a secret string; building it through serde keeps it one.
        let auth_info = serde_json::from_value(serde_json::json!({
            "name": self.user,
            "user": {"token": self.token},
        }))
        .expect("a token user is a valid kubeconfig user");
        Kubeconfig {
            api_version: Some("v1".into()),
            kind: Some("Config".into()),
            clusters: vec![NamedCluster {
                name: self.name.to_string(),
                cluster: Some(cluster),
                ..Default::default()
            }],
            auth_infos: vec![auth_info],
            contexts: vec![NamedContext {
                name: self.name.to_string(),
                context: Some(Context {
                    cluster: self.name.to_string(),
                    user: Some(self.user.to_string()),
                    namespace: self.namespace.map(str::to_string),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            current_context: Some(self.name.to_string()),
            ..Default::default()
        }
    }

    /// The kubeconfig as YAML.
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(&self.to_kubeconfig()).expect("a kubeconfig serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_kubes_reader() {
        let text = TokenKubeconfig {
            name: "hub",
            server: "https://hub:6443",
            ca_pem: b"CA",
            user: "tender-agent",
            token: "tok",
            namespace: Some("cluster-ns"),
        }
        .to_yaml();
        let parsed = Kubeconfig::from_yaml(&text).expect("kube reads what we write");
        assert_eq!(parsed.current_context.as_deref(), Some("hub"));
        let cluster = parsed.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://hub:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
        let context = parsed.contexts[0].context.as_ref().unwrap();
        assert_eq!(context.namespace.as_deref(), Some("cluster-ns"));
        assert_eq!(context.user.as_deref(), Some("tender-agent"));
        assert!(text.contains("token: tok"), "{text}");
    }
}
