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

mod gate;
pub use gate::{ForwardedWrite, GatedIdentity, HoldPredicate, WriteGate};

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
