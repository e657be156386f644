//! moto's S3 server on a free loopback port, for the life of a test.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    /// Starts `moto_server` and waits until it answers. A missing `moto_server` fails the
    /// test: it is a test dependency (requirements-dev.txt), not an optional one.
    pub fn start() -> Moto {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server (pip install 'moto[server]', see requirements-dev.txt)");
        let mut moto = Moto { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while moto.request("GET /moto-api/ HTTP/1.0\r\n\r\n").is_none() {
            assert!(
                moto.child.try_wait().unwrap().is_none(),
                "moto_server exited"
            );
            assert!(
                Instant::now() < deadline,
                "moto_server did not answer in 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        moto
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sends one raw HTTP request and returns the reply, or `None` when nothing answers.
    fn request(&self, text: &str) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.write_all(text.as_bytes()).ok()?;
        let mut reply = String::new();
        s.read_to_string(&mut reply).ok()?;
        reply.starts_with("HTTP/").then_some(reply)
    }

    /// Creates a bucket with an unsigned PUT (moto checks no signature by default).
    pub fn create_bucket(&self, name: &str) {
        let reply = self
            .request(&format!(
                "PUT /{name} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
            ))
            .expect("moto answers");
        assert!(
            reply.starts_with("HTTP/1.1 200") || reply.starts_with("HTTP/1.0 200"),
            "{reply}"
        );
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
