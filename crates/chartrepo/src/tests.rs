//! The client against canned HTTP/1.1 servers on loopback.

use std::sync::{Arc, Mutex};

use tender_types::conditions::reason;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::{Budget, Http, OciRef, Session, Side, Trust, basic_auth, system_roots};

const TEST: Side = Side {
    user_agent: "tender-test",
    redirect_hint: " (test hint)",
    without_credentials_hint: " (set credentials)",
};

/// A server answering each request (method and path, whole head) with a raw response; it
/// records every request head it read.
struct Server {
    base: String,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Server {
    async fn start(answer: impl Fn(&str, &str) -> String + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (answer, record) = (Arc::new(answer), seen.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let (answer, record) = (answer.clone(), record.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head).to_string();
                    let path = head.split(' ').nth(1).unwrap_or_default().to_string();
                    record.lock().unwrap().push(head.clone());
                    let _ = conn.write_all(answer(&path, &head).as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        Self { base, seen }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// A raw response with a `Content-Length`.
fn reply(status: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    out
}

fn client() -> Http {
    Http::new(
        TEST,
        Vec::new(),
        Trust::default().client_config(&system_roots()),
    )
}

fn budget(limit: u64) -> Budget {
    Budget::new(limit, "repository index", "test bound")
}

const INDEX: &str = "apiVersion: v1\nentries:\n  app:\n    - version: 1.0.0\n      urls: [app-1.0.0.tgz]\n    - version: 1.1.0\n      urls: [app-1.1.0.tgz]\n";

fn has_header(head: &str, name: &str, value: &str) -> bool {
    head.lines().any(|l| {
        l.split_once(':')
            .is_some_and(|(k, v)| k.trim().eq_ignore_ascii_case(name) && v.trim() == value)
    })
}

#[tokio::test]
async fn an_index_is_read_with_basic_auth_sent_to_its_origin() {
    let auth = basic_auth("alice", "s3cret");
    let expected = auth.clone();
    let repo = Server::start(move |path, head| match path {
        _ if !has_header(head, "authorization", &expected) => reply("401 Unauthorized", &[], ""),
        "/charts/index.yaml" => reply("200 OK", &[], INDEX),
        "/other/index.yaml" => reply("200 OK", &[], "this is not an index: ["),
        _ => reply("404 Not Found", &[], ""),
    })
    .await;
    let http = client();
    let creds = ("alice".to_string(), "s3cret".to_string());
    let url = format!("{}/charts/", repo.base);
    let entries = http
        .chart_entries(&url, "app", Some(&creds), budget(1 << 20))
        .await
        .unwrap();
    let versions: Vec<_> = entries.iter().map(|e| e.version.as_str()).collect();
    assert_eq!(versions, ["1.0.0", "1.1.0"]);
    assert!(has_header(&repo.seen()[0], "user-agent", "tender-test"));

    let missing = http
        .chart_entries(&url, "nope", Some(&creds), budget(1 << 20))
        .await
        .unwrap_err();
    assert_eq!(missing.reason, reason::CHART_VERSION_NOT_FOUND);

    let not_index = http
        .chart_entries(
            &format!("{}/other", repo.base),
            "app",
            Some(&creds),
            budget(1 << 20),
        )
        .await
        .unwrap_err();
    assert_eq!(not_index.reason, reason::CHART_REPOSITORY_UNREACHABLE);

    let refused = http
        .chart_entries(&url, "app", None, budget(1 << 20))
        .await
        .unwrap_err();
    assert_eq!(refused.reason, reason::CHART_AUTH_FAILED);
    assert!(
        refused.message.ends_with("(set credentials)"),
        "{refused:?}"
    );
    let wrong = ("alice".to_string(), "guess".to_string());
    let refused = http
        .chart_entries(&url, "app", Some(&wrong), budget(1 << 20))
        .await
        .unwrap_err();
    assert_eq!(refused.reason, reason::CHART_AUTH_FAILED);
    assert!(!refused.message.contains("guess"));
}

#[tokio::test]
async fn redirects_are_followed_on_the_origin_only() {
    let elsewhere = Server::start(|_, _| reply("200 OK", &[], INDEX)).await;
    let target = format!("{}/index.yaml", elsewhere.base);
    let repo = Server::start(move |path, _| match path {
        "/index.yaml" => reply("302 Found", &[("Location", "/moved/index.yaml")], ""),
        "/moved/index.yaml" => reply("200 OK", &[], INDEX),
        "/away/index.yaml" => reply("302 Found", &[("Location", &target)], ""),
        "/loop/index.yaml" => reply("302 Found", &[("Location", "/loop/index.yaml")], ""),
        _ => reply("404 Not Found", &[], ""),
    })
    .await;
    let http = client();
    let creds = ("alice".to_string(), "s3cret".to_string());
    let entries = http
        .chart_entries(&repo.base, "app", Some(&creds), budget(1 << 20))
        .await
        .unwrap();
    assert_eq!(entries.len(), 2);
    let auth = basic_auth("alice", "s3cret");
    assert!(
        repo.seen()
            .iter()
            .all(|h| has_header(h, "authorization", &auth)),
        "the credentials follow a redirect on the origin"
    );

    let away = format!(
        "{}/away",
        repo.base.replace("http://", "http://alice:s3cret@")
    );
    let refused = http
        .chart_entries(&away, "app", Some(&creds), budget(1 << 20))
        .await
        .unwrap_err();
    assert_eq!(refused.reason, reason::CHART_REDIRECT_REFUSED);
    assert!(refused.message.ends_with("(test hint)"), "{refused:?}");
    assert!(!refused.message.contains("s3cret"), "{refused:?}");
    assert!(
        elsewhere.seen().is_empty(),
        "nothing was sent off the origin"
    );

    let looped = http
        .chart_entries(&format!("{}/loop", repo.base), "app", None, budget(1 << 20))
        .await
        .unwrap_err();
    assert_eq!(looped.reason, reason::CHART_REPOSITORY_UNREACHABLE);
    assert!(looped.message.contains("redirects"), "{looped:?}");
}

#[tokio::test]
async fn answers_are_bounded_declared_or_not() {
    let big = "x".repeat(4096);
    let repo = Server::start(move |path, _| match path {
        "/declared/index.yaml" => reply("200 OK", &[], &big),
        // No length: read until the server closes, which it does after 4 KiB.
        "/streamed/index.yaml" => format!("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{big}"),
        _ => reply("404 Not Found", &[], ""),
    })
    .await;
    let http = client();
    for path in ["declared", "streamed"] {
        let e = http
            .chart_entries(&format!("{}/{path}", repo.base), "app", None, budget(1024))
            .await
            .unwrap_err();
        assert_eq!(e.reason, reason::CHART_TOO_LARGE, "{path}");
        assert!(
            e.message.contains("larger than 1024 bytes (test bound)"),
            "{e:?}"
        );
    }
    // Within the bound, the same answer is read.
    let e = http
        .chart_entries(
            &format!("{}/declared", repo.base),
            "app",
            None,
            budget(8192),
        )
        .await
        .unwrap_err();
    assert_eq!(
        e.reason,
        reason::CHART_REPOSITORY_UNREACHABLE,
        "read, not an index"
    );
}

#[tokio::test]
async fn oci_tags_are_listed_with_a_bearer_token_across_pages() {
    let token_server = Server::start(|path, head| {
        let basic = basic_auth("bob", "pw");
        if path.starts_with("/token?") && has_header(head, "authorization", &basic) {
            reply("200 OK", &[], r#"{"token":"t0k"}"#)
        } else {
            reply("401 Unauthorized", &[], "")
        }
    })
    .await;
    let realm = format!("{}/token", token_server.base);
    let registry = Server::start(move |path, head| {
        if !has_header(head, "authorization", "Bearer t0k") {
            let challenge = format!(
                "Bearer realm=\"{realm}\",service=\"reg\",scope=\"repository:charts/app:pull\""
            );
            return reply("401 Unauthorized", &[("WWW-Authenticate", &challenge)], "");
        }
        match path {
            "/v2/charts/app/tags/list" => reply(
                "200 OK",
                &[(
                    "Link",
                    "</v2/charts/app/tags/list?last=0.2.0>; rel=\"next\"",
                )],
                r#"{"tags":["0.1.0","0.2.0"]}"#,
            ),
            "/v2/charts/app/tags/list?last=0.2.0" => {
                reply("200 OK", &[], r#"{"tags":["0.3.0_build.1"]}"#)
            }
            _ => reply("404 Not Found", &[], ""),
        }
    })
    .await;
    let http = client();
    let host = registry.base.trim_start_matches("http://").to_string();
    let oci = OciRef {
        host,
        repository: "charts/app".into(),
    };
    let creds = ("bob".to_string(), "pw".to_string());
    let reference = format!("oci://{}/charts/app", oci.host);
    let mut session = Session::new(&http, &oci, &reference, Some(&creds), true, budget(1 << 20));
    let tags = session.tags(&oci.repository).await.unwrap();
    assert_eq!(tags, ["0.1.0", "0.2.0", "0.3.0_build.1"]);
    let token_requests = token_server.seen();
    assert_eq!(token_requests.len(), 1, "one token for the session");
    assert!(token_requests[0].contains("service=reg"));
    assert!(
        registry
            .seen()
            .iter()
            .all(|h| !h.to_ascii_lowercase().contains("basic ")),
        "the registry never sees the credentials, only the token"
    );

    // Without credentials the token service refuses, and that is an authentication failure.
    let mut session = Session::new(&http, &oci, &reference, None, true, budget(1 << 20));
    let e = session.tags(&oci.repository).await.unwrap_err();
    assert_eq!(e.reason, reason::CHART_AUTH_FAILED);
}
