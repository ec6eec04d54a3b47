//! Running a Deployment's container as a local process, the way a kubelet would start it:
//! the container's args and env (field references resolved), its Secret volumes written to
//! files, and the pod's ServiceAccount identity as a kubeconfig carrying a token from the
//! TokenRequest API. Tests start tender's real binaries from what a chart or `tender cluster
//! add` produced, with the identity those manifests grant — not as admin.
//!
//! The process runs under bubblewrap (`bwrap`) with the pod's securityContext and volumes: the
//! host's root read-only when `readOnlyRootFilesystem` (else writable), a user namespace with
//! `runAsUser`/`runAsGroup` (65532 when only `runAsNonRoot` is set), fresh `/dev` and `/proc`,
//! each Secret volume's files read-only and each `emptyDir` a fresh writable directory, both at
//! their `mountPath`; the network is the host's and the log goes through the parent's fds. So a
//! binary that writes anywhere its chart does not give it a volume fails here as in a cluster.

use std::collections::BTreeSet;
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
    /// bubblewrap's arguments (before `--`): the pod's securityContext and volumes.
    pub sandbox: Vec<String>,
}

impl LocalPod {
    /// Sets `--flag=value`, replacing the flag if the container already sets it.
    pub fn set_flag(&mut self, flag: &str, value: &str) {
        let prefix = format!("{flag}=");
        self.args.retain(|a| a != flag && !a.starts_with(&prefix));
        self.args.push(format!("{flag}={value}"));
    }

    /// The command that runs `program` as this container: `bwrap <sandbox> -- program <args>`.
    pub fn command(&self, program: &Path) -> (PathBuf, Vec<String>) {
        let mut args = self.sandbox.clone();
        args.push("--".into());
        args.push(program.display().to_string());
        args.extend(self.args.iter().cloned());
        (PathBuf::from("bwrap"), args)
    }
}

/// The uid the pod's process runs as when `runAsNonRoot` is set without `runAsUser` (the
/// distroless `nonroot` user the images use).
pub const NON_ROOT_UID: i64 = 65532;

/// A volume as the container sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where the container sees it.
    pub mount_path: String,
    /// The local directory holding it.
    pub local: PathBuf,
    /// Read-only (Secret volumes) or writable (emptyDir).
    pub read_only: bool,
}

/// What one entry of a host directory is: a symlink (its target) or anything else.
pub type Entry = (PathBuf, Option<PathBuf>);

/// bubblewrap's arguments for a container: `read_only_root`, running as `uid`/`gid`, with
/// `mounts`. A mount point missing on the host is made in a tmpfs laid over its deepest existing
/// ancestor, which first gets that ancestor's entries back (read-only binds, symlinks as
/// symlinks; `entries` lists a host directory) and is made read-only again afterwards.
pub fn sandbox_args(
    read_only_root: bool,
    uid: i64,
    gid: i64,
    mounts: &[Mount],
    exists: impl Fn(&Path) -> bool,
    entries: impl Fn(&Path) -> Vec<Entry>,
) -> Result<Vec<String>> {
    let s = |x: &str| x.to_string();
    let mut out = vec![
        s("--unshare-user"),
        s("--uid"),
        uid.to_string(),
        s("--gid"),
        gid.to_string(),
        s("--die-with-parent"),
        s(if read_only_root {
            "--ro-bind"
        } else {
            "--bind"
        }),
        s("/"),
        s("/"),
        s("--dev"),
        s("/dev"),
        s("--proc"),
        s("/proc"),
    ];
    let mut overlaid = BTreeSet::new();
    for m in mounts {
        let path = Path::new(&m.mount_path);
        if exists(path) {
            continue;
        }
        let ancestor = path
            .ancestors()
            .skip(1)
            .find(|a| exists(a))
            .unwrap_or(Path::new("/"));
        if ancestor == Path::new("/") {
            bail!(
                "mountPath {} would need a new top-level directory",
                m.mount_path
            );
        }
        overlaid.insert(ancestor.to_path_buf());
    }
    for dir in &overlaid {
        out.extend([s("--tmpfs"), dir.display().to_string()]);
        for (entry, symlink) in entries(dir) {
            match symlink {
                Some(target) => out.extend([
                    s("--symlink"),
                    target.display().to_string(),
                    entry.display().to_string(),
                ]),
                None => out.extend([
                    s("--ro-bind-try"),
                    entry.display().to_string(),
                    entry.display().to_string(),
                ]),
            }
        }
    }
    for m in mounts {
        out.extend([
            s(if m.read_only { "--ro-bind" } else { "--bind" }),
            m.local.display().to_string(),
            m.mount_path.clone(),
        ]);
    }
    if read_only_root {
        for dir in &overlaid {
            out.extend([s("--remount-ro"), dir.display().to_string()]);
        }
    }
    Ok(out)
}

/// The entries of host directory `dir` (empty when it cannot be read).
fn host_entries(dir: &Path) -> Vec<Entry> {
    let Ok(read) = fs::read_dir(dir) else {
        return Vec::new();
    };
    read.flatten()
        .map(|e| {
            let path = e.path();
            let link = fs::read_link(&path).ok();
            (path, link)
        })
        .collect()
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
    // an emptyDir a fresh directory.
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
        if volume.empty_dir.is_some() {
            mounts.push(Mount {
                mount_path: m.mount_path.trim_end_matches('/').to_string(),
                local,
                read_only: m.read_only.unwrap_or(false),
            });
            continue;
        }
        let secret_name = volume
            .secret
            .as_ref()
            .and_then(|s| s.secret_name.clone())
            .with_context(|| format!("volume {} is neither a Secret nor an emptyDir", m.name))?;
        let secret = secrets
            .get(&secret_name)
            .await
            .with_context(|| format!("reading Secret {namespace}/{secret_name}"))?;
        for (key, value) in secret.data.unwrap_or_default() {
            fs::write(local.join(&key), &value.0)?;
        }
        mounts.push(Mount {
            mount_path: m.mount_path.trim_end_matches('/').to_string(),
            local,
            read_only: true,
        });
    }
    let args = container.args.clone().unwrap_or_default();

    // The securityContext: the container's fields win over the pod's.
    let (pod_sc, sc) = (
        pod.security_context.as_ref(),
        container.security_context.as_ref(),
    );
    let non_root = sc
        .and_then(|c| c.run_as_non_root)
        .or(pod_sc.and_then(|p| p.run_as_non_root))
        .unwrap_or(false);
    let uid = sc
        .and_then(|c| c.run_as_user)
        .or(pod_sc.and_then(|p| p.run_as_user))
        .unwrap_or(if non_root { NON_ROOT_UID } else { 0 });
    let gid = sc
        .and_then(|c| c.run_as_group)
        .or(pod_sc.and_then(|p| p.run_as_group))
        .unwrap_or(uid);
    let read_only_root = sc
        .and_then(|c| c.read_only_root_filesystem)
        .unwrap_or(false);
    let sandbox = sandbox_args(
        read_only_root,
        uid,
        gid,
        &mounts,
        Path::exists,
        host_entries,
    )?;

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
        sandbox,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(path: &str, read_only: bool) -> Mount {
        Mount {
            mount_path: path.into(),
            local: PathBuf::from("/state/volumes").join(path.rsplit('/').next().unwrap()),
            read_only,
        }
    }

    #[test]
    fn missing_mount_points_are_made_in_a_tmpfs_over_their_ancestor() {
        let host = ["/", "/etc", "/var", "/var/cache", "/var/cache/apt"];
        let exists = |p: &Path| host.contains(&p.to_str().unwrap());
        let entries = |d: &Path| -> Vec<Entry> {
            match d.to_str().unwrap() {
                "/etc" => vec![
                    (PathBuf::from("/etc/passwd"), None),
                    (
                        PathBuf::from("/etc/mtab"),
                        Some(PathBuf::from("../proc/mounts")),
                    ),
                ],
                "/var/cache" => vec![(PathBuf::from("/var/cache/apt"), None)],
                _ => Vec::new(),
            }
        };
        let mounts = [
            mount("/etc/tender/hub", true),
            mount("/var/cache/tender", false),
        ];
        let args = sandbox_args(true, 65532, 65532, &mounts, exists, entries).unwrap();
        let text = args.join(" ");
        assert!(
            text.starts_with(
                "--unshare-user --uid 65532 --gid 65532 --die-with-parent --ro-bind / / --dev /dev --proc /proc"
            ),
            "{text}"
        );
        for want in [
            "--tmpfs /etc --ro-bind-try /etc/passwd /etc/passwd --symlink ../proc/mounts /etc/mtab",
            "--tmpfs /var/cache --ro-bind-try /var/cache/apt /var/cache/apt",
            "--ro-bind /state/volumes/hub /etc/tender/hub",
            "--bind /state/volumes/tender /var/cache/tender",
            "--remount-ro /etc --remount-ro /var/cache",
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
        // Volumes are bound after the overlays, and the overlays made read-only after them.
        let pos = |w: &str| text.find(w).unwrap();
        assert!(pos("--tmpfs /var/cache") < pos("--bind /state/volumes/tender"));
        assert!(pos("--bind /state/volumes/tender") < pos("--remount-ro /etc"));

        // A writable root stays writable; a mount point that exists is bound directly.
        let args = sandbox_args(
            false,
            0,
            0,
            &[mount("/var/cache/apt", false)],
            exists,
            entries,
        )
        .unwrap()
        .join(" ");
        assert!(
            args.contains("--bind / /") && !args.contains("--tmpfs"),
            "{args}"
        );
        assert!(sandbox_args(true, 0, 0, &[mount("/new", false)], exists, entries).is_err());
    }
}
