//! Counters for `/metrics`, rendered in Prometheus' text format.

use crate::api::RunStatus;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the latency histogram, in seconds.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// The engines a run's report may name (`engine`), and `none` for a run without a report (it
/// never started).
const ENGINES: [&str; 5] = ["template", "template-warm", "exec", "in-process", "none"];

/// The service's counters.
#[derive(Default)]
pub struct Metrics {
    by_status: [[AtomicU64; ENGINES.len()]; RunStatus::ALL.len()],
    buckets: [AtomicU64; BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_us: AtomicU64,
    rejected_busy: AtomicU64,
    denied_egress: AtomicU64,
    oom_kills: AtomicU64,
    sessions_created: AtomicU64,
    sessions_expired: AtomicU64,
    execs: AtomicU64,
}

/// Gauges read at render time.
pub struct Gauges {
    pub running: usize,
    pub queued: usize,
    pub sessions: usize,
    pub max_concurrency: usize,
    pub max_queue: usize,
    pub pool_size: usize,
    pub pool_ready: usize,
    pub pool_hits: u64,
    pub pool_misses: u64,
    pub pool_started: u64,
    /// Templates kept at most (`--templates`), held now, and their counters.
    pub templates_max: usize,
    pub templates: usize,
    pub template_hits: u64,
    pub template_misses: u64,
    pub templates_built: u64,
    pub templates_evicted: u64,
    pub templates_died: u64,
    /// The budget of bytes held for replies: held now, its limit, refusals, cut outputs.
    pub held_bytes: u64,
    pub held_limit: u64,
    pub held_refused: u64,
    pub held_cut: u64,
    pub held_evicted: u64,
}

impl Metrics {
    /// One run ended: its status, its latency (admission to answer), its report's counters.
    pub fn run(&self, status: RunStatus, secs: f64, report: Option<&palisade::Report>) {
        let i = RunStatus::ALL
            .iter()
            .position(|s| *s == status)
            .expect("every status is listed");
        let engine = report
            .and_then(|r| r.engine)
            .and_then(|e| ENGINES.iter().position(|k| *k == e))
            .unwrap_or(ENGINES.len() - 1);
        self.by_status[i][engine].fetch_add(1, Ordering::Relaxed);
        for (b, ub) in self.buckets.iter().zip(BUCKETS) {
            if secs <= ub {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us
            .fetch_add((secs * 1e6) as u64, Ordering::Relaxed);
        if let Some(r) = report {
            self.counts(r.network.denied, r.oom_kills);
        }
    }

    /// A report's egress denials and OOM kills (runs and sessions).
    pub fn report(&self, r: &serde_json::Value) {
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        self.counts(n(&r["network"]["denied"]), n(&r["oom_kills"]));
    }

    /// Egress denials and OOM kills of one report.
    fn counts(&self, denied: u64, oom_kills: u64) {
        self.denied_egress.fetch_add(denied, Ordering::Relaxed);
        self.oom_kills.fetch_add(oom_kills, Ordering::Relaxed);
    }

    /// A request turned away with 429.
    pub fn busy(&self) {
        self.rejected_busy.fetch_add(1, Ordering::Relaxed);
    }

    /// A session was created.
    pub fn session_created(&self) {
        self.sessions_created.fetch_add(1, Ordering::Relaxed);
    }

    /// A session reached its TTL or idle timeout.
    pub fn session_expired(&self) {
        self.sessions_expired.fetch_add(1, Ordering::Relaxed);
    }

    /// An exec started in a session.
    pub fn exec(&self) {
        self.execs.fetch_add(1, Ordering::Relaxed);
    }

    /// The text exposition.
    pub fn render(&self, g: &Gauges) -> String {
        let mut s = String::new();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        s.push_str("# HELP palisade_runs_total Runs ended, by status and by the engine that made their sandbox.\n# TYPE palisade_runs_total counter\n");
        for (st, row) in RunStatus::ALL.iter().zip(&self.by_status) {
            for (engine, c) in ENGINES.iter().zip(row) {
                let _ = writeln!(
                    s,
                    "palisade_runs_total{{status=\"{}\",engine=\"{engine}\"}} {}",
                    st.name(),
                    get(c)
                );
            }
        }
        s.push_str("# HELP palisade_run_seconds Time from admission to answer of a run.\n# TYPE palisade_run_seconds histogram\n");
        for (ub, b) in BUCKETS.iter().zip(&self.buckets) {
            let _ = writeln!(s, "palisade_run_seconds_bucket{{le=\"{ub}\"}} {}", get(b));
        }
        let count = get(&self.latency_count);
        let _ = writeln!(s, "palisade_run_seconds_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            s,
            "palisade_run_seconds_sum {}",
            get(&self.latency_sum_us) as f64 / 1e6
        );
        let _ = writeln!(s, "palisade_run_seconds_count {count}");
        let gauge = |s: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let counter = |s: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        gauge(
            &mut s,
            "palisade_running",
            "Runs and batch items holding a sandbox now.",
            g.running as u64,
        );
        gauge(
            &mut s,
            "palisade_queue_depth",
            "Admitted requests waiting for a slot.",
            g.queued as u64,
        );
        gauge(
            &mut s,
            "palisade_max_concurrency",
            "Sandboxes run at once, at most.",
            g.max_concurrency as u64,
        );
        gauge(
            &mut s,
            "palisade_max_queue",
            "Requests that may wait, at most.",
            g.max_queue as u64,
        );
        gauge(
            &mut s,
            "palisade_sessions",
            "Sessions alive now.",
            g.sessions as u64,
        );
        counter(
            &mut s,
            "palisade_rejected_busy_total",
            "Requests answered 429 (queue full).",
            get(&self.rejected_busy),
        );
        counter(
            &mut s,
            "palisade_denied_egress_total",
            "Connections and lookups the egress proxy denied.",
            get(&self.denied_egress),
        );
        counter(
            &mut s,
            "palisade_oom_kills_total",
            "Processes the OOM killer killed in sandboxes.",
            get(&self.oom_kills),
        );
        counter(
            &mut s,
            "palisade_sessions_created_total",
            "Sessions created.",
            get(&self.sessions_created),
        );
        counter(
            &mut s,
            "palisade_sessions_expired_total",
            "Sessions destroyed at their TTL or idle timeout.",
            get(&self.sessions_expired),
        );
        counter(
            &mut s,
            "palisade_execs_total",
            "Execs started in sessions.",
            get(&self.execs),
        );
        gauge(
            &mut s,
            "palisade_pool_size",
            "Sandboxes the warm pool keeps ready (0: no pool).",
            g.pool_size as u64,
        );
        gauge(
            &mut s,
            "palisade_pool_ready",
            "Sandboxes ready in the warm pool now.",
            g.pool_ready as u64,
        );
        counter(
            &mut s,
            "palisade_pool_hits_total",
            "Runs that took a sandbox from the warm pool.",
            g.pool_hits,
        );
        counter(
            &mut s,
            "palisade_pool_misses_total",
            "Runs that could use the pool and found it empty.",
            g.pool_misses,
        );
        counter(
            &mut s,
            "palisade_pool_started_total",
            "Sandboxes started for the pool (its refill rate).",
            g.pool_started,
        );
        gauge(
            &mut s,
            "palisade_templates_max",
            "Prepared templates kept at most (0: every run starts cold).",
            g.templates_max as u64,
        );
        gauge(
            &mut s,
            "palisade_templates",
            "Prepared templates (each a zygote) held now.",
            g.templates as u64,
        );
        counter(
            &mut s,
            "palisade_template_hits_total",
            "Runs that started from a template already prepared.",
            g.template_hits,
        );
        counter(
            &mut s,
            "palisade_template_misses_total",
            "Runs a template could take that found none ready.",
            g.template_misses,
        );
        counter(
            &mut s,
            "palisade_templates_built_total",
            "Templates prepared.",
            g.templates_built,
        );
        counter(
            &mut s,
            "palisade_templates_evicted_total",
            "Templates dropped as the least recently used.",
            g.templates_evicted,
        );
        counter(
            &mut s,
            "palisade_templates_died_total",
            "Templates dropped because their zygote was gone.",
            g.templates_died,
        );
        gauge(
            &mut s,
            "palisade_held_bytes",
            "Bytes of output and files held for replies not yet taken by their clients.",
            g.held_bytes,
        );
        gauge(
            &mut s,
            "palisade_held_limit_bytes",
            "The budget of bytes held for replies (--max-held).",
            g.held_limit,
        );
        counter(
            &mut s,
            "palisade_held_refused_total",
            "Requests refused busy because the bytes held for replies were at --max-held.",
            g.held_refused,
        );
        counter(
            &mut s,
            "palisade_held_cut_total",
            "Outputs cut (output-limit) because the bytes held for replies were at --max-held.",
            g.held_cut,
        );
        counter(
            &mut s,
            "palisade_held_evicted_total",
            "Background exec results kept for clients, dropped (oldest first) to make room within --max-held.",
            g.held_evicted,
        );
        s
    }
}
