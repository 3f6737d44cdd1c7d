//! The warm pool: sandboxes started ahead for the server's default policy, each with its agent
//! waiting, handed to one run each and destroyed after it (never reused). A run takes one only
//! when its own sandbox would be the same: the ceiling's limits (a run may still narrow its
//! deadline and output cap, which the server keeps per stage), no egress, no variables of its
//! own. Off unless `pool_size` is set; a sandbox that waited longer than `pool_max_age` is
//! replaced, so that its backstop deadline never comes near.

use crate::client::AgentConn;
use crate::run::Held;
use crate::{proto, Service, ServiceError};
use palisade::policy::Policy;
use palisade::{Io, Sandbox, Stdin, Template};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The first pause before the pool tries again after a sandbox failed to start (doubled per
/// failure in a row, up to [`REFILL_PAUSE_MAX`]).
const REFILL_PAUSE: Duration = Duration::from_millis(250);
/// The longest pause between the pool's attempts to start a sandbox.
const REFILL_PAUSE_MAX: Duration = Duration::from_secs(30);

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
            let mut policy = svc.pool_policy();
            let mut failures: u32 = 0;
            while let Ok(p) = &mut policy {
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
                // From the pool policy's template where templates are on (a start from it
                // costs less than a cold one), else cold.
                let mut held = match svc.template_for(p, false).await {
                    Some(t) => {
                        Held::start_template(&svc, t, p.command.clone(), Vec::new(), io).await
                    }
                    None => Held::start(&svc, sandbox, io).await,
                };
                let Some(sock) = held.run_mut().take_stdin() else {
                    let out = held.finish().await;
                    failures += 1;
                    let pause = REFILL_PAUSE
                        .saturating_mul(1 << failures.min(5))
                        .min(REFILL_PAUSE_MAX);
                    tracing::warn!(
                        error = out.report.error.as_deref().unwrap_or("?"),
                        retry_in_s = pause.as_secs_f64(),
                        "the warm pool could not start a sandbox"
                    );
                    // A start that failed (a passing error of the host's) is tried again after a
                    // pause, growing while it keeps failing: the pool does not stay short until
                    // the next run takes from it.
                    tokio::time::sleep(pause).await;
                    continue;
                };
                let Ok(conn) = AgentConn::new(
                    sock,
                    svc.inner.config.max_fetch_bytes as usize + 1,
                    svc.inner.held.clone(),
                ) else {
                    break;
                };
                failures = 0;
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

/// Prepared templates, one per effective policy, at most `templates` of them (the least recently
/// used is dropped first: each holds a zygote, a process with the prepared view, and with warm
/// Python a started interpreter). A run whose sandbox a template can make starts from the
/// template of its policy: its own command and variables, the rest (limits, egress, binds) the
/// template's, which is why they are the key. A template whose zygote is gone is dropped and
/// prepared again at the next run that needs it.
#[derive(Default)]
pub(crate) struct Templates {
    /// Least recently used first.
    held: Mutex<Vec<Prepared>>,
    /// Keys being prepared now: a run that needs one of these meanwhile starts cold.
    building: Mutex<std::collections::HashSet<String>>,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub built: AtomicU64,
    pub evicted: AtomicU64,
    pub died: AtomicU64,
}

enum Slot {
    Ready(Box<Template>),
    /// Preparing it failed (e.g. no init program): runs of the key start cold until `retry`.
    Failed {
        retry: Instant,
    },
}

struct Prepared {
    key: String,
    slot: Slot,
}

/// How long a key whose template could not be prepared starts its runs cold before trying again.
const RETRY_FAILED: Duration = Duration::from_secs(30);

impl Templates {
    pub(crate) fn len(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|p| matches!(p.slot, Slot::Ready(_)))
            .count()
    }

    /// Drops every template (their zygotes end; runs already started are not affected). Blocks
    /// while each zygote is reaped: call it off the async threads.
    pub(crate) fn clear(&self) {
        let all: Vec<Prepared> =
            std::mem::take(&mut *self.held.lock().unwrap_or_else(|p| p.into_inner()));
        drop(all);
    }
}

/// The key of a template: the policy it is prepared with, as text (the whole policy but the
/// command and the request's own variables, which each run sets), and whether it is warm.
/// `policy` is written with `true` as its command and `env` as its variables, then given back
/// as it was: a copy of the whole policy for every request cost more than the text itself.
pub(crate) fn template_key(
    policy: &mut Policy,
    env: &[palisade::policy::EnvVar],
    warm: bool,
) -> Option<String> {
    let command = std::mem::replace(&mut policy.command, vec!["true".into()]);
    let own = std::mem::replace(&mut policy.env, env.to_vec());
    let j = serde_json::to_string(policy).ok();
    policy.command = command;
    policy.env = own;
    Some(format!("{}{}", if warm { "warm:" } else { "plain:" }, j?))
}

/// Whether a template can make `policy`'s sandbox: not a workspace (one run's own from the first
/// step), not TLS inspection (a CA of the run's own in the view's `/etc`).
pub(crate) fn template_takes(policy: &Policy) -> bool {
    !matches!(policy.scratch, palisade::policy::Scratch::Workspace { .. })
        && !policy.network.inspects_any()
}

impl Service {
    /// Prepares, ahead of the first request, the template of a default one-shot run (a `python`
    /// run with nothing of its own, warm with warm Python on). With warm Python on, an
    /// interpreter that cannot be started (a module that does not import) is an error here,
    /// rather than every Python run falling back to a cold start.
    pub async fn prepare_templates(&self) -> Result<(), ServiceError> {
        let c = &self.inner.config;
        if c.templates == 0 || !self.inner.langs.iter().any(|l| l.name == "python") {
            return Ok(());
        }
        let req = crate::api::RunRequest {
            language: Some("python".into()),
            code: Some("pass".into()),
            ..Default::default()
        };
        let mut plan = self.plan(&req, "")?;
        let warm = plan.is_warm();
        let got = self.template_for(plan.policy_mut(), warm).await;
        if got.is_none() && c.warm_python.is_some() {
            return Err(ServiceError::invalid(
                "warm_python",
                c.warm_python.clone().unwrap_or_default().join(","),
                "a Python whose interpreter starts and imports these modules in a template (the server's log says why it did not)",
            ));
        }
        Ok(())
    }

    /// The template for `policy` (its command and variables are ignored: each run gives its own),
    /// prepared now if there is none; `None` when templates are off, the policy cannot take one,
    /// or one is being prepared by another run (the caller then starts cold).
    pub(crate) async fn template_for(&self, policy: &mut Policy, warm: bool) -> Option<Template> {
        let c = &self.inner.config;
        if c.templates == 0 || !template_takes(policy) || (warm && c.warm_python.is_none()) {
            return None;
        }
        let key = template_key(policy, &c.ceiling.policy().env, warm)?;
        let t = &self.inner.templates;
        let dead: Vec<Prepared>;
        let mut failed = false;
        {
            let mut held = t.held.lock().unwrap_or_else(|p| p.into_inner());
            // Every template whose zygote is gone is dropped (and its zygote reaped), this
            // run's or not; the next run that needs one prepares it again.
            let (gone, kept): (Vec<Prepared>, Vec<Prepared>) = std::mem::take(&mut *held)
                .into_iter()
                .partition(|p| matches!(&p.slot, Slot::Ready(tp) if !tp.is_alive()));
            *held = kept;
            if !gone.is_empty() {
                t.died.fetch_add(gone.len() as u64, Ordering::Relaxed);
                tracing::warn!(
                    templates = gone.len(),
                    "a template's zygote is gone: its template is dropped and prepared again at its next run"
                );
            }
            dead = gone;
            if let Some(i) = held.iter().position(|p| p.key == key) {
                let p = held.remove(i);
                match &p.slot {
                    Slot::Ready(tp) => {
                        let tp = Template::clone(tp);
                        held.push(p);
                        t.hits.fetch_add(1, Ordering::Relaxed);
                        drop(held);
                        if !dead.is_empty() {
                            tokio::task::spawn_blocking(move || drop(dead));
                        }
                        return Some(tp);
                    }
                    Slot::Failed { retry } if Instant::now() < *retry => {
                        held.push(p);
                        failed = true;
                    }
                    Slot::Failed { .. } => {}
                }
            }
        }
        if !dead.is_empty() {
            let _ = tokio::task::spawn_blocking(move || drop(dead)).await;
        }
        t.misses.fetch_add(1, Ordering::Relaxed);
        if failed {
            return None;
        }
        if !t
            .building
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone())
        {
            return None;
        }
        let warm_python = if warm { c.warm_python.clone() } else { None };
        let mut base = policy.clone();
        base.command = vec!["true".into()];
        base.env = c.ceiling.policy().env.clone();
        let made = tokio::task::spawn_blocking(move || -> Result<Template, String> {
            let sandbox = Sandbox::from_policy(base).map_err(|e| e.to_string())?;
            match warm_python {
                Some(modules) => {
                    let wp = palisade::WarmPython::find(&crate::lang::python_path(), &modules)?;
                    sandbox.prepare_warm_python(wp).map_err(|e| e.to_string())
                }
                None => sandbox.prepare().map_err(|e| e.to_string()),
            }
        })
        .await
        .unwrap_or_else(|_| Err("preparing the template panicked".into()));
        t.building
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        let (slot, got) = match made {
            Ok(tp) => {
                t.built.fetch_add(1, Ordering::Relaxed);
                (Slot::Ready(Box::new(tp.clone())), Some(tp))
            }
            Err(e) => {
                tracing::warn!(
                    error = crate::shorten(&e, 500),
                    warm,
                    "a template could not be prepared: its runs start cold"
                );
                (
                    Slot::Failed {
                        retry: Instant::now() + RETRY_FAILED,
                    },
                    None,
                )
            }
        };
        if self.inner.stopping.load(Ordering::SeqCst) {
            tokio::task::spawn_blocking(move || drop((slot, got)));
            return None;
        }
        let evicted: Vec<Prepared> = {
            let mut held = t.held.lock().unwrap_or_else(|p| p.into_inner());
            held.retain(|p| p.key != key);
            held.push(Prepared { key, slot });
            let over = held.len().saturating_sub(c.templates);
            held.drain(..over).collect()
        };
        if !evicted.is_empty() {
            t.evicted.fetch_add(
                evicted
                    .iter()
                    .filter(|p| matches!(p.slot, Slot::Ready(_)))
                    .count() as u64,
                Ordering::Relaxed,
            );
            // A zygote is reaped as its template drops: not on an async thread.
            tokio::task::spawn_blocking(move || drop(evicted));
        }
        got
    }
}

#[cfg(test)]
mod tests {
    use super::template_key;
    use palisade::policy::{EnvVar, Policy};

    #[test]
    fn a_templates_key_leaves_out_the_command_and_variables_and_the_policy_as_it_was() {
        let server_env = vec![EnvVar::new("LANG", "C.UTF-8").unwrap()];
        let mut a = Policy::new(["python3", "-c", "print(1)"]).unwrap();
        a.env = vec![EnvVar::new("MINE", "1").unwrap()];
        let before = format!("{a:?}");
        let ka = template_key(&mut a, &server_env, false).unwrap();
        assert_eq!(
            format!("{a:?}"),
            before,
            "the policy is given back as it was"
        );
        let mut b = Policy::new(["true"]).unwrap();
        assert_eq!(template_key(&mut b, &server_env, false).unwrap(), ka);
        assert_ne!(template_key(&mut b, &server_env, true).unwrap(), ka);
        assert_ne!(template_key(&mut b, &[], false).unwrap(), ka);
        b.limits.memory_bytes /= 2;
        assert_ne!(template_key(&mut b, &server_env, false).unwrap(), ka);
        assert!(ka.contains("\"true\"") && !ka.contains("print(1)") && !ka.contains("MINE"));
    }
}
