//! The extender/webhook port with TLS: a client that trusts the
//! certificate gets answers; plain HTTP on that port gets nothing; bad
//! TLS material is refused at start with the file named.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;
use vgpu_kube_fixture::ApiFixture;
use vgpu_scheduler::config::SchedulerConfig;
use vgpu_scheduler::scheduler::Scheduler;
use vgpu_scheduler::server::{self, TlsFiles};

#[tokio::test]
async fn serves_https_with_the_given_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let files = TlsFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    };
    std::fs::write(&files.cert, ck.cert.pem()).unwrap();
    std::fs::write(&files.key, ck.signing_key.serialize_pem()).unwrap();

    let fx = ApiFixture::start();
    let s = Scheduler::new(fx.client(), SchedulerConfig::default(), false);
    let acceptor = server::tls_acceptor(&files).unwrap();
    let listener = server::serve(s, "127.0.0.1:0".parse().unwrap(), Some(acceptor))
        .await
        .unwrap();

    let mut roots = rustls::RootCertStore::empty();
    roots.add(ck.cert.der().clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(listener.addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tls.read_to_end(&mut out).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("ok"), "{text}");

    // Plain HTTP to the TLS port: no HTTP answer.
    let mut plain = tokio::net::TcpStream::connect(listener.addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = plain.read_to_end(&mut buf).await;
    assert!(!String::from_utf8_lossy(&buf).contains("200"), "{buf:?}");

    // Bad material: refused, the file named.
    std::fs::write(&files.key, "not a key").unwrap();
    let err = server::tls_acceptor(&files)
        .err()
        .expect("a bad key is refused")
        .to_string();
    assert!(err.contains("tls.key"), "{err}");
}
