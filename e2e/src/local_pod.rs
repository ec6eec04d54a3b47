//! Running a Deployment's container as a local process, the way a kubelet would start it:
//! the container's args and env (field references resolved), its Secret volumes written to
//! files, and the pod's ServiceAccount identity as a kubeconfig carrying a token from the
//! TokenRequest API. Tests start tender's real binaries from what a chart or `tender cluster
//! add` produced, with the identity those manifests grant — not as admin.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, PostParams};

/// A container ready to run as a process.
#[derive(Debug, Clone)]
pub struct LocalPod {
    /// The container's args, Secret mount paths rewritten to local files.
    pub args: Vec<String>,
    /// The container's environment.
    pub env: Vec<(String, String)>,
    /// Kubeconfig of the pod's ServiceAccount (what in-cluster config would give it).
    pub kubeconfig: PathBuf,
}

impl LocalPod {
    /// Sets `--flag=value`, replacing the flag if the container already sets it.
    pub fn set_flag(&mut self, flag: &str, value: &str) {
        let prefix = format!("{flag}=");
        self.args.retain(|a| a != flag && !a.starts_with(&prefix));
        self.args.push(format!("{flag}={value}"));
    }
}

/// A kubeconfig for `namespace/service_account` on the apiserver at `server`, with a token
/// from the TokenRequest API.
pub async fn service_account_kubeconfig(
    client: &kube::Client,
    server: &str,
    ca_pem: &str,
    namespace: &str,
    service_account: &str,
) -> Result<String> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
        .with_context(|| {
            format!("requesting a token for ServiceAccount {namespace}/{service_account}")
        })?
        .status
        .and_then(|s| s.token)
        .context("TokenRequest answered without a token")?;
    let user = format!("system:serviceaccount:{namespace}:{service_account}");
    Ok(tender_runtime::kubeconfig::TokenKubeconfig {
        name: "in-cluster",
        server,
        ca_pem: ca_pem.as_bytes(),
        user: &user,
        token: &token,
        namespace: Some(namespace),
    }
    .to_yaml())
}

/// Prepares the first container of `deployment` (as stored on the apiserver of `client`)
/// to run as pod `pod_name`, writing its files under `dir`.
pub async fn local_pod(
    client: &kube::Client,
    server: &str,
    ca_pem: &str,
    deployment: &Deployment,
    pod_name: &str,
    dir: &Path,
) -> Result<LocalPod> {
    let namespace = deployment
        .metadata
        .namespace
        .clone()
        .context("Deployment without namespace")?;
    let pod = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .context("Deployment without a pod template")?;
    let container = pod.containers.first().context("pod without containers")?;
    fs::create_dir_all(dir)?;

    let mut env = Vec::new();
    for e in container.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("metadata.name") => pod_name.to_string(),
                Some("metadata.namespace") => namespace.clone(),
                other => bail!("env {} from {other:?} is not supported here", e.name),
            },
            (None, None) => String::new(),
        };
        env.push((e.name.clone(), value));
    }

    // Secret volumes become directories of files, one per key, like the kubelet mounts them;
    // emptyDir volumes empty directories.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let mut mounts = Vec::new();
    for m in container.volume_mounts.iter().flatten() {
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == m.name)
            .with_context(|| format!("volume {} is not defined", m.name))?;
        let local = dir.join("volumes").join(&m.name);
        fs::create_dir_all(&local)?;
        // An emptyDir is an empty directory of the pod's own.
        if volume.empty_dir.is_some() {
            mounts.push((m.mount_path.trim_end_matches('/').to_string(), local));
            continue;
        }
        let secret_name = volume
            .secret
            .as_ref()
            .and_then(|s| s.secret_name.clone())
            .with_context(|| format!("volume {} is not a Secret or emptyDir volume", m.name))?;
        let secret = secrets
            .get(&secret_name)
            .await
            .with_context(|| format!("reading Secret {namespace}/{secret_name}"))?;
        for (key, value) in secret.data.unwrap_or_default() {
            fs::write(local.join(&key), &value.0)?;
        }
        mounts.push((m.mount_path.trim_end_matches('/').to_string(), local));
    }
    let args = container
        .args
        .iter()
        .flatten()
        .map(|arg| {
            let mut arg = arg.clone();
            for (mount, local) in &mounts {
                arg = arg.replace(&format!("{mount}/"), &format!("{}/", local.display()));
            }
            arg
        })
        .collect();

    let service_account = pod.service_account_name.as_deref().unwrap_or("default");
    let kubeconfig = dir.join("serviceaccount.kubeconfig");
    fs::write(
        &kubeconfig,
        service_account_kubeconfig(client, server, ca_pem, &namespace, service_account).await?,
    )?;
    Ok(LocalPod {
        args,
        env,
        kubeconfig,
    })
}
