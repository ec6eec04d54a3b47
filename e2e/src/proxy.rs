//! A small in-process TCP proxy that a test can cut and restore, to take an apiserver away from
//! one component (an agent's hub connection, one hub replica) while everything else keeps it.
//!
//! The proxy forwards raw TCP, so TLS is end to end: a kubeconfig pointed at the proxy still
//! validates the apiserver's certificate (its serving certificate has IP SAN 127.0.0.1).
//! [`TcpProxy::cut`] closes every open connection at once and refuses new ones (the listener
//! keeps its port, so a restore can never lose it to another process: a connection arriving
//! while cut is accepted and reset at once, which a client sees as a refused connection).
//!
//! A TCP proxy in front of TLS cannot tell one request from another. [`WriteGate`] can: it is an
//! HTTP/1.1 proxy (plain HTTP on loopback towards the component, TLS with its own admin client
//! towards the apiserver) that holds write requests once armed, so a test can stop a component
//! in the middle of a write it has provably sent.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Connection counters of a [`TcpProxy`].
#[derive(Debug, Default)]
struct Counters {
    forwarded: AtomicU64,
    refused: AtomicU64,
    cut: AtomicU64,
}

/// A TCP proxy on `127.0.0.1:<port>` forwarding to one upstream address.
///
/// Dropping it stops the listener and closes every connection.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    open: watch::Sender<bool>,
    counters: Arc<Counters>,
    accept: JoinHandle<()>,
}

impl TcpProxy {
    /// Starts a proxy on a free loopback port forwarding to `upstream`, open.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (open, _) = watch::channel(true);
        let counters = Arc::new(Counters::default());
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream,
            open.clone(),
            counters.clone(),
        ));
        Ok(Self {
            addr,
            open,
            counters,
            accept,
        })
    }

    /// Starts a proxy for the `https://host:port` address of an apiserver.
    pub async fn for_server(server: &str) -> io::Result<Self> {
        let hostport = server
            .strip_prefix("https://")
            .unwrap_or(server)
            .trim_end_matches('/');
        let upstream: SocketAddr = hostport.parse().map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{server} is not https://ip:port: {e}"),
            )
        })?;
        Self::start(upstream).await
    }

    /// The proxy's own address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:<port>` of the proxy, to put into a kubeconfig.
    pub fn server(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Rewrites the `server:` of a kubeconfig that points at `upstream_server` to the proxy.
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

    /// Closes every open connection now and refuses new ones until [`TcpProxy::restore`].
    pub fn cut(&self) {
        self.open.send_replace(false);
    }

    /// Accepts and forwards connections again.
    pub fn restore(&self) {
        self.open.send_replace(true);
    }

    /// Whether the proxy forwards right now.
    pub fn is_open(&self) -> bool {
        *self.open.borrow()
    }

    /// Connections forwarded so far.
    pub fn forwarded(&self) -> u64 {
        self.counters.forwarded.load(Ordering::Relaxed)
    }

    /// Connections refused (attempted while cut) so far.
    pub fn refused(&self) -> u64 {
        self.counters.refused.load(Ordering::Relaxed)
    }

    /// Open connections closed by [`TcpProxy::cut`] so far.
    pub fn cut_connections(&self) -> u64 {
        self.counters.cut.load(Ordering::Relaxed)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Wakes every connection task, which closes its sockets.
        self.open.send_replace(false);
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    open: watch::Sender<bool>,
    counters: Arc<Counters>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if !*open.borrow() {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            // RST instead of FIN: the client sees a reset, like a refused connection.
            reset_on_close(&client);
            drop(client);
            continue;
        }
        counters.forwarded.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(forward(
            client,
            upstream,
            open.subscribe(),
            counters.clone(),
        ));
    }
}

async fn forward(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut open: watch::Receiver<bool>,
    counters: Arc<Counters>,
) {
    let _ = client.set_nodelay(true);
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = server.set_nodelay(true);
    let cut = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => false,
        _ = open.wait_for(|open| !*open) => true,
    };
    if cut {
        counters.cut.fetch_add(1, Ordering::Relaxed);
        reset_on_close(&client);
        reset_on_close(&server);
    }
}

/// `SO_LINGER` with a zero timeout: closing the socket sends RST at once (never blocks).
#[allow(unsafe_code)] // libc calls, each with a SAFETY comment
fn reset_on_close(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid open socket fd and a correctly sized `linger` value.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Status code of one `GET path` on a fresh connection to `addr` (probes of an
/// in-process component's `/healthz`, `/readyz`).
pub async fn http_status(addr: SocketAddr, path: &str) -> io::Result<u16> {
    Ok(http_get(addr, path).await?.0)
}

/// `GET path` on `addr` (plain HTTP/1.0, e.g. a process's `/metrics`): status and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let response = String::from_utf8_lossy(&response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| io::Error::other(format!("no status line in {response:?}")))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

// ---------------------------------------------------------------------------------------------
// WriteGate: an HTTP proxy that can hold write requests.

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
    /// `METHOD path` of each write request being held right now.
    holding: std::sync::Mutex<Vec<String>>,
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
/// one: the request is read completely and not forwarded, and its client waits for the
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
            holding: std::sync::Mutex::new(Vec::new()),
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
    if !at_arrival.hold
        || state
            .allowance
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |a| a.checked_sub(1))
            .is_ok()
    {
        return true;
    }
    let what = format!(
        "{} {}",
        request.method,
        request.target.split('?').next().unwrap_or_default()
    );
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
