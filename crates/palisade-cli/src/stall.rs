//! Connections that give up on a client that stops reading (`palisade serve --send-timeout`).
//!
//! A reply the server has begun to send holds memory until the client has taken it. A client
//! that reads nothing would hold it for ever: a write that makes no progress for the timeout
//! fails, hyper closes the connection, and whatever the reply held is given back. Progress is the
//! client taking bytes, read from the socket's queue (`SIOCOUTQ`), not a write going through: the
//! kernel wakes a blocked writer only once a third of a full send buffer (up to 4 MiB) has
//! drained, so a client reading a steady 32 KiB/s was taken for a stalled one.
//!
//! Reads are bounded elsewhere: a request's head by [`serve`] (its size and time), its body by
//! the front end's reader (`--max-body`, counted against `--max-held`, with a deadline).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// A listener whose connections fail a write that makes no progress for `timeout`.
pub struct Stall<L> {
    pub inner: L,
    pub timeout: Duration,
}

/// A connection whose queue of bytes not yet taken by its peer can be read.
pub trait Unsent {
    /// Bytes written that the peer has not taken yet (`None`: unknown).
    fn unsent(&self) -> Option<u64>;
}

impl Unsent for tokio::net::TcpStream {
    fn unsent(&self) -> Option<u64> {
        palisade_linux::host::unsent_bytes(self)
    }
}

impl Unsent for tokio::net::UnixStream {
    fn unsent(&self) -> Option<u64> {
        palisade_linux::host::unsent_bytes(self)
    }
}

impl Unsent for tokio::io::DuplexStream {
    fn unsent(&self) -> Option<u64> {
        None
    }
}

impl<L: axum::serve::Listener> axum::serve::Listener for Stall<L>
where
    L::Io: Unsent,
{
    type Io = StallIo<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = self.inner.accept().await;
        (
            StallIo {
                io,
                timeout: self.timeout,
                since: None,
                queued: None,
            },
            addr,
        )
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection whose writes fail once none has made progress for its timeout.
pub struct StallIo<T> {
    io: T,
    timeout: Duration,
    /// Armed when a write could not go on; cleared when one does.
    since: Option<Pin<Box<Sleep>>>,
    /// The bytes the peer had not taken when it was armed.
    queued: Option<u64>,
}

impl<T: Unsent> StallIo<T> {
    /// What a write that could not go on (`Pending`) becomes: still pending, or timed out.
    fn stalled<R>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        match r {
            Poll::Pending => {
                let timeout = self.timeout;
                if self.since.is_none() {
                    self.queued = self.io.unsent();
                }
                loop {
                    let sleep = self
                        .since
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // The timeout is up: still a stall only if the peer took nothing meanwhile.
                    let now = self.io.unsent();
                    match (self.queued, now) {
                        (Some(then), Some(now)) if now < then => {
                            self.queued = Some(now);
                            self.since = None;
                        }
                        _ => break,
                    }
                }
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the client took none of its reply for {} s (--send-timeout)",
                        timeout.as_secs()
                    ),
                )))
            }
            done => {
                self.since = None;
                done
            }
        }
    }
}

impl<T: AsyncRead + Unpin + Unsent> AsyncRead for StallIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin + Unsent> AsyncWrite for StallIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.stalled(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.stalled(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.stalled(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.stalled(cx, r)
    }
}

/// Most bytes of a request's head the server reads (hyper's read buffer, 400 KiB by default):
/// a connection costs at most this before its request is counted.
pub const MAX_HEAD: usize = 64 << 10;

/// Serves `router` on `listener` until `shutdown`, then lets open connections finish (each told
/// to close after its current request) and returns once they have. As `axum::serve`, except that
/// a request's head must come whole within `head_timeout` and in at most [`MAX_HEAD`] bytes:
/// 3,000 connections that each sent 390 KB of one header line and stopped held 1.2 GB, for
/// ever (found by an independent attack).
pub async fn serve<L>(
    mut listener: L,
    router: axum::Router,
    shutdown: impl Future<Output = ()>,
    head_timeout: Duration,
) where
    L: axum::serve::Listener,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    let tasks = tokio_util::task::TaskTracker::new();
    loop {
        let (io, _) = tokio::select! {
            c = listener.accept() => c,
            _ = &mut shutdown => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let mut stop = stop_rx.clone();
        tasks.spawn(async move {
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new())
                .header_read_timeout(head_timeout)
                .max_buf_size(MAX_HEAD);
            let conn = b
                .serve_connection(TokioIo::new(io), service)
                .with_upgrades();
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = stop.wait_for(|s| *s) => {}
            }
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    tasks.close();
    tasks.wait().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A write to a peer that reads nothing fails after the timeout; one to a peer that reads
    /// goes on however long it takes in all.
    #[tokio::test]
    async fn a_write_that_makes_no_progress_fails_after_the_timeout() {
        let (a, b) = tokio::io::duplex(1024);
        let mut io = StallIo {
            io: a,
            timeout: Duration::from_millis(300),
            since: None,
            queued: None,
        };
        let t0 = std::time::Instant::now();
        let e = io.write_all(&[0u8; 8192]).await.expect_err("stalled");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t0.elapsed() >= Duration::from_millis(300));
        drop(b);

        let (a, mut b2) = tokio::io::duplex(1024);
        let mut io = StallIo {
            io: a,
            timeout: Duration::from_millis(300),
            since: None,
            queued: None,
        };
        let reader = tokio::spawn(async move {
            let mut n = 0;
            let mut buf = [0u8; 256];
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                match tokio::io::AsyncReadExt::read(&mut b2, &mut buf).await {
                    Ok(0) | Err(_) => return n,
                    Ok(k) => n += k,
                }
            }
        });
        // 8 KiB at 256 bytes per 50 ms: over a second in all, never 300 ms without progress.
        io.write_all(&[0u8; 8192])
            .await
            .expect("a slow reader is not a stalled one");
        io.shutdown().await.unwrap();
        drop(io);
        assert_eq!(reader.await.unwrap(), 8192);
    }

    /// A peer that takes its bytes slowly but steadily is not a stalled one, though the kernel
    /// wakes the writer only once a quarter of the send buffer is left (a unix socket's rule):
    /// here after about 0.4 s, with a timeout of 300 ms. The progress is read from the socket's
    /// queue.
    #[tokio::test]
    async fn a_slow_steady_reader_is_not_cut_though_writes_wake_seldom() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        rustix::net::sockopt::set_socket_send_buffer_size(&a, 16 << 10).unwrap();
        a.set_nonblocking(true).unwrap();
        let a = tokio::net::UnixStream::from_std(a).unwrap();
        let mut io = StallIo {
            io: a,
            timeout: Duration::from_millis(300),
            since: None,
            queued: None,
        };
        let reader = std::thread::spawn(move || {
            let mut b = b;
            let (mut n, mut buf) = (0, [0u8; 2048]);
            loop {
                std::thread::sleep(Duration::from_millis(60));
                match std::io::Read::read(&mut b, &mut buf) {
                    Ok(0) | Err(_) => return n,
                    Ok(k) => n += k,
                }
            }
        });
        // In writes of 1 KiB, as hyper's pieces are small beside a send buffer (the queue
        // shrinks as each is taken whole).
        let total = 96 << 10;
        for _ in 0..96 {
            io.write_all(&[7u8; 1024])
                .await
                .expect("a steady reader is not a stalled one");
        }
        drop(io);
        assert_eq!(reader.join().unwrap(), total);
    }
}
