//! Connections that give up on a client that stops reading (`palisade serve --send-timeout`).
//!
//! A reply the server has begun to send holds memory until the client has taken it. A client
//! that reads nothing would hold it for ever: a write that makes no progress for the timeout
//! fails, hyper closes the connection, and whatever the reply held is given back. Reads are not
//! timed here (a request body is bounded by `--max-body`, and a client that sends nothing holds
//! nothing of ours but the connection).

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

impl<L: axum::serve::Listener> axum::serve::Listener for Stall<L> {
    type Io = StallIo<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = self.inner.accept().await;
        (
            StallIo {
                io,
                timeout: self.timeout,
                since: None,
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
}

impl<T> StallIo<T> {
    /// What a write that could not go on (`Pending`) becomes: still pending, or timed out.
    fn stalled<R>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        match r {
            Poll::Pending => {
                let timeout = self.timeout;
                let sleep = self
                    .since
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the client took none of its reply for {} s (--send-timeout)",
                            timeout.as_secs()
                        ),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
            done => {
                self.since = None;
                done
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for StallIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for StallIo<T> {
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
}
