//! [`WriteGate`]: an HTTP proxy in front of one apiserver that can hold write requests.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Which write requests an armed gate holds: `(method, path)` (the path without its query).
pub type HoldPredicate = Arc<dyn Fn(&http::Method, &str) -> bool + Send + Sync>;

/// A write request the gate forwarded: when (wall clock, comparable with the apiserver's
/// timestamps on one machine) and `METHOD path`.
#[derive(Clone, Debug)]
pub struct ForwardedWrite {
    pub at: std::time::SystemTime,
    pub method: http::Method,
    pub path: String,
}

/// What a held write request is waiting for.
#[derive(Clone, Copy, Debug, Default)]
struct GateMode {
    /// Writes beyond the allowance are held.
    hold: bool,
    /// Bumped by [`WriteGate::discard_held`]: requests held before it are dropped, unsent.
    discards: u64,
}

struct GateState {
    upstream: kube::Client,
    mode: watch::Sender<GateMode>,
    /// Writes still let through after [`WriteGate::hold_writes_after`] armed the gate.
    allowance: AtomicU64,
    /// Which writes an armed gate holds (all of them when `None`).
    hold_only: std::sync::Mutex<Option<HoldPredicate>>,
    /// `METHOD path` of each write request being held right now.
    holding: std::sync::Mutex<Vec<String>>,
    /// Every write request forwarded, in order.
    forwarded: std::sync::Mutex<Vec<ForwardedWrite>>,
    held_total: AtomicU64,
    discarded: AtomicU64,
    forwarded_writes: AtomicU64,
    forwarded_reads: AtomicU64,
}

/// An HTTP/1.1 proxy in front of one apiserver that can hold write requests.
///
/// Towards the component it speaks plain HTTP on a loopback port (point a kubeconfig at
/// [`WriteGate::server`] with [`WriteGate::rewrite_kubeconfig`]); towards the apiserver it
/// sends every request with its own kube client (TLS and that client's credentials; the
/// component's `Authorization` header is dropped). So it sees each request's method and path,
/// which a TCP proxy in front of TLS cannot.
///
/// Open, it forwards everything. Armed ([`WriteGate::hold_writes_after`]), it lets a given
/// number of write requests (POST, PUT, PATCH, DELETE) through and then holds every further
/// one; armed with [`WriteGate::hold_only`], it holds the writes a predicate names (a Lease's
/// renewals) and forwards every other request: the request is read completely and not forwarded, and its client waits for the
/// response. Reads and watches pass all the while. [`WriteGate::release`] forwards what is
/// held; [`WriteGate::discard_held`] closes the held requests' connections without forwarding
/// them, as if the network had eaten them.
///
/// Dropping it stops the listener and closes every connection.
pub struct WriteGate {
    addr: SocketAddr,
    state: Arc<GateState>,
    closed: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl WriteGate {
    /// Starts an open gate on a free loopback port sending requests through `upstream`.
    pub async fn start(upstream: kube::Client) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(GateState {
            upstream,
            mode: watch::channel(GateMode::default()).0,
            allowance: AtomicU64::new(0),
            hold_only: std::sync::Mutex::new(None),
            holding: std::sync::Mutex::new(Vec::new()),
            forwarded: std::sync::Mutex::new(Vec::new()),
            held_total: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            forwarded_writes: AtomicU64::new(0),
            forwarded_reads: AtomicU64::new(0),
        });
        let (closed, _) = watch::channel(false);
        let accept = tokio::spawn(gate_accept_loop(listener, state.clone(), closed.clone()));
        Ok(Self {
            addr,
            state,
            closed,
            accept,
        })
    }

    /// `http://127.0.0.1:<port>` of the gate, to put into a kubeconfig.
    pub fn server(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Rewrites the `server:` of a kubeconfig that points at `upstream_server` to the gate.
    pub fn rewrite_kubeconfig(&self, kubeconfig: &str, upstream_server: &str) -> String {
        assert!(
            kubeconfig.contains(&format!("server: {upstream_server}")),
            "kubeconfig does not point at {upstream_server}"
        );
        kubeconfig.replace(
            &format!("server: {upstream_server}"),
            &format!("server: {}", self.server()),
        )
    }

    /// Arms the gate: the next `allowance` write requests pass, every one after them is held.
    pub fn hold_writes_after(&self, allowance: u64) {
        *self.state.hold_only.lock().unwrap() = None;
        self.state.allowance.store(allowance, Ordering::SeqCst);
        self.state.mode.send_modify(|m| m.hold = true);
    }

    /// Arms the gate for some writes only: every write request for which `hold` answers true
    /// (given its method and path) is held; every other request flows.
    pub fn hold_only(&self, hold: impl Fn(&http::Method, &str) -> bool + Send + Sync + 'static) {
        self.hold_matching_after(0, hold);
    }

    /// Like [`WriteGate::hold_writes_after`] for the writes `hold` names only: the next
    /// `allowance` of them pass, every one after them is held; writes it does not name (a
    /// Lease's renewals) flow and use no allowance.
    pub fn hold_matching_after(
        &self,
        allowance: u64,
        hold: impl Fn(&http::Method, &str) -> bool + Send + Sync + 'static,
    ) {
        *self.state.hold_only.lock().unwrap() = Some(Arc::new(hold));
        self.state.allowance.store(allowance, Ordering::SeqCst);
        self.state.mode.send_modify(|m| m.hold = true);
    }

    /// Disarms the gate and forwards every held request.
    pub fn release(&self) {
        self.state.mode.send_modify(|m| m.hold = false);
    }

    /// Disarms the gate and drops every held request unsent (its connection is closed).
    pub fn discard_held(&self) {
        self.state.mode.send_modify(|m| {
            m.hold = false;
            m.discards += 1;
        });
    }

    /// `METHOD path` of every write request held right now.
    pub fn holding(&self) -> Vec<String> {
        self.state.holding.lock().unwrap().clone()
    }

    /// Write requests held so far (released or discarded ones included).
    pub fn held_total(&self) -> u64 {
        self.state.held_total.load(Ordering::SeqCst)
    }

    /// Held write requests dropped unsent by [`WriteGate::discard_held`] so far.
    pub fn discarded(&self) -> u64 {
        self.state.discarded.load(Ordering::SeqCst)
    }

    /// Write requests forwarded to the apiserver so far.
    pub fn forwarded_writes(&self) -> u64 {
        self.state.forwarded_writes.load(Ordering::SeqCst)
    }

    /// Every write request forwarded so far, in order, with when it was forwarded.
    pub fn forwarded_log(&self) -> Vec<ForwardedWrite> {
        self.state.forwarded.lock().unwrap().clone()
    }

    /// Read requests (watches included) forwarded to the apiserver so far.
    pub fn forwarded_reads(&self) -> u64 {
        self.state.forwarded_reads.load(Ordering::SeqCst)
    }
}

impl Drop for WriteGate {
    fn drop(&mut self) {
        self.accept.abort();
        self.closed.send_replace(true);
    }
}

async fn gate_accept_loop(
    listener: TcpListener,
    state: Arc<GateState>,
    closed: watch::Sender<bool>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        let mut closed = closed.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                _ = serve_gated(client, &state) => {}
                _ = closed.wait_for(|c| *c) => {}
            }
        });
    }
}

/// One HTTP/1.1 request as read from the component.
struct HttpRequest {
    method: http::Method,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl HttpRequest {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn is_write(&self) -> bool {
        use http::Method;
        [Method::POST, Method::PUT, Method::PATCH, Method::DELETE].contains(&self.method)
    }

    /// The target without its query.
    fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }

    fn is_watch(&self) -> bool {
        self.target
            .split_once('?')
            .is_some_and(|(_, q)| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
    }

    /// The request to send upstream: hop-by-hop headers, `Host` and the component's own
    /// credentials dropped (the gate's client adds its own).
    fn upstream(&self) -> io::Result<http::Request<Vec<u8>>> {
        const DROP: [&str; 6] = [
            "host",
            "authorization",
            "connection",
            "content-length",
            "transfer-encoding",
            "keep-alive",
        ];
        let mut builder = http::Request::builder()
            .method(self.method.clone())
            .uri(self.target.as_str());
        for (k, v) in &self.headers {
            if !DROP.contains(&k.as_str()) {
                builder = builder.header(k.as_str(), v.as_str());
            }
        }
        builder.body(self.body.clone()).map_err(io::Error::other)
    }
}

/// Reads one request; `None` when the component closed the connection between requests.
async fn read_request<R>(r: &mut R) -> io::Result<Option<HttpRequest>>
where
    R: tokio::io::AsyncBufRead + Unpin,
{
    use tokio::io::AsyncBufReadExt;
    let mut line = String::new();
    if r.read_line(&mut line).await? == 0 {
        return Ok(None);
    }
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(bad("no request line"));
    };
    let method = http::Method::from_bytes(method.as_bytes()).map_err(|_| bad("bad method"))?;
    let target = target.to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).await? == 0 {
            return Err(bad("connection closed in the headers"));
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').ok_or_else(|| bad("bad header"))?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let mut request = HttpRequest {
        method,
        target,
        headers,
        body: Vec::new(),
    };
    if request.header("transfer-encoding").is_some() {
        return Err(bad("chunked request bodies are not supported"));
    }
    let len: usize = match request.header("content-length") {
        Some(v) => v.parse().map_err(|_| bad("bad content-length"))?,
        None => 0,
    };
    request.body = vec![0; len];
    r.read_exact(&mut request.body).await?;
    Ok(Some(request))
}

async fn write_head<W>(w: &mut W, status: u16, headers: &[(&str, &str)]) -> io::Result<()>
where
    W: tokio::io::AsyncWrite + Unpin,
{
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let mut head = format!("HTTP/1.1 {status} {reason}\r\n");
    for (k, v) in headers {
        head += &format!("{k}: {v}\r\n");
    }
    head += "\r\n";
    w.write_all(head.as_bytes()).await
}

/// A complete response with a body of known length.
async fn write_response<W>(
    w: &mut W,
    status: u16,
    content_type: &str,
    body: &[u8],
) -> io::Result<()>
where
    W: tokio::io::AsyncWrite + Unpin,
{
    let len = body.len().to_string();
    write_head(
        w,
        status,
        &[("Content-Type", content_type), ("Content-Length", &len)],
    )
    .await?;
    w.write_all(body).await?;
    w.flush().await
}

/// A failed upstream request as the apiserver would answer it: a `Status` with its code.
async fn write_error<W>(w: &mut W, error: kube::Error) -> io::Result<()>
where
    W: tokio::io::AsyncWrite + Unpin,
{
    let status = match error {
        kube::Error::Api(status) => *status,
        other => kube::core::Status::failure(&other.to_string(), "BadGateway").with_code(502),
    };
    let body = serde_json::to_vec(&status).map_err(io::Error::other)?;
    let code = if status.code >= 400 { status.code } else { 502 };
    write_response(w, code, "application/json", &body).await
}

/// Serves one component connection: requests in sequence (HTTP/1.1 keep-alive).
async fn serve_gated(client: TcpStream, state: &GateState) -> io::Result<()> {
    let _ = client.set_nodelay(true);
    let (read, mut w) = client.into_split();
    let mut r = tokio::io::BufReader::new(read);
    while let Some(request) = read_request(&mut r).await? {
        let close = request
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"));
        if request.is_write() {
            if !admit_write(state, &request).await {
                // Discarded: the connection goes away with the request unsent.
                return Ok(());
            }
            state.forwarded_writes.fetch_add(1, Ordering::SeqCst);
            state.forwarded.lock().unwrap().push(ForwardedWrite {
                at: std::time::SystemTime::now(),
                method: request.method.clone(),
                path: request.path().to_string(),
            });
        } else {
            state.forwarded_reads.fetch_add(1, Ordering::SeqCst);
        }
        if request.is_watch() {
            // A watch streams until the apiserver or the component ends it.
            return stream_watch(state, request, &mut r, &mut w).await;
        }
        match state
            .upstream
            .send(request.upstream()?.map(kube::client::Body::from))
            .await
        {
            Ok(response) => {
                let (parts, body) = response.into_parts();
                let content_type = parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("application/json")
                    .to_string();
                match body.collect_bytes().await {
                    Ok(bytes) => {
                        write_response(&mut w, parts.status.as_u16(), &content_type, &bytes)
                            .await?;
                    }
                    Err(e) => return write_error(&mut w, e).await,
                }
            }
            Err(e) => write_error(&mut w, e).await?,
        }
        if close {
            return Ok(());
        }
    }
    Ok(())
}

/// Lets a write request through, or holds it while the gate is armed and its allowance spent.
/// `false` when it was discarded while held.
async fn admit_write(state: &GateState, request: &HttpRequest) -> bool {
    let mut mode = state.mode.subscribe();
    let at_arrival = *mode.borrow_and_update();
    let spared = state
        .hold_only
        .lock()
        .unwrap()
        .as_ref()
        .is_some_and(|hold| !hold(&request.method, request.path()));
    if !at_arrival.hold
        || spared
        || state
            .allowance
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |a| a.checked_sub(1))
            .is_ok()
    {
        return true;
    }
    let what = format!("{} {}", request.method, request.path());
    state.holding.lock().unwrap().push(what.clone());
    state.held_total.fetch_add(1, Ordering::SeqCst);
    let seen = at_arrival.discards;
    let end = mode
        .wait_for(|m| !m.hold || m.discards != seen)
        .await
        .map(|m| *m)
        .unwrap_or(GateMode {
            hold: false,
            discards: seen + 1,
        });
    let mut holding = state.holding.lock().unwrap();
    if let Some(i) = holding.iter().position(|h| *h == what) {
        holding.remove(i);
    }
    if end.discards != seen {
        state.discarded.fetch_add(1, Ordering::SeqCst);
        return false;
    }
    true
}

/// Forwards a watch and streams its events back in chunks until either side ends it.
async fn stream_watch<R, W>(
    state: &GateState,
    request: HttpRequest,
    from_client: &mut R,
    w: &mut W,
) -> io::Result<()>
where
    R: tokio::io::AsyncBufRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    use futures::AsyncBufReadExt as _;
    use tokio::io::AsyncBufReadExt as _;
    let events = match state.upstream.request_stream(request.upstream()?).await {
        Ok(events) => events,
        Err(e) => return write_error(w, e).await,
    };
    let mut events = Box::pin(events);
    write_head(
        w,
        200,
        &[
            ("Content-Type", "application/json"),
            ("Transfer-Encoding", "chunked"),
            // Not reused after the watch: the component opens a fresh connection for the next.
            ("Connection", "close"),
        ],
    )
    .await?;
    w.flush().await?;
    loop {
        tokio::select! {
            chunk = events.fill_buf() => {
                let chunk = chunk?;
                if chunk.is_empty() {
                    break;
                }
                let n = chunk.len();
                w.write_all(format!("{n:x}\r\n").as_bytes()).await?;
                w.write_all(chunk).await?;
                w.write_all(b"\r\n").await?;
                w.flush().await?;
                events.consume_unpin(n);
            }
            // The component sends nothing while it waits for a watch; readable means closed.
            _ = from_client.fill_buf() => return Ok(()),
        }
    }
    w.write_all(b"0\r\n\r\n").await?;
    w.flush().await
}

/// A chart's ServiceAccount reaching its apiserver through a [`WriteGate`]: the gate sends with
/// a token of that ServiceAccount (so RBAC and the audit log see the chart's identity), and
/// [`GatedIdentity::kubeconfig`] is the file a process started with `--kubeconfig` reads.
pub struct GatedIdentity {
    pub gate: WriteGate,
    /// The kubeconfig file pointing at the gate.
    pub kubeconfig: std::path::PathBuf,
    /// `system:serviceaccount:<namespace>:<name>`.
    pub user: String,
}

impl GatedIdentity {
    /// A gate (open) for the ServiceAccount of `deployment` (stored on `cluster`).
    ///
    /// # Panics
    /// When the Deployment names no ServiceAccount or no token can be had for it.
    pub async fn of_deployment(
        env: &crate::TestEnv,
        cluster: &str,
        deployment: &k8s_openapi::api::apps::v1::Deployment,
    ) -> Self {
        use kube::ResourceExt;
        let namespace = deployment.namespace().expect("a namespaced Deployment");
        let service_account = deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.service_account_name.clone())
            .expect("the Deployment names its ServiceAccount");
        let server = env.cluster(cluster).server.clone();
        let client = env.client(cluster).await.unwrap();
        let identity = crate::local_pod::service_account_kubeconfig(
            &client,
            &server,
            env.ca_pem(),
            &namespace,
            &service_account,
        )
        .await
        .unwrap();
        let gate = WriteGate::start(crate::client_from_yaml(&identity).await.unwrap())
            .await
            .unwrap();
        let kubeconfig = env.state_dir().join(crate::unique_name("gated-kubeconfig"));
        std::fs::write(&kubeconfig, gate.rewrite_kubeconfig(&identity, &server)).unwrap();
        Self {
            gate,
            kubeconfig,
            user: crate::audit::service_account_user(&namespace, &service_account),
        }
    }

    /// `--kubeconfig=<the gated file>`, for [`crate::running::Running::start`]'s flags.
    pub fn flag(&self) -> (&'static str, String) {
        ("--kubeconfig", self.kubeconfig.display().to_string())
    }
}
