//! One end of a connection the proxy reads: plain TCP, or TLS terminated by rustls (the
//! sandbox's side, with a leaf of the run's CA; the upstream side, verified against the roots).
//!
//! Sockets stay non-blocking; every wait is the proxy's own (`relay::wait`), so the stop signal
//! ends it. rustls holds at most [`BUFFER`] bytes of unsent plaintext per connection, and takes
//! records from the socket only when the proxy asks for more plaintext, so a peer that sends
//! without end fills its own socket buffer, not the supervisor's memory.

use crate::relay::{self, Wake};
use crate::Shared;
use rustix::event::{PollFd, PollFlags};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Instant;

/// Most plaintext rustls buffers for sending, per connection.
pub(crate) const BUFFER: usize = 64 * 1024;
/// What the proxy reads from a TLS socket at once, for rustls to take records from (rustls reads
/// 4 KiB at a time itself: four system calls a record).
const READ_BUF: usize = 32 * 1024;

/// One end: the socket, and rustls on it for TLS.
pub(crate) struct Peer {
    pub(crate) sock: TcpStream,
    tls: Option<Box<rustls::Connection>>,
    /// The socket reached end of file (TLS: the records are all in).
    eof: bool,
    /// TLS bytes read from the socket that rustls has not taken yet, from `inat`.
    inbuf: Vec<u8>,
    inat: usize,
}

/// Why a TLS handshake failed: the peer's certificate (upstream), or anything else.
#[derive(Debug)]
pub(crate) enum HandshakeError {
    Certificate(String),
    Other(String),
    Stopping,
}

impl Peer {
    pub(crate) fn plain(sock: TcpStream) -> Peer {
        Peer {
            sock,
            tls: None,
            eof: false,
            inbuf: Vec::new(),
            inat: 0,
        }
    }

    /// The server side of TLS on `sock` (the sandbox's connection), fed `first` (the
    /// ClientHello the proxy already read), driven until the handshake is done or `deadline`.
    pub(crate) fn accept(
        sh: &Shared,
        sock: TcpStream,
        config: Arc<rustls::ServerConfig>,
        first: &[u8],
        deadline: Instant,
    ) -> Result<Peer, HandshakeError> {
        let mut conn = rustls::ServerConnection::new(config)
            .map_err(|e| HandshakeError::Other(e.to_string()))?;
        conn.set_buffer_limit(Some(BUFFER));
        let mut p = Peer {
            sock,
            tls: Some(Box::new(rustls::Connection::Server(conn))),
            eof: false,
            inbuf: Vec::new(),
            inat: 0,
        };
        let mut rest = first;
        while !rest.is_empty() {
            let tls = p.tls.as_mut().expect("made above");
            match tls.read_tls(&mut rest) {
                Ok(0) => break,
                Ok(_) => {
                    if let Err(e) = tls.process_new_packets() {
                        let _ = p.flush_now();
                        return Err(HandshakeError::Other(e.to_string()));
                    }
                }
                Err(e) => return Err(HandshakeError::Other(e.to_string())),
            }
        }
        p.handshake(sh, deadline)?;
        Ok(p)
    }

    /// The client side of TLS to `name` on `sock` (upstream), verified by `config`'s roots.
    pub(crate) fn connect(
        sh: &Shared,
        sock: TcpStream,
        config: Arc<rustls::ClientConfig>,
        name: rustls::pki_types::ServerName<'static>,
        deadline: Instant,
    ) -> Result<Peer, HandshakeError> {
        let mut conn = rustls::ClientConnection::new(config, name)
            .map_err(|e| HandshakeError::Other(e.to_string()))?;
        conn.set_buffer_limit(Some(BUFFER));
        let mut p = Peer {
            sock,
            tls: Some(Box::new(rustls::Connection::Client(conn))),
            eof: false,
            inbuf: Vec::new(),
            inat: 0,
        };
        p.handshake(sh, deadline)?;
        Ok(p)
    }

    /// The server name the sandbox's client sent, as rustls read it.
    pub(crate) fn server_name(&self) -> Option<String> {
        match self.tls.as_deref() {
            Some(rustls::Connection::Server(s)) => s.server_name().map(str::to_owned),
            _ => None,
        }
    }

    fn handshake(&mut self, sh: &Shared, deadline: Instant) -> Result<(), HandshakeError> {
        let fail = |e: rustls::Error| match e {
            rustls::Error::InvalidCertificate(c) => {
                HandshakeError::Certificate(format!("invalid peer certificate: {c:?}"))
            }
            e => HandshakeError::Other(e.to_string()),
        };
        loop {
            let tls = self.tls.as_mut().expect("a TLS peer");
            if !tls.is_handshaking() {
                break;
            }
            if tls.wants_write() {
                match tls.write_tls(&mut self.sock) {
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.wait(sh, PollFlags::OUT, deadline)?;
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(HandshakeError::Other(e.to_string())),
                }
            }
            match tls.read_tls(&mut self.sock) {
                Ok(0) => {
                    return Err(HandshakeError::Other(
                        "the peer closed the connection during the TLS handshake".into(),
                    ))
                }
                Ok(_) => {
                    if let Err(e) = tls.process_new_packets() {
                        // Send the alert rustls queued, so that the peer learns why.
                        let _ = self.flush_now();
                        return Err(fail(e));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.wait(sh, PollFlags::IN, deadline)?
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(HandshakeError::Other(e.to_string())),
            }
        }
        // What the handshake left to send (the server's last flight), without waiting for it.
        let _ = self.flush_now();
        Ok(())
    }

    fn wait(&self, sh: &Shared, ev: PollFlags, deadline: Instant) -> Result<(), HandshakeError> {
        match relay::wait_one(sh, self.sock.as_fd(), ev, Some(deadline)) {
            Wake::Ready => Ok(()),
            Wake::Deadline => Err(HandshakeError::Other(
                "the TLS handshake did not finish within the time allowed".into(),
            )),
            Wake::Stop => Err(HandshakeError::Stopping),
        }
    }

    /// Bytes now (plaintext for TLS): `Ok(Some(0))` at the end, `Ok(None)` when none is there
    /// yet. A TLS peer that closes without `close_notify` ends the same way.
    pub(crate) fn read_now(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let Some(tls) = self.tls.as_mut() else {
            return match self.sock.read(buf) {
                Ok(n) => Ok(Some(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
                Err(e) => Err(e),
            };
        };
        loop {
            match tls.reader().read(buf) {
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Some(0)),
                Err(e) => return Err(e),
            }
            if self.eof {
                return Ok(Some(0));
            }
            if self.inat == self.inbuf.len() {
                self.inbuf.resize(READ_BUF, 0);
                self.inat = 0;
                match self.sock.read(&mut self.inbuf) {
                    Ok(n) => {
                        self.inbuf.truncate(n);
                        self.eof = n == 0;
                    }
                    Err(e) => {
                        self.inbuf.clear();
                        match e.kind() {
                            io::ErrorKind::WouldBlock => return Ok(None),
                            io::ErrorKind::Interrupted => continue,
                            _ => return Err(e),
                        }
                    }
                }
            }
            if !self.eof {
                let mut rest = &self.inbuf[self.inat..];
                self.inat += tls.read_tls(&mut rest)?;
            }
            if let Err(e) = tls.process_new_packets() {
                // Send the alert rustls queued, without waiting.
                let _ = tls.write_tls(&mut self.sock);
                return Err(io::Error::other(e));
            }
            if tls.wants_write() {
                // A key update or an alert to answer: best effort, without waiting.
                let _ = tls.write_tls(&mut self.sock);
            }
        }
    }

    /// Takes what it can of `data` now (0: nothing, the socket or rustls's buffer is full).
    pub(crate) fn write_now(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.tls.is_none() {
            return match self.sock.write(data) {
                Ok(n) => Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
                Err(e) => Err(e),
            };
        }
        self.flush_now()?;
        let tls = self.tls.as_mut().expect("a TLS peer");
        let n = tls.writer().write(data)?;
        self.flush_now()?;
        Ok(n)
    }

    /// Sends what rustls holds, as far as the socket takes it now; true when nothing is left.
    pub(crate) fn flush_now(&mut self) -> io::Result<bool> {
        let Some(tls) = self.tls.as_mut() else {
            return Ok(true);
        };
        while tls.wants_write() {
            match tls.write_tls(&mut self.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Whether rustls holds bytes the socket has not taken yet.
    pub(crate) fn pending(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.wants_write())
    }

    /// What to poll the socket for: `IN` to read, `OUT` while rustls holds bytes to send (or
    /// `out`: the caller has bytes to write).
    pub(crate) fn interest(&self, read: bool, out: bool) -> PollFlags {
        let mut f = PollFlags::empty();
        if read {
            f |= PollFlags::IN;
        }
        if out || self.pending() {
            f |= PollFlags::OUT;
        }
        f
    }

    pub(crate) fn poll_fd(&self, events: PollFlags) -> PollFd<'_> {
        PollFd::new(&self.sock, events)
    }

    /// Writes all of `data`, waiting as long as it takes (the stop signal ends the wait).
    pub(crate) fn write_all(&mut self, sh: &Shared, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = self.write_now(data)?;
            data = &data[n..];
            if n == 0 {
                self.wait_out(sh)?;
            }
        }
        while !self.flush_now()? {
            self.wait_out(sh)?;
        }
        Ok(())
    }

    fn wait_out(&self, sh: &Shared) -> io::Result<()> {
        match relay::wait_one(sh, self.sock.as_fd(), PollFlags::OUT, None) {
            Wake::Stop => Err(relay::stopping()),
            _ => Ok(()),
        }
    }

    /// Ends the connection: `close_notify` for TLS, sent as far as the socket takes it now, then
    /// no more writing.
    pub(crate) fn close(&mut self) {
        if let Some(tls) = self.tls.as_mut() {
            tls.send_close_notify();
            let _ = self.flush_now();
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Write);
    }
}

/// The upstream TLS configuration: `roots` to verify against, HTTP/1.1 by ALPN.
pub(crate) fn client_config(
    provider: Arc<rustls::crypto::CryptoProvider>,
    roots: rustls::RootCertStore,
) -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
