//! The warm pool: sandboxes started ahead for the server's default policy, each with its agent
//! waiting, handed to one run each and destroyed after it (never reused). A run takes one only
//! when its own sandbox would be the same: the ceiling's limits (a run may still narrow its
//! deadline and output cap, which the server keeps per stage), no egress, no variables of its
//! own. Off unless `pool_size` is set; a sandbox that waited longer than `pool_max_age` is
//! replaced, so that its backstop deadline never comes near.

use crate::client::AgentConn;
use crate::run::Held;
use crate::{proto, Service};
use palisade::policy::Policy;
use palisade::{Io, Sandbox, Stdin};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A ready sandbox.
pub(crate) struct Warm {
    pub held: Held,
    pub conn: AgentConn,
    born: Instant,
}

#[derive(Default)]
pub(crate) struct Pool {
    ready: Mutex<VecDeque<Warm>>,
    filling: AtomicBool,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub started: AtomicU64,
}

impl Pool {
    pub(crate) fn len(&self) -> usize {
        self.ready.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Empties the pool (its sandboxes are killed and cleaned up as they drop).
    pub(crate) fn drain(&self) {
        let all: Vec<Warm> = self
            .ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        drop(all);
    }
}

impl Service {
    /// The policy of the pool's sandboxes: the ceiling's, the agent as payload, a backstop
    /// deadline over two stages, the transfer slack and the time it may wait in the pool.
    pub(crate) fn pool_policy(&self) -> Result<Policy, crate::ServiceError> {
        let c = &self.inner.config;
        let mut l = c.ceiling.policy().limits;
        let backstop =
            Duration::from_millis(l.timeout_ms) * 2 + crate::run::AGENT_SLACK + c.pool_max_age;
        l.timeout_ms =
            (backstop.as_millis() as u64).min(palisade::policy::MAX_TIMEOUT.as_millis() as u64);
        l.output_bytes = 1 << 20;
        let mut net = c.ceiling.policy().network.clone();
        net.allow.clear();
        let mut p = c.ceiling.policy_for(
            vec![proto::AGENT_PATH.into(), proto::AGENT_ARG.into()],
            l,
            net,
            c.ceiling.policy().env.clone(),
        )?;
        p.binds.push(crate::run::agent_bind(&c.agent_exe)?);
        Ok(p)
    }

    /// A ready sandbox, if the pool has one young enough; refills in the background.
    pub(crate) fn take_warm(&self) -> Option<Warm> {
        let c = &self.inner.config;
        if c.pool_size == 0 {
            return None;
        }
        let got = loop {
            let w = self
                .inner
                .pool
                .ready
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front();
            match w {
                Some(w) if w.born.elapsed() > c.pool_max_age || w.conn.is_dead() => drop(w),
                other => break other,
            }
        };
        match &got {
            Some(_) => self.inner.pool.hits.fetch_add(1, Ordering::Relaxed),
            None => self.inner.pool.misses.fetch_add(1, Ordering::Relaxed),
        };
        self.refill();
        got
    }

    /// Starts sandboxes until the pool is full (one filler at a time).
    pub(crate) fn refill(&self) {
        let c = &self.inner.config;
        if c.pool_size == 0 || self.inner.pool.filling.swap(true, Ordering::SeqCst) {
            return;
        }
        let svc = self.clone();
        tokio::spawn(async move {
            let policy = svc.pool_policy();
            while let Ok(p) = &policy {
                if svc.inner.stopping.load(Ordering::SeqCst)
                    || svc.inner.pool.len() >= svc.inner.config.pool_size
                {
                    break;
                }
                let Ok(sandbox) = Sandbox::from_policy(p.clone()) else {
                    break;
                };
                let io = Io {
                    stdin: Some(Stdin::Socket),
                    stream_buffer: None,
                    ..Io::default()
                };
                let mut held = Held::start(&svc, sandbox, io).await;
                let Some(sock) = held.run_mut().take_stdin() else {
                    let out = held.finish().await;
                    tracing::warn!(
                        error = out.report.error.as_deref().unwrap_or("?"),
                        "the warm pool could not start a sandbox"
                    );
                    break;
                };
                let Ok(conn) = AgentConn::new(sock, svc.inner.config.max_fetch_bytes as usize + 1)
                else {
                    break;
                };
                svc.inner.pool.started.fetch_add(1, Ordering::Relaxed);
                if svc.inner.stopping.load(Ordering::SeqCst) {
                    break;
                }
                svc.inner
                    .pool
                    .ready
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_back(Warm {
                        held,
                        conn,
                        born: Instant::now(),
                    });
            }
            svc.inner.pool.filling.store(false, Ordering::SeqCst);
        });
    }
}
