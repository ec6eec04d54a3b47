//! A real OCI registry on loopback for the Helm OCI tests: distribution's registry built from
//! its Go module (`e2e/tools/registry`), filesystem storage in a temp directory, one user in a
//! bcrypt htpasswd file, and either `auth: htpasswd` (a Basic challenge) or `auth: token`
//! with the helper's Bearer token issuer. Charts are pushed with the pinned Helm CLI
//! (`helm registry login` + `helm push --plain-http`) under a temporary HOME, so nothing
//! touches the user's Helm or Docker files. Processes stop and files go when it is dropped.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::build::{ensure_helm, ensure_oci_registry};
use crate::charts::{package_app_chart, path_str, run_helm_with};
use crate::env::free_port;
use crate::process::Process;

/// How the registry asks for credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegistryAuth {
    /// `WWW-Authenticate: Basic` (distribution's htpasswd auth).
    Basic,
    /// `WWW-Authenticate: Bearer realm=…` (distribution's token auth + the helper's issuer).
    Token,
}

/// A running registry with one user; the chart `app` is pushed to `charts/app`.
pub struct OciRegistry {
    /// `127.0.0.1:<port>`.
    pub host: String,
    root: PathBuf,
    helm: PathBuf,
    registry: Process,
    token: Option<Process>,
}

impl Drop for OciRegistry {
    fn drop(&mut self) {
        self.registry.stop(Duration::from_secs(5));
        if let Some(t) = &mut self.token {
            t.stop(Duration::from_secs(5));
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl OciRegistry {
    /// Builds the registry and Helm if needed, starts the registry (and, for
    /// [`RegistryAuth::Token`], its token issuer) and logs Helm in as `user`.
    pub async fn start(auth: RegistryAuth, user: &str, password: &str) -> Result<OciRegistry> {
        let bin = ensure_oci_registry()?;
        let helm = ensure_helm()?;
        let root = std::env::temp_dir().join(crate::unique_name("tender-oci-registry"));
        std::fs::create_dir_all(root.join("data"))?;
        std::fs::create_dir_all(root.join("helm-home"))?;
        let htpasswd = std::process::Command::new(&bin)
            .args(["htpasswd", user])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .expect("piped stdin")
                    .write_all(format!("{password}\n").as_bytes())?;
                child.wait_with_output()
            })
            .context("writing the htpasswd file")?;
        if !htpasswd.status.success() {
            bail!("`registry htpasswd` failed ({})", htpasswd.status);
        }
        std::fs::write(root.join("htpasswd"), &htpasswd.stdout)?;

        let token = match auth {
            RegistryAuth::Basic => None,
            RegistryAuth::Token => Some(Process::start(
                "oci-token-server",
                &bin,
                &["token-server".to_string(), path_str(&root)?.to_string()],
                &root.join("token.log"),
            )?),
        };
        let auth_config = match auth {
            RegistryAuth::Basic => format!(
                "  htpasswd:\n    realm: tender-test\n    path: {}\n",
                root.join("htpasswd").display()
            ),
            RegistryAuth::Token => {
                let addr = wait_for_file(&root.join("token-addr"))?;
                format!(
                    "  token:\n    realm: http://{addr}/token\n    service: tender-test-registry\n    \
                     issuer: tender-test-issuer\n    jwks: {}\n",
                    root.join("jwks.json").display()
                )
            }
        };
        let host = format!("127.0.0.1:{}", free_port()?);
        let config = root.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: {host}\nauth:\n{auth_config}",
                root.join("data").display()
            ),
        )?;
        let registry = Process::start(
            "oci-registry",
            &bin,
            &["serve".to_string(), path_str(&config)?.to_string()],
            &root.join("registry.log"),
        )?;
        let reg = OciRegistry {
            host,
            root,
            helm,
            registry,
            token,
        };
        reg.wait_listening().await?;
        reg.helm(
            &[
                "registry",
                "login",
                &reg.host,
                "--username",
                user,
                "--password-stdin",
                "--plain-http",
            ],
            Some(password),
        )?;
        Ok(reg)
    }

    async fn wait_listening(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&self.host).await.is_err() {
            if Instant::now() > deadline {
                bail!(
                    "the registry did not listen on {} within 30s: {}",
                    self.host,
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Runs Helm with this registry's temporary HOME and registry config.
    fn helm(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let home = self.root.join("helm-home");
        let config = home.join("registry.json");
        run_helm_with(
            &self.helm,
            args,
            &[
                ("HOME", &home),
                ("HELM_REGISTRY_CONFIG", &config),
                ("HELM_CONFIG_HOME", &home),
                ("HELM_CACHE_HOME", &home),
                ("HELM_DATA_HOME", &home),
                ("DOCKER_CONFIG", &home),
            ],
            stdin,
        )
    }

    /// `oci://<host>/charts/app`.
    pub fn chart(&self) -> String {
        format!("oci://{}/charts/app", self.host)
    }

    /// Packages chart `app` at `version` and pushes it (Helm tags `+` as `_`).
    pub fn push_app_chart(&self, version: &str) -> Result<()> {
        let out = self.root.join("packages");
        package_app_chart(&self.helm, &self.root.join("work"), &out, version)?;
        let tgz = out.join(format!("app-{version}.tgz"));
        let target = format!("oci://{}/charts", self.host);
        self.helm(&["push", path_str(&tgz)?, &target, "--plain-http"], None)?;
        Ok(())
    }

    /// Overwrites the stored chart layer of `version` with bytes of the same length, so the
    /// registry serves content that no longer matches its digest.
    pub fn corrupt_chart(&self, version: &str) -> Result<()> {
        let tgz = self
            .root
            .join("packages")
            .join(format!("app-{version}.tgz"));
        let digest = hex::encode(Sha256::digest(std::fs::read(&tgz)?));
        let blob = self
            .root
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&digest[..2])
            .join(&digest)
            .join("data");
        let mut bytes =
            std::fs::read(&blob).with_context(|| format!("reading {}", blob.display()))?;
        for b in &mut bytes {
            *b = !*b;
        }
        std::fs::write(&blob, bytes)?;
        Ok(())
    }

    /// Requests from tender's agent (its User-Agent) the registry or its token issuer
    /// answered 401.
    pub fn agent_refused(&self) -> usize {
        let registry = self.lines("registry.log", "\" 401 ");
        let token = self.lines("token.log", "token: refused");
        registry + token
    }

    /// Requests from tender's agent the registry answered 200.
    pub fn agent_served(&self) -> usize {
        self.lines("registry.log", "\" 200 ")
    }

    fn lines(&self, file: &str, needle: &str) -> usize {
        std::fs::read_to_string(self.root.join(file))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle) && l.contains("tender-agent/"))
            .count()
    }

    /// The registry's log (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("registry.log")).unwrap_or_default()
    }
}

/// Waits for a file a child writes atomically once it is ready; returns its content.
fn wait_for_file(path: &Path) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return Ok(text.trim().to_string());
        }
        if Instant::now() > deadline {
            bail!("{} did not appear within 30s", path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
