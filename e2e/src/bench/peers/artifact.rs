//! Flux artifacts served by the bench: gzipped tarballs of manifests, over loopback HTTP.
//!
//! The tarball is written by hand (ustar headers, deflate "stored" blocks inside gzip): it
//! is a few KB, and Flux only needs a valid `.tar.gz` whose SHA-256 matches the digest the
//! bench writes into the `ExternalArtifact` status.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use sha2::{Digest, Sha256};

/// A ustar header block for a regular file.
fn tar_header(name: &str, size: usize) -> [u8; 512] {
    let mut h = [0u8; 512];
    let mut put = |at: usize, bytes: &[u8]| h[at..at + bytes.len()].copy_from_slice(bytes);
    put(0, name.as_bytes());
    put(100, b"0000644\0");
    put(108, b"0000000\0");
    put(116, b"0000000\0");
    put(124, format!("{size:011o}\0").as_bytes());
    put(136, b"00000000000\0");
    put(148, b"        ");
    put(156, b"0");
    put(257, b"ustar\0");
    put(263, b"00");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// CRC-32 (IEEE), as gzip's trailer needs it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A `.tar.gz` holding `files` (name, content) at its root.
pub fn tar_gz(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut tar = Vec::new();
    for (name, body) in files {
        tar.extend_from_slice(&tar_header(name, body.len()));
        tar.extend_from_slice(body);
        tar.resize(tar.len().div_ceil(512) * 512, 0);
    }
    tar.resize(tar.len() + 1024, 0);
    let mut gz = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let mut chunks = tar.chunks(0xffff).peekable();
    while let Some(chunk) = chunks.next() {
        gz.push(u8::from(chunks.peek().is_none()));
        let len = chunk.len() as u16;
        gz.extend_from_slice(&len.to_le_bytes());
        gz.extend_from_slice(&(!len).to_le_bytes());
        gz.extend_from_slice(chunk);
    }
    gz.extend_from_slice(&crc32(&tar).to_le_bytes());
    gz.extend_from_slice(&(tar.len() as u32).to_le_bytes());
    gz
}

/// `sha256:<hex>` of `data`, the digest format Flux checks.
pub fn digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

type Files = Arc<Mutex<HashMap<String, Vec<u8>>>>;

/// Serves files by name on a loopback port until dropped.
pub struct Server {
    pub addr: SocketAddr,
    files: Files,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub async fn start() -> Result<Server> {
        let files: Files = Arc::default();
        let app = axum::Router::new()
            .route(
                "/{file}",
                get(
                    |State(files): State<Files>, Path(file): Path<String>| async move {
                        match files.lock().expect("files lock").get(&file) {
                            Some(body) => Ok(body.clone()),
                            None => Err(StatusCode::NOT_FOUND),
                        }
                    },
                ),
            )
            .with_state(files.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Server { addr, files, task })
    }

    /// Publishes `body` as `file`; returns its URL.
    pub fn publish(&self, file: &str, body: Vec<u8>) -> String {
        self.files
            .lock()
            .expect("files lock")
            .insert(file.to_string(), body);
        format!("http://{}/{file}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}
