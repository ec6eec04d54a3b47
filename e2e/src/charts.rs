//! Charts for the Helm tests and the demo: a small chart packaged with the pinned Helm CLI,
//! and a chart repository on loopback serving it over HTTP (or HTTPS) with basic auth.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result, bail};
use base64::Engine;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::build::ensure_helm;

/// Runs the Helm CLI at `helm` with `args`; fails with Helm's stderr.
pub fn run_helm(helm: &Path, args: &[&str]) -> Result<String> {
    run_helm_with(helm, args, &[], None)
}

/// Runs the Helm CLI with `env` added and `stdin` (e.g. a password for `--password-stdin`).
pub fn run_helm_with(
    helm: &Path,
    args: &[&str],
    env: &[(&str, &Path)],
    stdin: Option<&str>,
) -> Result<String> {
    let mut child = Command::new(helm)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", helm.display()))?;
    let mut input = child.stdin.take().context("helm's stdin")?;
    input.write_all(stdin.unwrap_or_default().as_bytes())?;
    drop(input);
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("helm {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Writes chart `app` at `version` under `work` and packages it into `out`.
///
/// The chart renders `<release>-config` (a ConfigMap whose `greeting` is the required value
/// `greeting` and whose `version` is the chart's), a `pre-install` hook (a ConfigMap: done once
/// applied), and, before 0.2.0, `<release>-extra` (so an upgrade prunes it).
pub fn package_app_chart(helm: &Path, work: &Path, out: &Path, version: &str) -> Result<()> {
    let dir = work.join(format!("app-{version}"));
    std::fs::create_dir_all(dir.join("templates"))?;
    std::fs::create_dir_all(out)?;
    std::fs::write(
        dir.join("Chart.yaml"),
        format!("apiVersion: v2\nname: app\nversion: {version}\n"),
    )?;
    std::fs::write(dir.join("values.yaml"), "greeting: \"\"\n")?;
    std::fs::write(
        dir.join("templates/config.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-config\ndata:\n  \
         greeting: {{ required \"greeting is required\" .Values.greeting | quote }}\n  \
         version: {{ .Chart.Version | quote }}\n",
    )?;
    std::fs::write(
        dir.join("templates/hook.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-hook\n  \
         annotations:\n    helm.sh/hook: pre-install\n",
    )?;
    if version.starts_with("0.1.") {
        std::fs::write(
            dir.join("templates/extra.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-extra\n",
        )?;
    }
    run_helm(helm, &["package", path_str(&dir)?, "-d", path_str(out)?])?;
    Ok(())
}

pub(crate) fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .with_context(|| format!("{} is not UTF-8", p.display()))
}

/// A chart repository on loopback serving a directory with basic auth. It counts the
/// requests it refused (401), so a test can prove credentials were required. The
/// directory is removed and the server stops accepting when it is dropped.
pub struct ChartRepo {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Requests answered 401.
    pub unauthorized: Arc<AtomicUsize>,
    /// The directory served (`index.yaml` and the packaged charts).
    pub dir: PathBuf,
    root: PathBuf,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for ChartRepo {
    fn drop(&mut self) {
        self.server.abort();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl ChartRepo {
    /// Builds the pinned Helm if needed, packages `app` at each of `versions`, indexes them
    /// (`helm repo index`) and serves them, requiring `user`/`password`.
    pub async fn start(versions: &[&str], user: &str, password: &str) -> Result<ChartRepo> {
        let helm = ensure_helm()?;
        let root = std::env::temp_dir().join(crate::unique_name("tender-chart-repo"));
        let (work, dir) = (root.join("work"), root.join("repo"));
        std::fs::create_dir_all(&dir)?;
        for v in versions {
            package_app_chart(&helm, &work, &dir, v)?;
        }
        run_helm(&helm, &["repo", "index", path_str(&dir)?])?;
        Self::serve_dir(root, dir, user, password).await
    }

    /// As [`ChartRepo::start`], over HTTPS with the serving certificate `cert_pem` (for
    /// 127.0.0.1) and its key `key_pem`.
    pub async fn start_tls(
        versions: &[&str],
        user: &str,
        password: &str,
        cert_pem: &str,
        key_pem: &str,
    ) -> Result<ChartRepo> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let helm = ensure_helm()?;
        let root = std::env::temp_dir().join(crate::unique_name("tender-chart-repo"));
        let (work, dir) = (root.join("work"), root.join("repo"));
        std::fs::create_dir_all(&dir)?;
        for v in versions {
            package_app_chart(&helm, &work, &dir, v)?;
        }
        run_helm(&helm, &["repo", "index", path_str(&dir)?])?;
        let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("serving certificate: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| anyhow::anyhow!("serving key: {e}"))?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        Self::serve_dir_with(root, dir, user, password, Some(acceptor)).await
    }

    /// Serves `dir` (an indexed chart directory inside `root`), requiring `user`/`password`;
    /// `root` is removed when the repository is dropped.
    pub async fn serve_dir(
        root: PathBuf,
        dir: PathBuf,
        user: &str,
        password: &str,
    ) -> Result<ChartRepo> {
        Self::serve_dir_with(root, dir, user, password, None).await
    }

    /// Serves `dir` over HTTP, or HTTPS with `tls`.
    async fn serve_dir_with(
        root: PathBuf,
        dir: PathBuf,
        user: &str,
        password: &str,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Result<ChartRepo> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", listener.local_addr()?);
        let unauthorized = Arc::new(AtomicUsize::new(0));
        let expected = format!(
            "authorization: basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
        .to_lowercase();
        let (serve_dir, count) = (dir.clone(), unauthorized.clone());
        let server = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (dir, count, expected) = (serve_dir.clone(), count.clone(), expected.clone());
                match tls.clone() {
                    None => {
                        tokio::spawn(serve(conn, dir, count, expected));
                    }
                    Some(acceptor) => {
                        tokio::spawn(async move {
                            // A client that refuses the certificate ends here.
                            if let Ok(conn) = acceptor.accept(conn).await {
                                serve(conn, dir, count, expected).await;
                            }
                        });
                    }
                }
            }
        });
        Ok(ChartRepo {
            url,
            unauthorized,
            dir,
            root,
            server,
        })
    }

    /// Requests refused so far.
    pub fn refused(&self) -> usize {
        self.unauthorized.load(Ordering::SeqCst)
    }
}

/// The head of one HTTP/1.1 request, lowercased, and its path; `None` when the client left.
async fn read_head<S: AsyncRead + Unpin>(conn: &mut S) -> Option<(String, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65536 {
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).to_lowercase();
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
    Some((head, path))
}

/// Answers one HTTP/1.1 request: 401 without the expected credentials, else the file or 404.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut conn: S,
    dir: PathBuf,
    refused: Arc<AtomicUsize>,
    expected: String,
) {
    let Some((head, path)) = read_head(&mut conn).await else {
        return;
    };
    let authorized = head.lines().any(|l| l.trim() == expected);
    let (status, body) = if !authorized {
        refused.fetch_add(1, Ordering::SeqCst);
        ("401 Unauthorized", Vec::new())
    } else {
        match std::fs::read(dir.join(path.trim_start_matches('/'))) {
            Ok(b) => ("200 OK", b),
            Err(_) => ("404 Not Found", Vec::new()),
        }
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nWWW-Authenticate: Basic realm=\"charts\"\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(head.as_bytes()).await;
    let _ = conn.write_all(&body).await;
    let _ = conn.shutdown().await;
}

/// Writes chart `name` at `version` under `work` with `files` (paths inside the chart, e.g.
/// `templates/cm.yaml`) and packages it into `out`; returns the archive.
pub fn package_chart(
    helm: &Path,
    work: &Path,
    out: &Path,
    name: &str,
    version: &str,
    files: &[(&str, &[u8])],
) -> Result<Vec<u8>> {
    let dir = work.join(format!("{name}-{version}")).join(name);
    std::fs::create_dir_all(&dir)?;
    std::fs::create_dir_all(out)?;
    std::fs::write(
        dir.join("Chart.yaml"),
        format!("apiVersion: v2\nname: {name}\nversion: {version}\n"),
    )?;
    for (path, data) in files {
        let file = dir.join(path);
        std::fs::create_dir_all(file.parent().context("a file in a directory")?)?;
        std::fs::write(file, data)?;
    }
    run_helm(helm, &["package", path_str(&dir)?, "-d", path_str(out)?])?;
    Ok(std::fs::read(out.join(format!("{name}-{version}.tgz")))?)
}

/// An `index.yaml` listing chart `name` at each `(version, url)` (no digests: nothing is
/// taken from the cache, every render downloads).
pub fn index_yaml(name: &str, versions: &[(&str, &str)]) -> String {
    let mut out = format!("apiVersion: v1\nentries:\n  {name}:\n");
    for (version, url) in versions {
        out.push_str(&format!(
            "  - name: {name}\n    version: {version}\n    urls:\n    - {url}\n"
        ));
    }
    out
}

/// What a [`RouteRepo`] answers for one path.
#[derive(Clone, Debug)]
pub enum Route {
    /// 200 with this body.
    Body(Vec<u8>),
    /// 302 to this location.
    Redirect(String),
}

/// A chart repository on loopback that answers each path from a table, without auth: the
/// hostile server of the tests (oversized archives, redirects elsewhere). Every request it
/// receives is counted.
pub struct RouteRepo {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    routes: Arc<std::sync::Mutex<std::collections::BTreeMap<String, Route>>>,
    hits: Arc<AtomicUsize>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for RouteRepo {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl RouteRepo {
    /// Serves no path yet (everything 404) on a free loopback port.
    pub async fn start() -> Result<RouteRepo> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let routes = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
        let hits = Arc::new(AtomicUsize::new(0));
        let (table, count) = (routes.clone(), hits.clone());
        let server = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (table, count) = (table.clone(), count.clone());
                tokio::spawn(async move {
                    let Some((_, path)) = read_head(&mut conn).await else {
                        return;
                    };
                    count.fetch_add(1, Ordering::SeqCst);
                    let route = table
                        .lock()
                        .expect("routes")
                        .get(path.trim_start_matches('/'))
                        .cloned();
                    let (status, location, body) = match route {
                        Some(Route::Body(b)) => ("200 OK", String::new(), b),
                        Some(Route::Redirect(to)) => {
                            ("302 Found", format!("Location: {to}\r\n"), Vec::new())
                        }
                        None => ("404 Not Found", String::new(), Vec::new()),
                    };
                    let head = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\n{location}\
                         Connection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(&body).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        Ok(RouteRepo {
            url,
            routes,
            hits,
            server,
        })
    }

    /// Answers `path` (without the leading `/`) with `route` from now on.
    pub fn route(&self, path: &str, route: Route) {
        self.routes
            .lock()
            .expect("routes")
            .insert(path.to_string(), route);
    }

    /// A repository serving one chart: `name` at `version`, packaged by the pinned Helm from
    /// `files` (paths inside the chart, e.g. `templates/cm.yaml`), with its `index.yaml`.
    pub async fn serving_chart(
        name: &str,
        version: &str,
        files: &[(&str, &[u8])],
    ) -> Result<RouteRepo> {
        let helm = crate::ensure_helm()?;
        let root = std::env::temp_dir().join(crate::unique_name(&format!("chart-{name}")));
        let archive = package_chart(
            &helm,
            &root.join("work"),
            &root.join("out"),
            name,
            version,
            files,
        )?;
        let repo = RouteRepo::start().await?;
        let tgz = format!("{name}-{version}.tgz");
        repo.route(
            "index.yaml",
            Route::Body(
                index_yaml(name, &[(version, &format!("{}/{tgz}", repo.url))]).into_bytes(),
            ),
        );
        repo.route(&tgz, Route::Body(archive));
        Ok(repo)
    }

    /// Requests received so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}
